"""Fallback CPU (llvm) rule: parallel outer loops and short vectors for kernels no rule took.

Where it runs
-------------
Last in :func:`relax_memplan.schedules.cpu_schedule_rules`, on PrimFuncs that
the matmul, convolution, GEMV and reduction rules left alone: element-wise
chains, transpose, concat, resize, padding, inference batch-norm, and pooling
(a reduction over a small window whose output loops are all outside it).

Algorithm
---------
TVM TOPI's x86 injective schedule (``topi.x86.schedule_injective``: fuse and
parallelise the outer loops, vectorise the inner one), restricted to where it
pays on a small CPU and keeps LLVM fast:

* a block is parallelised only when its work (product of its loop extents) is
  at least ``min_parallel_work`` -- a parallel launch on TVM's thread pool
  costs microseconds, more than a small kernel takes (silero's LSTM cell);
  only its leading data-parallel loops are fused (never a reduction loop);
* its innermost loop is vectorised only when it is data-parallel, has a
  constant extent that is a multiple of the SIMD lanes (split by one vector,
  at most ``max_vector_registers`` of them unsplit), and every buffer access
  in the block reads it at unit stride in its last index or not at all
  (no gathers: strided pooling windows, ``floordiv`` indices of resize and
  reshape stay scalar);
* a unit-stride inner loop no vector width divides (55 wide) gets no parallel
  loop either: serial, LLVM auto-vectorises it; in a parallel closure the
  buffers lose ``noalias`` and it runs scalar;
* the same for an inner loop that writes at unit stride but reads otherwise (nearest
  resize, transpose): serial, LLVM vectorises it with shuffles (ppocrv4-det's nearest
  resize of 96 x 10 x 10, one thread: 2.9 us serial, 18.9 us parallel; 96 x 40 x 40:
  428 vs 588 us, and 424 vs 599 us at two threads; ``benchmarks/fallback_micro.py``);
* the same for a reduction over a small window (at most ``max_serial_window``
  iterations) whose innermost output loop is unit-stride (stride-1 pooling): LLVM
  unrolls the window and vectorises the output loop when it stays serial;
* any other reduction over a small window (strided pooling) gets a parallel loop only from
  ``min_parallel_window_work`` iterations;
* a block that only moves data (split, concat) gets a parallel loop only from
  ``min_parallel_copy_work`` iterations (a parallel launch costs more than a small copy);
* a transpose (the inner loop's write unit-stride, a read unit-stride in an outer loop)
  whose two loops span more than a level-1 cache is tiled: both loops split by 16 (or 8)
  and their inner parts made innermost, serial;
* a dot-product reduction (a multiply-accumulate whose innermost non-unit loop is a
  reduction read at unit stride: a 1x1 convolution on a 1x1 map) gets vector partial sums
  (:mod:`._dot_reduction`, ``rfactor``), parallel only from ``min_parallel_dot_work``
  iterations; without a vector width dividing the loop it stays serial below that;
* a column reduction (``sum``/``max`` over an axis that is not the innermost one of its
  input, magika's sums over the sequence) gets the reduction loop outside a vectorised group
  of output columns (:mod:`._column_reduction`, loop interchange), parallel only from
  ``min_parallel_reduction_work`` iterations (memory-bound: at two threads a parallel loop
  over magika's 131,072 did not pay);
* functions with a symbolic loop extent are left unscheduled (their work
  is unknown; a predicate-split vector loop is scalar code anyway).

Before that, every spatial block writing an intermediate buffer is
``compute_inline``-d into its consumer when it has one, spatial, reading one element of it per
iteration (TOPI's injective schedule inlines all of them; a shared or windowed producer
would be recomputed per read: ultraface's box decoding ran 2.8x slower all inlined):
inference batch-norm is legalized as five full-size intermediate tensors. A column reduction
reading each element of its producer once takes it inlined too; a block that several others
read is inlined on a second pass once they have become one, if that one reads it at plain
indices without ``if_then_else`` and it reads its own inputs unit-stride (magika's tanh-GELU). A function where nothing was inlined and no block
qualifies is left unscheduled (returns ``None``).
"""

