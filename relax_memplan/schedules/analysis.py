"""Recognise a matmul-like PrimFunc and classify the loops of its reduction block.

A PrimFunc qualifies when, after ``normalize_prim_func``, it has exactly one
reduction block of the form ``C[S.., I.., J] += A[S.., I.., K..] * B[S.., K.., J]``
(any index order of ``A`` and ``B``: NN, NT, batched, broadcast batch), optionally
preceded by spatial producers (transpose, cast) and followed by spatial
epilogue blocks (bias add, relu, gelu...), as LegalizeOps + FuseOps + FuseTIR
produce them for ``relax.matmul`` and ONNX ``MatMul``/``Gemm``.

The axis names follow the BLIS/GotoBLAS convention used in
:mod:`relax_memplan.schedules.cpu_matmul`:

* ``S`` -- batch axes, indexed by ``A``, ``B`` and ``C``;
* ``I`` -- rows (the ``M`` dim), indexed by ``A`` and ``C`` only; absent when
  ``M`` is 1 (unit loops are not reported);
* ``J`` -- columns (the ``N`` dim): the innermost index of ``C`` plus any other
  axis indexed by ``B`` and ``C`` only; this is the vectorised axis;
* ``K`` -- reduction axes, indexed by ``A`` and ``B``.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import List, Optional, Union

from tvm import s_tir, tirx
from tvm.s_tir.dlight import SBlockInfo, normalize_prim_func


@dataclass
class MatmulAxes:
    """The matmul block of a PrimFunc and its loops grouped by role.

    Attributes
    ----------
    block : s_tir.schedule.SBlockRV
        The reduction block computing ``C += A * B``.
    roles : str
        Role of each loop of ``block``, outer to inner: one of ``S``, ``I``, ``J``, ``K``
        per loop (e.g. ``"SIJK"`` for a batch matmul); stays valid when
        ``pad_einsum`` replaces the loops.
    s_extents, i_extents, j_extents, k_extents : list of int or PrimExpr
        Extents of the batch, row, column and reduction loops, outer to inner
        (``int`` when static).
    b_read_index : int
        Index in ``block.reads`` of the operand that carries the ``J`` axis.
    producers, consumers : list of SBlockInfo
        Spatial blocks before / after the matmul block, in program order.
    """

    block: s_tir.schedule.SBlockRV
    roles: str = ""
    s_extents: List[Union[int, tirx.PrimExpr]] = field(default_factory=list)
    i_extents: List[Union[int, tirx.PrimExpr]] = field(default_factory=list)
    j_extents: List[Union[int, tirx.PrimExpr]] = field(default_factory=list)
    k_extents: List[Union[int, tirx.PrimExpr]] = field(default_factory=list)
    b_read_index: int = 1
    producers: List[SBlockInfo] = field(default_factory=list)
    consumers: List[SBlockInfo] = field(default_factory=list)

    def all_static(self) -> bool:
        """Whether every loop extent of the matmul block is a constant."""
        extents = self.s_extents + self.i_extents + self.j_extents + self.k_extents
        return all(isinstance(e, int) for e in extents)


def _index_vars(region) -> Optional[List[Optional[tirx.Var]]]:
    """The variable indexing each dim of an access region, ``None`` for a constant.

    Returns ``None`` when some dim is not a unit access by a bare variable or a
    constant (the einsum pattern).
    """
    out: List[Optional[tirx.Var]] = []
    for rng in region:
        if not (isinstance(rng.extent, tirx.IntImm) and rng.extent.value == 1):
            return None
        if isinstance(rng.min, tirx.Var):
            out.append(rng.min)
        elif isinstance(rng.min, tirx.IntImm):
            out.append(None)
        else:
            return None
    return out


def _is_multiply_accumulate(block: s_tir.SBlock) -> bool:
    """``C[..] = C[..] + X * Y`` up to casts: rejects max/min/sum reductions."""
    body = block.body
    if not isinstance(body, tirx.BufferStore):
        return False
    value = body.value
    if not isinstance(value, tirx.Add):
        return False
    terms = [value.a, value.b]
    for term in terms:
        while isinstance(term, tirx.Cast):
            term = term.value
        if isinstance(term, tirx.Mul):
            return True
    return False


def match_matmul(sch: s_tir.Schedule) -> Optional[MatmulAxes]:
    """Find the matmul block of the scheduled function and classify its loops.

    Parameters
    ----------
    sch : s_tir.Schedule
        A fresh schedule of the PrimFunc (its ``main``).

    Returns
    -------
    MatmulAxes or None
        ``None`` when the function is not a single matmul with spatial
        producers/epilogues, or when ``C``'s innermost index is not a column
        axis (nothing to vectorise).
    """
    infos = normalize_prim_func(sch)
    if not infos:
        return None
    reductions = [k for k, info in enumerate(infos) if info.is_reduction()]
    if len(reductions) != 1:
        return None
    pos = reductions[0]
    info = infos[pos]
    if any(not other.is_injective() for k, other in enumerate(infos) if k != pos):
        return None
    stmt = sch.get(info.block_rv)
    if len(stmt.reads) != 2 or len(stmt.writes) != 1 or not _is_multiply_accumulate(stmt):
        return None
    read_vars = [_index_vars(r.region) for r in stmt.reads]
    c_vars = _index_vars(stmt.writes[0].region)
    if c_vars is None or any(v is None for v in read_vars) or not c_vars or c_vars[-1] is None:
        return None
    col = c_vars[-1]
    holders = [k for k in (0, 1) if col in read_vars[k]]
    if len(holders) != 1:
        return None
    b_idx = holders[0]
    a_set, b_set = set(read_vars[1 - b_idx]) - {None}, set(read_vars[b_idx]) - {None}
    c_set = set(c_vars) - {None}
    axes = MatmulAxes(block=info.block_rv, b_read_index=b_idx,
                      producers=infos[:pos], consumers=infos[pos + 1:])
    for it in info.iters:
        var, extent = it.var, it.dom
        if isinstance(extent, tirx.IntImm):
            extent = int(extent.value)
        if it.kind == "R":
            if var not in a_set or var not in b_set or var in c_set:
                return None
            axes.roles += "K"
            axes.k_extents.append(extent)
        elif it.kind == "S":
            in_a, in_b, in_c = var in a_set, var in b_set, var in c_set
            if not in_c:
                return None
            if in_a and in_b:
                axes.roles += "S"
                axes.s_extents.append(extent)
            elif in_a:
                axes.roles += "I"
                axes.i_extents.append(extent)
            elif in_b:
                axes.roles += "J"
                axes.j_extents.append(extent)
            elif extent == 1:
                axes.roles += "S"
                axes.s_extents.append(extent)
            else:
                return None
        else:
            return None
    # no I axis: a single row (unit loops are dropped by normalize_prim_func)
    if not axes.k_extents or not axes.j_extents:
        return None
    return axes
