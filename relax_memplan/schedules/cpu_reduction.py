"""dlight's CPU ``Reduction`` rule, kept only when its parallel loop runs over the rows.

Where it runs
-------------
In :func:`relax_memplan.schedules.cpu_schedule_rules`, after the GEMV rule and
before :class:`~relax_memplan.schedules.cpu_fallback.SpatialFallback`.

Why
---
dlight's CPU ``Reduction`` (softmax, layer norm: reductions over the last axis
followed by element-wise blocks) parallelises the leading loop of the last
block and computes the reductions of that row under it. When there is one
row (softmax over ``(1, 1000)``, the classifier of squeezenet; layer norm at
one token) the unit row loop is dropped and the leading loop is the *column*
loop: every one of the 1000 outputs recomputes the whole max/exp/sum, a
quadratic kernel (4-11 ms instead of 6 us), and the parallel tasks all write
the same reduction buffer. :class:`RowReduction` runs the rule and keeps its
schedule only when the loop over the reduction blocks is as long as their
rows (the product of their spatial extents), and only from ``min_reduction_work``
iterations of its largest reduction: below that TVM's unscheduled loop nest (or
:class:`~relax_memplan.schedules.cpu_fallback.SpatialFallback`) is as fast or faster.
"""

from __future__ import annotations

from typing import Optional

import tvm
from tvm import s_tir, tirx
from tvm.s_tir import dlight

from ._fallback_inline import contiguous_in
from ._row_partials import _is_sum, row_blocks, schedule_rows, static_elements
from .cpu_gemv import reduction_blocks
from .cpu_matmul import simd_lanes

__all__ = ["RowReduction", "VectorPlaneSum", "VectorRowReduction"]


def _rows(block: s_tir.SBlock):
    rows = tirx.IntImm("int64", 1)
    for iv in block.iter_vars:
        if iv.iter_type == tirx.IterVar.DataPar:
            rows = rows * iv.dom.extent
    return rows


def reduction_work(blocks) -> Optional[int]:
    """Iterations (rows x reduction length, in elements read) of the largest of the reduction
    ``blocks``; ``None`` when an extent is symbolic."""
    largest = 0
    for block in blocks:
        work = 1
        for iv in block.iter_vars:
            if not isinstance(iv.dom.extent, tirx.IntImm):
                return None
            work *= int(iv.dom.extent.value)
        largest = max(largest, work)
    return largest


class RowReduction(dlight.ScheduleRule):
    """dlight's CPU ``Reduction``, rejected when its outer loop is not the row loop.

    Parameters
    ----------
    rule : tvm.s_tir.dlight.ScheduleRule, optional
        The rule to check (default ``dlight.cpu.Reduction()``).
    min_reduction_work : int
        Fewest iterations (rows x reduction length, constant shapes) of the function's largest
        reduction block for the rule to be kept; below it the function is left to the next
        rule (:class:`~relax_memplan.schedules.cpu_fallback.SpatialFallback`) or unscheduled.
        Symbolic shapes are always kept. Measured per kernel in isolation (``time_evaluator``,
        one thread, shared 2-core znver4, medians of 9 x 200 calls): ultraface's softmax over
        ``(4420, 2)`` (8,840) 85 us with dlight's schedule against 5.5 us declined; ppocrv4-det's
        squeeze-excitation kernels (a 1x1 conv on a 1x1 map, 144 to 36,864) 0.11-120 us against
        0.06-112 us, e.g. the gate multiply over ``96 x 80 x 80`` 834 against 271 us; from
        153,600 (ppocrv4-det's means over 40 x 40 and 80 x 80 maps, squeezenet's 13 x 13 mean)
        the two were within noise, and at two threads (``fallback_bench.py``) dlight's parallel
        row loop did not beat TVM's serial one on any mean of ppocrv4-det.
    """

    def __init__(self, rule: Optional[dlight.ScheduleRule] = None,
                 min_reduction_work: int = 1 << 17):
        self.rule = rule if rule is not None else dlight.cpu.Reduction()
        self.min_reduction_work = min_reduction_work

    def apply(self, func, target, tunable):
        if not isinstance(func, tirx.PrimFunc):
            return None
        blocks = reduction_blocks(func)
        if not blocks:
            return None
        work = reduction_work(blocks)
        if work is not None and work < self.min_reduction_work:
            return None
        result = self.rule.apply(func, target, tunable)
        sch = result[0] if isinstance(result, list) and result else result
        if not isinstance(sch, s_tir.Schedule):
            return result
        analyzer = tvm.sym.Analyzer()
        for block in blocks:
            rv = sch.get_sblock(block.name_hint)
            loops = sch.get_loops(rv)
            if not loops:
                return None
            outer = sch.get(loops[0])
            if not analyzer.can_prove_equal(outer.extent, _rows(block)):
                return None
        return result

    def __repr__(self) -> str:
        return f"RowReduction({type(self.rule).__name__})"


