"""Which CPU schedule rules can apply to a PrimFunc, from one walk over its blocks.

:func:`~relax_memplan.schedules.cpu_schedule_pass` tries the rules of
:func:`~relax_memplan.schedules.cpu_schedule_rules` in turn; each builds an ``s_tir.Schedule``
(and most run dlight's ``normalize_prim_func``) only to decline a kernel it does not match
(magika's fused layer-norm kernel: 30 ms of declines before :class:`SpatialFallback`
applies). :func:`kernel_blocks` walks the function once; :func:`may_apply` then answers, per
rule, a *necessary* condition of that rule, read off the rule's own first checks (conv:
``match_conv``, matmul: ``match_matmul``, GEMV: ``DotProductGEMV`` and dlight's ``is_gemv``,
row/plane sums: ``row_blocks`` / ``VectorPlaneSum._applies``, ``RowReduction``'s minimum
work). A rule it answers ``False`` for would return ``None``; ``True`` means "try it". So the
first rule that applies, and the kernel it produces, are those of trying every rule in turn
(``tests/schedules/test_rule_gates.py`` compares both on every kernel of three shared models).

A function whose blocks are not all children of its root block (a block inside another
block) or with a statement kind not known here gets ``None`` from :func:`kernel_blocks`:
every rule is tried, except that a function with no reduction block at any depth still
skips the rules that need one.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Optional, Tuple

from tvm import s_tir, tirx

from ._row_partials import _is_sum
from .analysis import _is_multiply_accumulate
from .cpu_gemv import is_plain_dot_product
from .cpu_reduction import reduction_work

__all__ = ["KernelBlocks", "kernel_blocks", "may_apply"]

_BODY_STMTS = (tirx.For, tirx.While, tirx.AttrStmt, tirx.LetStmt, tirx.DeclBuffer,
               tirx.AllocBuffer, tirx.AssertStmt)
_LEAF_STMTS = (tirx.BufferStore, tirx.Evaluate, tirx.Bind, tirx.Break, tirx.Continue,
               tirx.Return)


@dataclass(frozen=True)
class KernelBlocks:
    """The blocks of a PrimFunc that the rules' first checks look at.

    Attributes
    ----------
    has_reduction : bool
        Some block, at any depth, has a reduction (``CommReduce``) iter var; ``True`` also
        when the walk met a statement kind it does not know.
    children : tuple of tvm.s_tir.SBlock or None
        The children of the root block in program order (what
        ``sch.get_child_blocks(root)`` and ``normalize_prim_func`` list); ``None`` when the
        function is not one root block over leaf blocks (then every rule is tried).
    reductions : tuple of tvm.s_tir.SBlock
        The children with a reduction iter var (empty when ``children`` is ``None``).
    """

    has_reduction: bool
    children: Optional[Tuple[s_tir.SBlock, ...]]
    reductions: Tuple[s_tir.SBlock, ...]


def _is_reduction(block: s_tir.SBlock) -> bool:
    return any(iv.iter_type == tirx.IterVar.CommReduce for iv in block.iter_vars)


def _walk(stmt) -> Optional[list]:
    """The blocks under ``stmt`` that are not under another block, each with ``True`` if it
    has a block inside it; ``None`` on a statement kind not known here."""
    found, stack = [], [stmt]
    while stack:
        node = stack.pop()
        if node is None or isinstance(node, _LEAF_STMTS):
            continue
        if isinstance(node, s_tir.SBlockRealize):
            inner = [_walk(node.block.body), _walk(node.block.init)]
            if inner[0] is None or inner[1] is None:
                return None
            below = inner[0] + inner[1]
            found.append((node.block, bool(below),
                          any(_is_reduction(b) or r for b, _n, r in below)))
        elif isinstance(node, tirx.SeqStmt):
            stack.extend(reversed(list(node.seq)))
        elif isinstance(node, tirx.IfThenElse):
            stack += [node.else_case, node.then_case]
        elif isinstance(node, _BODY_STMTS):
            stack.append(getattr(node, "body", None))
        else:
            return None
    return found


def kernel_blocks(func: tirx.PrimFunc) -> KernelBlocks:
    """Walk ``func`` once: see :class:`KernelBlocks`.

    Parameters
    ----------
    func : tvm.tirx.PrimFunc
        A legalized (possibly fused) PrimFunc, not yet scheduled.

    Returns
    -------
    KernelBlocks
    """
    body = func.body
    if not isinstance(body, s_tir.SBlockRealize):
        top = _walk(body)
        has_red = top is None or any(_is_reduction(b) or r for b, _n, r in top)
        return KernelBlocks(has_red, None, ())
    children = _walk(body.block.body)
    if children is None:
        return KernelBlocks(True, None, ())
    has_red = any(_is_reduction(b) or r for b, _n, r in children)
    if any(nested for _b, nested, _r in children) or body.block.init is not None:
        return KernelBlocks(has_red, None, ())
    blocks = tuple(b for b, _n, _r in children)
    return KernelBlocks(has_red, blocks, tuple(b for b in blocks if _is_reduction(b)))


def _is_unit(extent) -> bool:
    return isinstance(extent, tirx.IntImm) and extent.value == 1


def _firm(block: s_tir.SBlock) -> bool:
    """A reduction iter var of extent other than 1: still a reduction after dlight's
    ``normalize_prim_func`` (which may drop unit iter vars, and a block whose reduction iter
    vars all have extent 1 may then count as element-wise)."""
    return any(iv.iter_type == tirx.IterVar.CommReduce and not _is_unit(iv.dom.extent)
               for iv in block.iter_vars)


def _sole_reduction_candidates(kb: KernelBlocks) -> Tuple[s_tir.SBlock, ...]:
    """The blocks that can be the only reduction block ``normalize_prim_func`` reports:
    none with two blocks of non-unit reduction, else that one, else any reduction block."""
    firm = tuple(b for b in kb.reductions if _firm(b))
    return () if len(firm) > 1 else firm or kb.reductions


def _one_reduction(kb: KernelBlocks) -> Optional[s_tir.SBlock]:
    return kb.reductions[0] if len(kb.reductions) == 1 else None


def _conv_may_apply(kb: KernelBlocks, _rule) -> bool:
    """``match_conv``: one reduction block, 2 reads, 1 write, ``acc + ..``, ``(n, f, [y,] x)``
    spatial and one reduction iter var fewer."""
    block = _one_reduction(kb)
    if block is None or len(block.reads) != 2 or len(block.writes) != 1 or not _is_sum(block):
        return False
    kinds = [iv.iter_type for iv in block.iter_vars]
    spatial = kinds.count(tirx.IterVar.DataPar)
    return spatial in (3, 4) and kinds.count(tirx.IterVar.CommReduce) == spatial - 1 \
        and spatial + kinds.count(tirx.IterVar.CommReduce) == len(kinds)


def _matmul_may_apply(kb: KernelBlocks, _rule) -> bool:
    """``match_matmul``: one reduction block ``C += A * B`` (2 reads, 1 write)."""
    return any(len(b.reads) == 2 and len(b.writes) == 1 and _is_multiply_accumulate(b)
               for b in _sole_reduction_candidates(kb))


def _gemv_may_apply(kb: KernelBlocks, _rule) -> bool:
    """``DotProductGEMV``: every reduction block a plain dot product; dlight's GEMV: one
    reduction block (then at most an element-wise epilogue) writing one buffer."""
    return all(is_plain_dot_product(b) for b in kb.reductions) and \
        any(len(b.writes) == 1 for b in _sole_reduction_candidates(kb))


def _row_sums_may_apply(kb: KernelBlocks, _rule) -> bool:
    """``row_blocks``: two blocks or more, every reduction block (non-unit) a sum."""
    return len(kb.children) >= 2 and bool(kb.reductions) and \
        all(_is_sum(b) for b in kb.reductions if _firm(b))


def _plane_sum_may_apply(kb: KernelBlocks, _rule) -> bool:
    """``VectorPlaneSum``: 1 or 2 blocks, the first a sum ``S..SRR..``."""
    if not 1 <= len(kb.children) <= 2:
        return False
    first = kb.children[0]
    kinds = [iv.iter_type for iv in first.iter_vars]
    if tirx.IterVar.CommReduce not in kinds:
        return False
    rows = kinds.index(tirx.IterVar.CommReduce)
    return rows > 0 and len(kinds) - rows >= 2 and _is_sum(first) \
        and all(k == tirx.IterVar.CommReduce for k in kinds[rows:])


def _row_reduction_may_apply(kb: KernelBlocks, rule) -> bool:
    """``RowReduction``: a reduction block with at least ``min_reduction_work`` iterations
    (or a symbolic extent); dlight's ``Reduction``: two blocks or more."""
    if not kb.reductions or len(kb.children) < 2:
        return False
    work = reduction_work(kb.reductions)
    return work is None or work >= rule.min_reduction_work


