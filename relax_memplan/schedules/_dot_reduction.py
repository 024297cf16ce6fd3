"""Dot-product reductions with vector partial sums, for
:class:`~relax_memplan.schedules.SpatialFallback`.

A multiply-accumulate block whose innermost non-unit loop is a reduction read at unit stride by
every buffer (a 1x1 convolution on a 1x1 map: ppocrv4-det's squeeze-excitation, which the
convolution and matmul rules leave) runs, unscheduled, as one scalar sum per output: LLVM does
not reorder a floating-point sum, so it cannot vectorise it. Here that loop is split by a
vector width ``w`` and ``rfactor``-ed (TensorIR's reduction factoring, as dlight's GEMV rule
and TVM's ``te`` ``rfactor`` do): ``w`` partial sums, one vector, are accumulated over the loop
and added up after it. The sum order changes (the result differs from the serial sum by
rounding only).
"""

from __future__ import annotations

from typing import List, Optional

from tvm import s_tir, tirx

from ._fallback_inline import unit_stride_ignoring_unit_dims

__all__ = ["dot_loop", "dot_width", "schedule_dot_reduction"]


def _is_multiply_accumulate(block: s_tir.SBlock) -> bool:
    """Whether the block's update is ``acc + a * b`` (not a pooling ``max`` or plain sum)."""
    body = block.body
    return isinstance(body, tirx.BufferStore) and isinstance(body.value, tirx.Add) and any(
        isinstance(term, tirx.Mul) for term in (body.value.a, body.value.b))


def dot_loop(block: s_tir.SBlock, extents: List[int]) -> Optional[int]:
    """The index of the loop to vectorise as partial sums, or ``None``.

    That loop is the innermost one of extent > 1; it must bind a reduction iter var, every
    read must be unit-stride in it (indices into trailing dims of extent 1 aside), and the
    block must be a multiply-accumulate. The block's loops bind its iter vars in order.
    """
    if not _is_multiply_accumulate(block):
        return None
    big = [k for k, e in enumerate(extents) if e > 1]
    if not big:
        return None
    k = big[-1]
    iv = block.iter_vars[k]
    if iv.iter_type != tirx.IterVar.CommReduce:
        return None
    if not all(unit_stride_ignoring_unit_dims(read, iv.var) for read in block.reads):
        return None
    return k


def dot_width(extent: int, lanes: int) -> Optional[int]:
    """Partial sums per output: a full vector, else a half or quarter one (at least 4), that
    divides ``extent`` at least twice; ``None`` if none does."""
    for width in (lanes, lanes // 2, lanes // 4):
        if width >= 4 and extent % width == 0 and extent >= 2 * width:
            return width
    return None


def schedule_dot_reduction(sch: s_tir.Schedule, block, loop: int, width: int, lead: int,
                           parallel_extent: int = 0) -> None:
    """Split loop ``loop`` of ``block`` by ``width``, ``rfactor`` the inner part into a vector of
    partial sums (innermost, vectorised) and add them up in a second block.

    Parameters
    ----------
    sch : tvm.s_tir.Schedule
    block : SBlockRV
        The reduction block (see :func:`dot_loop`).
    loop : int
        Index of the loop to split among the block's loops.
    width : int
        Partial sums (vector lanes), dividing the loop's extent.
    lead : int
        Spatial loops before the first reduction loop.
    parallel_extent : int
        When > 0, the leading spatial loops of the partial-sum block are fused, outermost
        first, until their product reaches it, and made parallel; 0: serial.
    """
    outer, inner = sch.split(sch.get_loops(block)[loop], factors=[None, width])
    after = sch.get_loops(block)[loop + 2:]  # unit loops after the split one
    sch.reorder(outer, *after, inner)
    ndim = len(sch.get(block).writes[0].region)
    partial = sch.rfactor(inner, factor_axis=ndim)
    loops = sch.get_loops(partial)
    sch.vectorize(loops[-1])
    first_reduction = loops[lead]
    if parallel_extent and lead:
        count, total = 0, 1
        for lp in loops[:lead]:
            count += 1
            total *= int(sch.get(lp).extent.value)
            if total >= parallel_extent:
                break
        sch.parallel(loops[0] if count == 1 else sch.fuse(*loops[:count]))
    sch.decompose_reduction(partial, first_reduction)
