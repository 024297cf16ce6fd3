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

from ._row_partials import row_blocks, schedule_rows, static_elements
from .cpu_gemv import reduction_blocks
from .cpu_matmul import simd_lanes

__all__ = ["RowReduction", "VectorRowReduction"]


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