_GATES = {"ChannelBlockedConv": _conv_may_apply, "ChannelBlockedDepthwise": _conv_may_apply,
          "DirectConv": _conv_may_apply, "StaticMatmul": _matmul_may_apply,
          "GenericMatmul": _matmul_may_apply, "DotProductGEMV": _gemv_may_apply,
          "VectorRowReduction": _row_sums_may_apply, "VectorPlaneSum": _plane_sum_may_apply,
          "RowReduction": _row_reduction_may_apply}
"""Rule name -> necessary condition; every one of these needs a reduction block."""

REDUCTION_RULES = frozenset(_GATES)


def may_apply(name: str, rule, kb: KernelBlocks) -> bool:
    """Whether the rule called ``name`` (its class inside any guards: ``rule``) may apply to
    the kernel walked into ``kb``; ``False`` only where the rule is known to return ``None``.

    Parameters
    ----------
    name : str
        The rule's class name (``rule_name``).
    rule : tvm.s_tir.dlight.ScheduleRule
        That rule, unwrapped (its thresholds are read, e.g. ``min_reduction_work``).
    kb : KernelBlocks
        From :func:`kernel_blocks`.

    Returns
    -------
    bool
    """
    gate = _GATES.get(name)
    if gate is None:
        return True  # a rule not known here (SpatialFallback, another one): tried
    if not kb.has_reduction:
        return False
    return kb.children is None or gate(kb, rule)
