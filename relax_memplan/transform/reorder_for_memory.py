"""ReorderForMemory: run the bindings of each dataflow block in an order that lowers peak live bytes.

Where it runs
-------------
After ``FuseTIR`` and any kernel schedule, before ``CallTIRRewrite`` (first pass of the
``dataflow_lower`` phase of :func:`relax_memplan.pipeline.get_pipeline`): the bindings
are then the final kernels (``R.call_tir``), views and tuples, still in dataflow blocks.
Reads and writes no function attribute.

What it does
------------
Each dataflow block becomes a :class:`~relax_memplan.transform._memory_order.BlockModel`:
an ``R.call_tir`` (or any other call that is not a view) allocates the bytes of its
result; ``R.reshape``, ``R.memory.view``, ``ensure_zero_offset``, rebindings, tuples and
tuple items alias what they read; a tensor is freed after its last reader in the block
unless it is a block output (a non-dataflow var) or an alias of one. Then a topological
order of least peak live bytes is chosen: exact (dynamic program) for blocks of at most
``exact_max_bindings`` bindings, else a list scheduler by bytes freed minus allocated (as
in XLA's memory schedulers and PyTorch Inductor's ``reorder_for_peak_memory``). The new
order is used only if its peak is strictly lower than the importer's.

Safety
------
A binding never moves above a binding whose variable it uses. A ``match_cast`` defines
symbolic vars that later bindings may use without naming its variable, so it is a
barrier: bindings are reordered only between two ``match_cast`` bindings. A block with a
tensor of symbolic size is left as it is (its bytes cannot be compared).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Dict, List, Optional

import tvm
from tvm import relax, tirx

from ..analysis.liveness import dtype_size_bytes
from ._module_util import replace_functions
from ._memory_order import BlockModel, exact_schedule, is_topological, list_schedule, \
    peak_of_order

__all__ = ["ReorderForMemory", "BlockReorder"]

_VIEWS = frozenset({"relax.reshape", "relax.memory.view", "relax.memory.ensure_zero_offset"})


@dataclass
class BlockReorder:
    """What :class:`ReorderForMemory` found for one segment of a dataflow block.

    Attributes
    ----------
    function : str
    num_bindings : int
    peak_before_bytes, peak_after_bytes : int
        Peak live bytes of the segment's tensors in the importer's order and in the
        chosen order (equal when not applied).
    method : str
        ``"exact"`` or ``"list"``.
    applied : bool
    """

    function: str
    num_bindings: int
    peak_before_bytes: int
    peak_after_bytes: int
    method: str
    applied: bool


class _Unsized(Exception):
    """A tensor of the block has a symbolic size."""


def _bytes_of(ty) -> int:
    if isinstance(ty, relax.TupleType):
        return sum(_bytes_of(f) for f in ty.fields)
    if not isinstance(ty, relax.TensorType):
        return 0
    shape = ty.shape
    if shape is None or not isinstance(shape, relax.ShapeExpr) or not all(
            isinstance(d, tirx.IntImm) for d in shape.values):
        raise _Unsized()
    n = 1
    for d in shape.values:
        n *= int(d)
    return dtype_size_bytes(str(ty.dtype), n)


def _vars_in(expr) -> List[relax.Var]:
    found: List[relax.Var] = []
    relax.analysis.post_order_visit(
        expr, lambda e: found.append(e) if isinstance(e, relax.Var) else None)
    return found


def _model(bindings) -> BlockModel:
    """The memory model of a run of bindings without ``match_cast``."""
    index = {b.var: k for k, b in enumerate(bindings)}
    roots: Dict[relax.Var, set] = {}
    alloc, uses, deps, pinned = [], [], [], set()
    for k, b in enumerate(bindings):
        value = b.value
        used_vars = [v for v in _vars_in(value) if v in index]
        deps.append({index[v] for v in used_vars})
        used_roots = set().union(*(roots[v] for v in used_vars)) if used_vars else set()
        uses.append(used_roots)
        aliasing = isinstance(value, (relax.Var, relax.Tuple, relax.TupleGetItem)) or (
            isinstance(value, tvm.ir.Call) and isinstance(value.op, tvm.ir.Op)
            and value.op.name in _VIEWS)
        if aliasing:
            alloc.append(0)
            roots[b.var] = used_roots
        else:
            alloc.append(_bytes_of(b.var.ty))
            roots[b.var] = {k}
        if not isinstance(b.var, relax.DataflowVar):
            pinned |= roots[b.var]
    return BlockModel(alloc, uses, deps, pinned)


class _Reorderer:
    def __init__(self, name: str, exact_max_bindings: int, found: List[BlockReorder]):
        self.name, self.exact_max, self.found = name, exact_max_bindings, found

    def block(self, block) -> relax.BindingBlock:
        if not isinstance(block, relax.DataflowBlock):
            return block
        out, run = [], []
        for b in block.bindings:
            if isinstance(b, relax.MatchCast):
                out += self.segment(run) + [b]
                run = []
            else:
                run.append(b)
        out += self.segment(run)
        return relax.DataflowBlock(out, block.span)

    def segment(self, bindings) -> List:
        if len(bindings) < 3:
            return list(bindings)
        try:
            model = _model(bindings)
        except _Unsized:
            return list(bindings)
        method = "exact" if len(bindings) <= self.exact_max else "list"
        order = exact_schedule(model) if method == "exact" else list_schedule(model)
        if not is_topological(model, order):  # never expected: refuse rather than guess
            raise RuntimeError(f"ReorderForMemory: the {method} order of a block of "
                               f"'{self.name}' breaks a dependency (internal error)")
        before = peak_of_order(model, range(len(bindings)))
        after = peak_of_order(model, order)
        applied = after < before
        self.found.append(BlockReorder(self.name, len(bindings), before,
                                       after if applied else before, method, applied))
        return [bindings[k] for k in order] if applied else list(bindings)


@tvm.transform.module_pass(opt_level=0, name="ReorderForMemory")
class ReorderForMemory:
    """Reorder the bindings of every dataflow block to lower its peak live bytes.

    Must run after ``FuseTIR`` (and schedules) and before ``CallTIRRewrite``; see the
    module docstring for the model, the algorithms and the safety rules.

    Parameters
    ----------
    exact_max_bindings : int
        Blocks (segments between ``match_cast`` bindings) with at most this many bindings
        are ordered by the exact dynamic program (``2**n`` states); larger ones by the
        list scheduler.

    Attributes
    ----------
    blocks : list of BlockReorder
        Filled when the pass runs: one entry per segment of at least 3 bindings.
    input_module : tvm.IRModule or None
        The module as the pass received it (the importer's order), kept so that a report can
        give the lower bound in that order
        (:func:`relax_memplan.analysis.lowered_peak.planned_lower_bound_bytes`).

    Raises
    ------
    ValueError
        If ``exact_max_bindings`` is not an int in ``[0, 16]``.
    """

    def __init__(self, exact_max_bindings: int = 12):
        if isinstance(exact_max_bindings, bool) or not isinstance(exact_max_bindings, int) \
                or not 0 <= exact_max_bindings <= 16:
            raise ValueError(f"exact_max_bindings must be an int in [0, 16], "
                             f"got {exact_max_bindings!r}")
        self.exact_max_bindings = exact_max_bindings
        self.blocks: List[BlockReorder] = []
        self.input_module: Optional[tvm.IRModule] = None

    def transform_module(self, mod: tvm.IRModule, _ctx) -> tvm.IRModule:
        self.input_module = mod
        updates = {}
        for gv, func in mod.functions_items():
            if not isinstance(func, relax.Function) or not isinstance(func.body, relax.SeqExpr):
                continue
            r = _Reorderer(gv.name_hint, self.exact_max_bindings, self.blocks)
            seq = func.body
            body = relax.SeqExpr([r.block(b) for b in seq.blocks], seq.body, seq.span)
            if any(x.applied for x in self.blocks if x.function == gv.name_hint):
                updates[gv] = relax.Function(func.params, body, func.ret_ty, func.is_pure,
                                             func.attrs, func.span)
        return replace_functions(mod, updates)

    def peak_bytes(self, function: Optional[str] = None) -> tuple:
        """(sum of peaks before, sum after) over the segments of ``function`` (all if None)."""
        rows = [b for b in self.blocks if function is None or b.function == function]
        return (sum(b.peak_before_bytes for b in rows), sum(b.peak_after_bytes for b in rows))