class VectorRowReduction(dlight.ScheduleRule):
    """Softmax / layer norm / RMS norm over the last axis with vectorized partial sums.

    The same loop nest as dlight's CPU ``Reduction`` (row loop parallel, every block computed
    under it, element-wise blocks vectorized), but each reduction over a constant extent is
    first split into ``lanes`` partial sums (``rfactor``: a vector accumulator updated once per
    ``lanes`` elements, then ``lanes`` values summed), where dlight's reductions are one
    serial chain of scalar adds (LLVM may not reorder float adds): layer norm over
    ``(8 * 64, 768)`` took 1.9 ms with dlight's rule, 2.3 ms in TVM's unscheduled build (2
    threads, znver4). Per-row intermediates up to 16 KiB (the row sums, softmax's ``exp``
    row) live in ``local`` (stack) buffers instead of ``global`` ones.

    Applies to chains of reductions ``S..SR`` and element-wise blocks over the same leading
    (row) axes ending in an element-wise block over the row (``S..SS``); a symbolic reduction
    extent (softmax over ``seq``) or one without a divisor of 4 lanes or more keeps the serial
    sum for that block. Anything else: ``None`` (the next rule).

    Parameters
    ----------
    min_parallel_elements : int
        Fewest output elements (constant shapes) for the row loop to be parallel; below it
        the kernel runs serially. Measured (2 threads, shared 2-core znver4): layer norm
        ``(64, 64)`` 1.6-2.1 us serial vs 12 us parallel, ``(256, 128)`` 9 us vs 22-150 us;
        a serial row costs about 0.3 ns per element, so below ~128 Ki elements the
        parallel launch costs more than it saves. Symbolic shapes are always parallel.

    Numerics: the sums are reassociated (``lanes`` interleaved partial sums); the results
    differ from a serial sum by float rounding only.
    """

    def __init__(self, min_parallel_elements: int = 1 << 17):
        self.min_parallel_elements = min_parallel_elements

    def apply(self, func, target, tunable):
        if not isinstance(func, tirx.PrimFunc) or target is None or target.kind.name != "llvm":
            return None
        sch = s_tir.Schedule(func)
        found = row_blocks(sch)
        if found is None:
            return None
        infos, rows = found
        dtype = str(sch.get(infos[-1].block_rv).writes[0].source.dtype)
        elements = static_elements(sch, infos[-1].block_rv)
        parallel = elements is None or elements >= self.min_parallel_elements
        try:
            return schedule_rows(sch, infos, rows, simd_lanes(target, dtype), parallel)
        except s_tir.ScheduleError:
            return None

    def __repr__(self) -> str:
        return "VectorRowReduction()"


