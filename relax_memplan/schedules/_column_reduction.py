"""Column reductions for :class:`~relax_memplan.schedules.SpatialFallback`.

A *column reduction* sums (or takes the max, ...) over an axis that is not the innermost one
of its input: ``out[i, j] = sum_k x[i, k, j]`` (magika's ``ReduceSum`` over the sequence
axis, ``sum(x * x)`` of its norm). Legalized, the reduction loop ``k`` is innermost, so every
step reads ``x`` ``J`` elements apart and nothing vectorises: one scalar load per
multiply-add. Interchanging the loops (``k`` outside, the output column ``j`` inside,
one accumulator vector per group of columns) makes every read a contiguous vector: the
standard loop interchange for column sums (e.g. Wolfe, *High Performance Compilers for
Parallel Computing*, ch. 9, loop interchange for stride-1 access). Measured on magika's
``[1, 512, 256] -> [1, 256]`` sum, CPU time of one call: 0.13 ms (TVM's kernel) -> 0.021 ms
serial with 8 vectors of columns per group; a parallel loop over the groups did not pay at
two threads (0.025 ms): the kernel is bound by memory, not arithmetic.

The block must be a reduction with loops ``(spatial..., reduce...)`` bound one to one, constant
extents, whose every access reads the last spatial variable unit-stride in its last index
and no reduction variable there.
"""

from __future__ import annotations

from typing import Optional

from tvm import s_tir, tirx

from .conv_match import _uses
from .cpu_spatial import vector_split

__all__ = ["column_group", "column_reduction_lead", "schedule_column_reduction"]


def column_reduction_lead(sch: s_tir.Schedule, block, contiguous_in) -> Optional[int]:
    """The number of leading spatial loops of a column-reduction ``block``, or ``None``.

    Parameters
    ----------
    sch : tvm.s_tir.Schedule
    block : SBlockRV
        A block at the root of ``sch``.
    contiguous_in : callable
        ``contiguous_in(block_node, var)``: every access of the block is one element,
        unit-stride (or invariant) in ``var`` in its last index.

    Returns
    -------
    int or None
        ``lead`` (loops ``[0, lead)`` spatial, the rest reductions) when the block reduces
        over loops that no access reading the last spatial variable indexes in its last
        dimension, and that variable is unit-stride in every access (in the last dimension
        or absent); else ``None``.
    """
    node = sch.get(block)
    loops = sch.get_loops(block)
    if node.init is None or len(loops) != len(node.iter_vars) or len(node.writes) != 1:
        return None
    kinds = [iv.iter_type for iv in node.iter_vars]
    lead = next((k for k, t in enumerate(kinds) if t != tirx.IterVar.DataPar), len(kinds))
    if lead == 0 or lead == len(kinds) or any(t != tirx.IterVar.CommReduce for t in kinds[lead:]):
        return None
    for lp, iv in zip(loops, node.iter_vars):
        if not isinstance(sch.get(lp).extent, tirx.IntImm):
            return None
    column = node.iter_vars[lead - 1].var
    reduce_vars = [iv.var for iv in node.iter_vars[lead:]]
    columnar = 0
    for access in node.reads:
        if not any(_uses(rng.min, column) for rng in access.region):
            continue  # invariant in the column (a broadcast operand)
        last = access.region[-1].min
        if any(_uses(last, v) for v in reduce_vars) or not _uses(last, column):
            return None
        columnar += 1
    if not columnar or not contiguous_in(node, column):
        return None
    return lead


def column_group(extent: int, lanes: int, max_vectors: int) -> Optional[int]:
    """Columns per accumulator group: the largest multiple of ``lanes`` up to ``max_vectors``
    vectors dividing ``extent`` (the whole ``extent`` when it is smaller), ``None`` if
    none divides it or ``extent`` is under half a vector (nothing to vectorise)."""
    if extent < max(lanes // 2, 2):
        return None
    return vector_split(extent, lanes, lanes * max_vectors)


def schedule_column_reduction(sch: s_tir.Schedule, block, lead: int, group: int, lanes: int,
                              parallel: bool) -> None:
    """Interchange: ``(spatial[:-1], column group, reduce..., column in group)``.

    The column group loop (``group`` columns, split into ``lanes``-wide vectors when it is a
    multiple of them) is vectorised inside the reduction loops, the init block too
    (``decompose_reduction``); the outer loops (the leading spatial ones and the groups) are
    fused and made parallel when ``parallel``.
    """
    loops = sch.get_loops(block)
    spatial, reduce = loops[:lead], loops[lead:]
    column = spatial[-1]
    outer_col, inner_col = sch.split(column, factors=[None, group])
    sch.reorder(*spatial[:-1], outer_col, *reduce, inner_col)
    vector = inner_col
    if group > lanes and group % lanes == 0:
        _, vector = sch.split(inner_col, factors=[None, lanes])
    sch.vectorize(vector)
    tile = sch.fuse(*spatial[:-1], outer_col) if lead > 1 else outer_col
    if parallel:
        sch.parallel(tile)
    init = sch.decompose_reduction(block, reduce[0])
    sch.vectorize(sch.get_loops(init)[-1])