from __future__ import annotations

import math
from typing import List, NamedTuple, Optional

import tvm
from tvm import s_tir, tirx
from tvm.s_tir.dlight import ScheduleRule
from tvm.s_tir.dlight.analysis import get_root_block
from tvm.s_tir.dlight.analysis.common_analysis import get_sblockrealize
from tvm.target import Target

from ._column_reduction import column_group, column_reduction_lead, schedule_column_reduction
from ._dot_reduction import dot_loop, dot_width, schedule_dot_reduction
from ._fallback_inline import contiguous_in as _contiguous_in
from ._fallback_inline import inline_intermediates as _inline_intermediates
from ._fallback_inline import last_index as _last_index
from ._fallback_inline import writes_contiguous_in as _writes_contiguous_in
from .cpu_matmul import _ScheduleError, simd_lanes

__all__ = ["SpatialFallback"]


def _vector_width(extent: int, lanes: int, max_registers: int) -> Optional[int]:
    """Elements per vectorised inner loop for a constant ``extent``, or ``None``.

    The whole loop when it is a multiple of ``lanes`` within ``max_registers``
    vectors, else one full vector, else a half or quarter vector (at least 4
    elements: AVX2 / SSE widths on an AVX-512 target), whichever divides ``extent``.
    """
    if extent % lanes == 0 and extent <= lanes * max_registers:
        return extent
    for width in (lanes, lanes // 2, lanes // 4):
        if width >= 4 and extent % width == 0:
            return width
    return None


def _is_copy(node) -> bool:
    """Whether the block only moves data: its value is a load, or a selection
    (``if_then_else``) of loads and constants (split, concat, slice, padding)."""
    def moves(expr) -> bool:
        if isinstance(expr, (tvm.ir.expr.TensorLoad, tirx.IntImm, tirx.FloatImm)):
            return True
        if isinstance(expr, tirx.Select):
            return moves(expr.true_value) and moves(expr.false_value)
        if isinstance(expr, tvm.ir.Call) and \
                str(getattr(expr.op, "name", "")).endswith("if_then_else"):
            return moves(expr.args[1]) and moves(expr.args[2])
        return False
    return isinstance(node.body, tirx.BufferStore) and moves(node.body.value)


class _DotPlan(NamedTuple):
    """A dot-product reduction (:mod:`._dot_reduction`): loop ``loop`` split into ``width``
    vector partial sums; ``lead`` spatial loops before the reductions."""

    loop: int
    width: int
    lead: int


class _TilePlan(NamedTuple):
    """A transpose tiled ``tile x tile``: loop ``outer`` (read at unit stride) and the innermost
    loop (written at unit stride) each split by ``tile``, both inner parts innermost."""

    outer: int
    tile: int


class _ColumnPlan(NamedTuple):
    """How to schedule a column reduction: spatial loops before the reductions, columns per
    accumulator group, SIMD lanes."""

    lead: int
    group: int
    lanes: int


class SpatialFallback(ScheduleRule):
    """Parallel outer loops and short vectorised inner loops (see the module docstring).

    Parameters
    ----------
    min_parallel_work : int
        Fewest iterations (product of loop extents) for a block to get a parallel loop. A
        broadcast add of 1 x 256 x 256 (65,536; vad-lstm's ``add2``) at two threads, quiet
        host, us serial vs parallel: 4.9 vs 4.4 with TVM's thread pool spinning (its default),
        5.5 vs 18.7 with ``TVM_THREAD_POOL_SPIN_COUNT=0`` (a sleeping pool wakes in ~13 us;
        the latency benchmark runs so, beside onnxruntime without spinning); 131,072: 11.5 vs
        6.5 spinning, 11.4 vs 22.4 not. Below this default a kernel stays serial like TVM's
        own (it was 32,768: vad-lstm's ``add2`` read 1.75x TVM's in the latency run).
    min_parallel_extent : int
        Iterations wanted in the fused parallel loop (outer loops are fused until reached).
    max_vector_registers : int
        An innermost loop of at most this many SIMD vectors is vectorised whole;
        longer ones are split by one vector.
    max_serial_window : int
        A reduction over a window of at most this many iterations whose innermost output
        loop is unit-stride (stride-1 pooling) stays serial: LLVM vectorises it.
    max_column_vectors : int
        Accumulator vectors per column group of a column reduction (``sum`` over a
        non-innermost axis, :mod:`._column_reduction`).
    min_parallel_reduction_work : int
        Fewest iterations for a column reduction to get a parallel loop. Memory-bound: magika's
        ``[1, 512, 256] -> [1, 256]`` sum (131,072 iterations) took 0.021 ms serial and 0.025 ms
        parallel at two threads (CPU time, shared host), so the default keeps such sizes serial.
    transpose_tiles : tuple of int
        Tile sizes tried, first dividing both loops wins, for a transpose (a block writing at
        unit stride in its innermost loop and reading at unit stride in an outer one). One
        thread, znver4, ``(1, 64, 256) -> (256, 1, 64)`` (vad-lstm): 12 us as TVM's kernel,
        16 us with the host CPU's flags, 7-8.5 us in 16 x 16 or 8 x 8 tiles (inner loops
        neither unrolled nor vectorised: LLVM's code for those was no faster); 512 x 384:
        124 -> 62-68 us.
    min_transpose_slab_bytes : int
        A transpose is tiled only when the two transposed loops span at least this many
        bytes (a level-1 data cache): NCHW -> NHWC of ``(1, 48, 33, 32)`` moves a 6 KiB
        slab ``(c, w)`` per row ``h`` and ran 8.6 us as TVM's kernel, 14.7-15 us tiled by
        4, 8 or 16 (one thread, CPU time).
    min_parallel_copy_work : int
        Fewest iterations for a block that only moves data (split, concat, slice: its value
        is a load or an ``if_then_else`` of loads) to get a parallel loop. Two threads, wall
        time, load 3.5-4 on 2 cores, us serial vs parallel: yolov8n's split of
        ``(1, 64, 40, 40)`` (51,200 per half) 9 vs 32; ``(1, 64, 80, 80)`` 42 vs 55;
        ``(1, 64, 160, 160)`` 439 vs 307; a concat of 819,200 131 vs 81.
    min_parallel_window_work : int
        Fewest iterations for a reduction over a small window (at most ``max_serial_window``
        iterations: pooling) that LLVM does not vectorise serially (strided) to get a
        parallel loop. squeezenet's 3x3 stride-2 max-pool of 256 x 27 x 27 (389,376
        iterations): 1.17-1.18x TVM's serial kernel at two threads in four model runs
        (``fallback_bench.py``, load 2.6-5), equal at one; its 96 x 109 x 109 one (2.5 M)
        0.9-1.07x at two threads, 0.76-0.89x at one: stays parallel.
    min_parallel_dot_work : int
        Fewest iterations for a dot-product reduction (a 1x1 convolution on a 1x1 map) to get
        a parallel loop over its outputs. ppocrv4-det's squeeze-excitation convolutions
        (384 -> 96 and 96 -> 384 channels, 36,864 iterations) with a scalar inner loop took 34
        and 26 us serial and 44 and 36 us parallel at two threads (wall time, median of 21
        rounds, load 4 on 2 cores; equal at one thread); with vector partial sums, serial,
        2.3 and 6.5 us (TVM's kernel: 28 and 23 us).
    """

    def __init__(self, min_parallel_work: int = 1 << 17, min_parallel_extent: int = 16,
                 max_vector_registers: int = 2, max_serial_window: int = 32,
                 max_column_vectors: int = 8, min_parallel_reduction_work: int = 1 << 20,
                 min_parallel_dot_work: int = 1 << 18, transpose_tiles=(16, 8),
                 min_transpose_slab_bytes: int = 32768, min_parallel_copy_work: int = 1 << 19,
                 min_parallel_window_work: int = 1 << 20):
        self.min_parallel_dot_work = min_parallel_dot_work
        self.min_parallel_window_work = min_parallel_window_work
        self.min_parallel_copy_work = min_parallel_copy_work
        self.min_transpose_slab_bytes = min_transpose_slab_bytes
        self.transpose_tiles = tuple(transpose_tiles)
        self.max_column_vectors = max_column_vectors
        self.min_parallel_reduction_work = min_parallel_reduction_work
        self.min_parallel_work = min_parallel_work
        self.min_parallel_extent = min_parallel_extent
        self.max_vector_registers = max_vector_registers
        self.max_serial_window = max_serial_window

    def is_target_available(self, target: Target) -> bool:
        return target is not None and target.kind.name == "llvm"

    def apply(self, func: tirx.PrimFunc, target: Target, _tunable: bool):
        if not isinstance(func, tirx.PrimFunc) or not self.is_target_available(target):
            return None
        sch = s_tir.Schedule(func)
        try:
            blocks = sch.get_child_blocks(get_root_block(sch))
        except ValueError:  # body is not a root block
            return None
        if not blocks:
            return None
        inlined, shared = _inline_intermediates(sch, blocks)
        if inlined:
            blocks = sch.get_child_blocks(get_root_block(sch))
        plans = []
        for block in blocks:
            plan = self._plan(sch, block, target)
            if plan is None:
                return None
            if plan[2] is None and sch.get(block).name_hint in shared:
                # a shared producer with the index arithmetic of inlined layout blocks and no
                # vector loop: slower than TVM's chain of simple loops (yolov8n's
                # concat -> split head: 0.339 ms against 0.105 ms unscheduled), so TVM's kernel
                return None
            plans.append(plan)
        if not inlined and not any(p[1] or p[2] for p in plans):
            return None
        try:
            for block, parallel, vector in plans:
                self._apply_block(sch, block, parallel, vector)
        except _ScheduleError:
            return None
        return sch

    def _plan(self, sch, block, target):
        """``(block, parallel loops, vector width)`` or ``None`` if the function must be left."""
        node = sch.get(block)
        loops = sch.get_loops(block)
        if not loops or len(loops) != len(node.iter_vars):
            return None
        extents = [sch.get(lp).extent for lp in loops]
        if not all(isinstance(e, tirx.IntImm) for e in extents):
            return None
        extents = [int(e.value) for e in extents]
        realize = get_sblockrealize(sch, block)
        # loop k binds iter var k directly (legalized TOPI computes)
        for lp, bind in zip(loops, realize.iter_values):
            if not (isinstance(bind, tirx.Var) and bind.same_as(sch.get(lp).loop_var)):
                return None
        spatial = [iv.iter_type == tirx.IterVar.DataPar for iv in node.iter_vars]
        lead = next((k for k, s in enumerate(spatial) if not s), len(spatial))
        work = 1
        for e in extents:
            work *= e
        column = self._column_plan(sch, block, extents, target)
        if column is not None:
            return block, work >= self.min_parallel_reduction_work, column
        vector = None
        if lead == len(loops) and len(node.writes) == 1:
            lanes = simd_lanes(target, str(node.writes[0].source.dtype))
            inner = extents[-1]
            contiguous = _contiguous_in(node, node.iter_vars[-1].var)
            width = _vector_width(inner, lanes, self.max_vector_registers)
            if width is not None and contiguous:
                vector = width
            elif contiguous:
                # LLVM auto-vectorises this loop when it stays serial; inside a parallel
                # closure it loses ``noalias`` and runs scalar (concat of 55-wide rows:
                # 4x slower at one thread)
                return block, 0, None
            elif _writes_contiguous_in(node, node.iter_vars[-1].var):
                # unit-stride writes, other reads (nearest resize, transpose): LLVM vectorises
                # the serial loop with shuffles; a parallel scalar loop lost at every size
                # measured (benchmarks/fallback_micro.py, module docstring); a transpose
                # is tiled
                return block, 0, self._transpose_tile(node, extents)
        elif self._llvm_vectorizes_window(node, lead, extents):
            return block, 0, None
        else:
            dot = dot_loop(node, extents)
            width = None if dot is None else dot_width(
                extents[dot], simd_lanes(target, str(node.writes[0].source.dtype)))
            if width is not None:
                return block, work >= self.min_parallel_dot_work, _DotPlan(dot, width, lead)
            if dot is not None and work < self.min_parallel_dot_work:
                return block, 0, None
            if 0 < lead < len(extents) and work < self.min_parallel_window_work and \
                    math.prod(extents[lead:]) <= self.max_serial_window:
                return block, 0, None  # a strided pooling window: serial below that work
        n_par = lead if vector is None or lead < len(loops) else lead - 1
        if work < self.min_parallel_work or n_par == 0 or (
                work < self.min_parallel_copy_work and _is_copy(node)):
            n_par = 0
        return block, n_par, vector

    def _column_plan(self, sch, block, extents, target) -> Optional["_ColumnPlan"]:
        """A column reduction (:mod:`._column_reduction`) with a column count some vector
        group divides, or ``None``."""
        lead = column_reduction_lead(sch, block, _contiguous_in)
        if lead is None:
            return None
        lanes = simd_lanes(target, str(sch.get(block).writes[0].source.dtype))
        group = column_group(extents[lead - 1], lanes, self.max_column_vectors)
        return None if group is None else _ColumnPlan(lead, group, lanes)

    def _transpose_tile(self, node, extents) -> Optional[_TilePlan]:
        """A :class:`_TilePlan` when some read's last index is the plain loop variable of an
        outer loop, the two loops span at least ``min_transpose_slab_bytes`` and a tile size
        of ``transpose_tiles`` divides both extents; else ``None``."""
        loop_vars = [iv.var for iv in node.iter_vars]
        item_bytes = tvm.DataType(str(node.writes[0].source.dtype)).bits // 8
        for access in node.reads:
            last = _last_index(access)
            outer = next((k for k, v in enumerate(loop_vars[:-1])
                          if isinstance(last, tirx.Var) and last.same_as(v)), None)
            if outer is None or extents[outer] * extents[-1] * item_bytes < \
                    self.min_transpose_slab_bytes:
                continue
            tile = next((t for t in self.transpose_tiles
                         if extents[outer] % t == 0 and extents[-1] % t == 0), None)
            if tile is not None:
                return _TilePlan(outer, tile)
        return None

    def _llvm_vectorizes_window(self, node, lead: int, extents) -> bool:
        """A reduction over a small window (all loops after the spatial ones, at most
        ``max_serial_window`` iterations) whose innermost output loop is unit-stride in every
        access: a stride-1 pooling. LLVM unrolls the window and vectorises the output loop
        when the block stays serial; in a parallel closure the buffers lose ``noalias`` and
        it runs scalar (yolov8n's 5x5 max-pool on 128 x 10 x 10: 0.016 ms serial, 0.089 ms
        parallel at one thread, 0.045 ms at two)."""
        if not 0 < lead < len(extents) or extents[lead - 1] < 2:
            return False
        window = 1
        for e in extents[lead:]:
            window *= e
        return window <= self.max_serial_window and _contiguous_in(
            node, node.iter_vars[lead - 1].var)

    def _apply_block(self, sch, block, n_par: int, vector) -> None:
        if isinstance(vector, _ColumnPlan):
            schedule_column_reduction(sch, block, vector.lead, vector.group, vector.lanes,
                                      parallel=bool(n_par))
            return
        if isinstance(vector, _DotPlan):
            schedule_dot_reduction(sch, block, vector.loop, vector.width, vector.lead,
                                   self.min_parallel_extent if n_par else 0)
            return
        if isinstance(vector, _TilePlan):
            loops = sch.get_loops(block)
            outer, inner = (sch.split(loops[k], factors=[None, vector.tile])
                            for k in (vector.outer, -1))
            sch.reorder(outer[0], inner[0], outer[1], inner[1])
            return
        loops = sch.get_loops(block)
        if vector is not None:
            inner = loops[-1]
            if int(sch.get(inner).extent.value) != vector:
                _, inner = sch.split(inner, factors=[None, vector])
            sch.vectorize(inner)
        if n_par:
            outer: List = list(loops[:n_par])
            count, total = 0, 1
            for lp in outer:
                count += 1
                total *= int(sch.get(lp).extent.value)
                if total >= self.min_parallel_extent:
                    break
            fused = outer[0] if count == 1 else sch.fuse(*outer[:count])
            sch.parallel(fused)