class VectorPlaneSum(dlight.ScheduleRule):
    """A sum over trailing axes (mean over ``H x W``, global average pooling) with one vector
    accumulator as wide as the innermost reduction axis.

    TVM's legalized ``mean``/``sum`` over ``(H, W)`` is one serial chain of scalar adds per
    output (LLVM may not reorder float adds), and the build for the host CPU made it 2x slower
    than plain ``llvm`` (ppocrv4-det's means over 10 x 10 maps, 24-384 channels). Here the
    innermost reduction axis (``W``) is factored out (``rfactor``): for each output, ``H`` vector
    adds of ``W`` contiguous elements into a ``W``-wide accumulator on the stack, then ``W``
    scalar adds and the element-wise epilogue (the division of ``mean``), all under the output
    loop; serial (the kernels this takes are memory-bound and small). Measured in isolation
    (``time_evaluator``, one thread, shared 2-core znver4, medians): ``(1, 24, 10, 10)`` 0.27 us
    against 0.51 us in TVM's default build, ``(1, 192, 10, 10)`` 1.95 against 4.3 us,
    ``(1, 96, 20, 20)`` 2.4 against 28 us, ``(1, 24, 80, 80)`` 15 against 156 us.

    Applies to a function of one sum block ``S..SRR..`` (two or more reduction axes, constant
    extents) whose innermost
    reduction axis is read unit-stride in the last index of every input and has between 4 and
    ``max_vector_elements`` iterations, followed by at most one element-wise block over the same
    output; anything else: ``None`` (the next rule). Runs in :func:`cpu_schedule_rules` after
    :class:`VectorRowReduction`, before :class:`RowReduction`.

    Parameters
    ----------
    max_vector_elements : int
        Widest accumulator (elements of the innermost reduction axis).

    Numerics: the sum is reassociated (``W`` partial sums); results differ from the serial sum
    by float rounding only.
    """

    def __init__(self, max_vector_elements: int = 128):
        self.max_vector_elements = max_vector_elements

    def apply(self, func, target, tunable):
        if not isinstance(func, tirx.PrimFunc) or target is None or target.kind.name != "llvm":
            return None
        sch = s_tir.Schedule(func)
        try:
            blocks = list(sch.get_child_blocks(sch.get_sblock("root")))
        except (ValueError, s_tir.ScheduleError):
            return None
        if not 1 <= len(blocks) <= 2 or not self._applies(sch, blocks):
            return None
        try:
            return _schedule_plane_sum(sch, blocks)
        except s_tir.ScheduleError:
            return None

    def _applies(self, sch, blocks) -> bool:
        red = sch.get(blocks[0])
        kinds = [iv.iter_type for iv in red.iter_vars]
        rows = kinds.index(tirx.IterVar.CommReduce) if tirx.IterVar.CommReduce in kinds else 0
        if rows == 0 or len(kinds) - rows < 2 or \
                any(k != tirx.IterVar.CommReduce for k in kinds[rows:]):
            return False  # a sum over the last axis alone is VectorRowReduction's or dlight's
        if not _is_sum(red) or static_elements(sch, blocks[0]) is None:
            return False
        inner = red.iter_vars[-1]
        if not 4 <= int(inner.dom.extent) <= self.max_vector_elements:
            return False
        if not contiguous_in(red, inner.var) or len(sch.get_loops(blocks[0])) != len(kinds):
            return False
        if len(blocks) == 2:
            epi = sch.get(blocks[1])
            if any(iv.iter_type != tirx.IterVar.DataPar for iv in epi.iter_vars):
                return False
            ext = [int(iv.dom.extent) if isinstance(iv.dom.extent, tirx.IntImm) else -1
                   for iv in epi.iter_vars]
            if ext != [int(iv.dom.extent) for iv in red.iter_vars[:rows]] or \
                    len(sch.get_loops(blocks[1])) != rows:
                return False
        return True

    def __repr__(self) -> str:
        return "VectorPlaneSum()"


def _schedule_plane_sum(sch: s_tir.Schedule, blocks) -> s_tir.Schedule:
    """rfactor the innermost reduction loop of ``blocks[0]`` and compute it under the
    epilogue's (``blocks[1]``, if any) output loop (see :class:`VectorPlaneSum`)."""
    red = blocks[0]
    rows = sum(iv.iter_type == tirx.IterVar.DataPar for iv in sch.get(red).iter_vars)
    rf = sch.rfactor(sch.get_loops(red)[-1], factor_axis=0)
    if len(blocks) == 2:
        at = sch.get_loops(blocks[1])[rows - 1]
        sch.compute_at(red, at, preserve_unit_loops=True)
        sch.compute_at(rf, at, preserve_unit_loops=True)
    node = sch.get(rf)
    loops = sch.get_loops(rf)[-len(node.iter_vars):]
    reduce_loops = [lp for lp, iv in zip(loops, node.iter_vars)
                    if iv.iter_type == tirx.IterVar.CommReduce]
    lane = loops[[iv.iter_type for iv in node.iter_vars].index(tirx.IterVar.DataPar)]
    sch.reorder(*reduce_loops, lane)
    sch.vectorize(lane)
    init = sch.decompose_reduction(rf, reduce_loops[0])
    sch.vectorize(sch.get_loops(init)[-1])
    if len(blocks) == 2:
        sch.set_scope(rf, 0, "local")
    return sch
