"""Parallel outer loops and a vectorised inner loop for a spatial (injective) block.

The loop-level part of a CPU schedule for element-wise work, shared by the
convolution rule (its padding and producer blocks);
:class:`relax_memplan.schedules.cpu_fallback.SpatialFallback` has its own
plan (thresholds, unit-stride check). It follows the
"parallelise the outer, vectorise the inner loop" recipe of TVM TOPI's x86
injective schedule (``topi.x86.schedule_injective``), written with TensorIR
primitives.
"""

from __future__ import annotations

from typing import Optional

from tvm import s_tir, tirx

__all__ = ["parallelize_spatial", "vector_split"]


def vector_split(extent: int, lanes: int, max_vector: int) -> Optional[int]:
    """The vector width for an innermost loop of constant ``extent``, or ``None``.

    The whole loop when ``extent <= max_vector``, else the largest multiple of
    ``lanes`` up to ``max_vector`` dividing ``extent`` (no remainder, so no
    predicate that would scalarise the vector loop), else ``None``.

    Parameters
    ----------
    extent : int
        Constant extent of the loop.
    lanes : int
        SIMD lanes of the element type.
    max_vector : int
        Largest vector (in elements) to emit.

    Returns
    -------
    int or None
    """
    if extent <= 1:
        return None
    if extent <= max_vector:
        return extent
    for width in range(max_vector - max_vector % lanes, lanes - 1, -lanes):
        if width > 0 and extent % width == 0:
            return width
    return None


def parallelize_spatial(sch: s_tir.Schedule, block, lanes: int, *,
                        min_parallel_extent: int = 64, max_vector_lanes: int = 4,
                        parallel: bool = True) -> None:
    """Fuse and parallelise the outer loops of ``block``, vectorise its innermost loop.

    Outer loops are fused, outermost first, until their product reaches
    ``min_parallel_extent`` (or only the innermost loop is left); the
    innermost loop is vectorised when its extent is constant and
    :func:`vector_split` finds a width. Loops must all be spatial.

    Parameters
    ----------
    sch : tvm.s_tir.Schedule
    block : SBlockRV
        A spatial block at the root of ``sch``.
    lanes : int
        SIMD lanes of the element type.
    min_parallel_extent : int
        Iterations wanted in the parallel loop.
    max_vector_lanes : int
        Largest vector, in SIMD registers.
    parallel : bool
        ``False``: vectorise only (a kernel too small for a parallel launch).
    """
    loops = sch.get_loops(block)
    if not loops:
        return
    inner = loops[-1]
    extent = sch.get(inner).extent
    width = vector_split(extent.value, lanes, lanes * max_vector_lanes) \
        if isinstance(extent, tirx.IntImm) else None
    outer = list(loops[:-1])
    if width is not None and width != extent.value:
        outer_part, inner = sch.split(inner, factors=[None, width])
        outer.append(outer_part)
    if parallel and outer:
        count, total = 0, 1
        for lp in outer:
            count += 1
            ext = sch.get(lp).extent
            if not isinstance(ext, tirx.IntImm):
                break
            total *= ext.value
            if total >= min_parallel_extent:
                break
        fused = outer[0] if count == 1 else sch.fuse(*outer[:count])
        sch.parallel(fused)
    elif parallel and width is None:
        sch.parallel(inner)
    if width is not None:
        sch.vectorize(inner)
