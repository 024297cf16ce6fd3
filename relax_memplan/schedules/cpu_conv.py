"""Dlight-style CPU (llvm) schedule rule for direct convolutions (conv1d, conv2d; NCHW).

Where it runs
-------------
After ``FuseTIR`` (see :func:`relax_memplan.schedules.cpu_schedule_pass`),
first of the CPU rules (before StaticMatmul, which gets the 1x1 convolutions on small maps
this rule declines, and the GEMV rule), on PrimFuncs that LegalizeOps makes of ``relax.nn.conv1d``
/ ``relax.nn.conv2d`` (TOPI ``conv*_nchw`` / ``group_conv2d_nchw`` /
depthwise computes): a padding block, one reduction block
``out[n, f, y, x] += pad[n, c(f, rc), y * sh + ry * dh, x * sw + rx * dw] * w[f, rc, ry, rx]``
and the element-wise epilogue FuseOps put after it (bias, relu, clip,
``sigmoid(x) * x``...). All loop extents must be constants.

Algorithm
---------
Blocked direct convolution, as in TVM TOPI's x86 conv2d schedules and
Georganas et al., "Anatomy of high-performance deep learning convolutions on
SIMD architectures" (SC 2018), without the layout change to ``NCHWc``: the
register tile is ``mr`` output channels x ``xt`` output columns of one output
row. Its ``mr x xt`` accumulators live in a ``local`` buffer
(``cache_write``), the reduction loops ``rc, ry, rx`` run outside the tile,
the ``mr`` channel loop is unrolled (each weight a broadcast scalar) and the
``xt`` column loop is vectorised with the target's SIMD width (one input
vector shared by the ``mr`` channels). Depthwise/grouped convolutions whose
input channel depends on the output channel use ``mr = 1``. The tiles
``(n, channel block, row, column block)`` are fused into one parallel loop
(serial below ``min_parallel_macs`` multiply-adds);
the epilogue is inlined into the write-back of the tile
(``reverse_compute_inline``), so it runs on data still in registers. The
padding block stays a separate parallel, vectorised copy, so the inner loop
reads the input without a bounds test. ``xt`` divides the output width (no
remainder predicate, which would scalarise the vector loop). A width with no
divisor of at least one vector (squeezenet's 109, magika's 508 = 4 x 127) is
split instead (``loop_partition``) into a main part of full ``xt``-wide
tiles and a tail tile of the remaining columns, both vectorised; these two
blocks accumulate in the output buffer (a ``local`` cache under the
partition's scope is not shrunk to the tile: 20x slower) and the epilogue
runs as a separate parallel pass (squeezenet's 7x7 stem alone, 1 thread:
41-73 -> 10 ms). Among divisors, whole vectors win (48 wide: 16, not 24;
mobilenetv2-tiny's stem 0.39 -> 0.05 ms). An output of
width 1 over rows (a conv1d exported as a conv2d on ``(length, 1)``) is tiled
along the rows instead.

Three choices measured per kernel (``benchmarks/conv_bench.py``, one thread, znver4):
a column-strided convolution with at least 8 input channels reads a deinterleaved copy of
its input (:func:`deinterleave_strided_input`); a 1x1 convolution with fewer than 256
output pixels is left to StaticMatmul's tile; a depthwise convolution at least 64 outputs
wide keeps TVM's unscheduled kernel (returned unchanged), which LLVM vectorises better
than a one-channel tile.
"""

from __future__ import annotations

from typing import List, Tuple

import tvm
from tvm import s_tir, tirx
from tvm.s_tir.dlight import ScheduleRule
from tvm.target import Target

from .conv_match import ConvAxes, _static, _uses, match_conv
from .cpu_matmul import _has_fma, _try, simd_lanes
from .cpu_spatial import parallelize_spatial

__all__ = ["ConvAxes", "DirectConv", "deinterleave_strided_input", "match_conv"]

_ScheduleError = s_tir.ScheduleError


def _same_domain(sch: s_tir.Schedule, block, extents: List[int]) -> bool:
    """Whether ``block``'s loops have exactly the constant ``extents`` (the conv output's)."""
    loops = [sch.get(lp).extent for lp in sch.get_loops(block)]
    return [_static(e) for e in loops] == list(extents)


def _column_tile(width: int, lanes: int, max_vectors: int) -> int:
    """Output columns per tile: ``width`` if it is whole vectors within the tile or at most
    one vector, else its largest whole-vector divisor that fits (48 wide: 16, not 24), else
    its largest divisor of at most one vector (the caller then splits off a tail).

    Never an odd width above one vector (20 = 16 + 4, 27): LLVM spills such a loop-carried
    accumulator through the stack element by element (yolov8n's 3x3 convs on 40- and 20-wide
    maps ran 3-4x slower than with a 16-wide tile; measured on znver4).
    """
    limit = lanes * max_vectors
    if width <= lanes or (width <= limit and width % lanes == 0):
        return width
    divisors = [d for d in range(1, min(width, limit) + 1) if width % d == 0]
    whole = [d for d in divisors if d % lanes == 0]
    return max(whole) if whole else max(d for d in divisors if d <= lanes)


def _tail_vectors(width: int, lanes: int, max_vectors: int) -> int:
    """Vectors per main tile of a split column loop, so that the tail is under one vector
    (54 wide on 16 lanes: 3 x 16 + 6, not 32 + 22)."""
    return next((v for v in range(max_vectors, 0, -1)
                 if v * lanes <= width and width % (v * lanes) < lanes), 1)


def _column_stride(sch: s_tir.Schedule, axes: ConvAxes, col: int) -> Tuple[int, int]:
    """(index of the input read, stride of the output column ``col`` in the input's dim ``col``);
    stride 1 when the index is not linear in the column variable."""
    block = sch.get(axes.block)
    x_var = [iv for iv in block.iter_vars if iv.iter_type == tirx.IterVar.DataPar][col].var
    for k, read in enumerate(block.reads):
        if len(read.region) > col and _uses(read.region[col].min, x_var):
            coeffs = tvm.sym.detect_linear_equation(read.region[col].min, [x_var])
            stride = _static(coeffs[0]) if len(coeffs) == 2 else None
            return k, stride if stride is not None and stride > 0 else 1
    return -1, 1


def deinterleave_strided_input(sch: s_tir.Schedule, axes: ConvAxes, col: int) -> bool:
    """Give the input of a column-strided convolution the layout ``(..., W % s, W // s)``.

    With stride ``s`` along the output column ``x``, the block reads the input at
    ``x * s + rx``: ``s`` apart, so a vector of output columns needs a gather. In the
    deinterleaved layout that read is ``[rx % s, x + rx // s]``, one contiguous vector per
    ``rx`` (the phase split of strided convolutions, as in the polyphase decomposition
    of a strided filter). The layout is given to the padding block's buffer when the
    input is padded in the function, else to a copy of the input (``cache_read``, added to
    ``axes.producers``); either way the copy is one pass over the input.

    Returns
    -------
    bool
        ``True`` when the layout changed; ``False`` for stride 1, a dimension not a multiple
        of ``s`` (the map would not be bijective) or a non-linear index.
    """
    read_index, stride = _column_stride(sch, axes, col)
    if stride <= 1:
        return False
    buffer = sch.get(axes.block).reads[read_index].source
    width = _static(buffer.shape[col])
    if width is None or width % stride:
        return False
    writer = next((b for b in axes.producers
                   if any(w.source.same_as(buffer) for w in sch.get(b).writes)), None)
    if writer is None:
        writer = sch.cache_read(axes.block, read_index, "global")
        axes.producers.append(writer)

    def _phases(*index):
        return (*index[:col], index[col] % stride, index[col] // stride, *index[col + 1:])

    sch.transform_layout(writer, ("write", 0),
                         tirx.IndexMap.from_func(_phases, ndim=len(buffer.shape)))
    return True


class DirectConv(ScheduleRule):
    """Blocked direct convolution for constant shapes (see the module docstring).

    Parameters
    ----------
    max_column_vectors : int
        Output columns per tile, in SIMD vectors (``xt <= max_column_vectors * lanes``).
    channel_tiles : tuple of int
        Output channels per tile (``mr``) to try, largest first; the first dividing
        the channel count with ``mr * vectors(xt)`` accumulators within budget wins.
    accumulators_fma, accumulators_no_fma : int
        Budget of vector accumulators (registers) with / without FMA (16 vector registers).
    accumulators_avx512 : int
        Budget with AVX-512 (32 vector registers; yolov8n's 32-channel 3x3 conv on an
        80x80 map, 1 thread: 12 channels x 1 vector 3.6 ms, 6 x 1 5.3 ms).
    min_parallel_macs : int
        Fewest multiply-adds for the tile loop to be parallel; below it the
        kernel runs serially (a parallel launch costs more than it saves:
        mnist's 5x5 convolutions, 0.16 and 0.63 M multiply-adds).
    min_parallel_reduction : int
        Fewest multiply-adds per output (input channels per group x window) for the tile loop
        to be parallel: below it (3-channel stems, depthwise) the kernel is memory-bound and
        runs serially. Serial vs parallel, ms, one thread (CPU time) / two threads (wall
        time, median, load 4-5 on 2 cores): yolov8n's 3 -> 16 3x3 stride-2 stem on 320x320
        1.38 vs 1.47 / 2.9 vs 4.8; ultraface's 0.32 vs 0.35 / 0.29 vs 1.24; 3 -> 32 3x3 on
        96x96 0.17 vs 0.21 / 0.18 vs 2.6; 5x5 depthwise 192 x 20 x 20 0.11 vs 0.11 /
        0.11 vs 1.0.
    deinterleave_strided : bool
        Give the input of a convolution strided along its vectorised column the layout
        ``(..., W % s, W // s)`` (:func:`deinterleave_strided_input`), so that its reads are
        contiguous vectors, not gathers; when the schedule then fails, it is retried without.
    min_deinterleave_channels : int
        Fewest input channels summed per output for the deinterleaving copy to pay off
        (never for depthwise). One thread, znver4, 3x3 stride 2: 32 -> 64 channels on an
        80x80 map 0.91 -> 0.68 ms, but yolov8n's 3-channel stem 0.57 -> 0.68 ms and a
        16-channel depthwise 0.19 -> 0.23 ms (``benchmarks/conv_bench.py``).
    min_direct_1x1_pixels : int
        A 1x1 convolution with a smaller output map is declined (left to
        :class:`~relax_memplan.schedules.StaticMatmul`, which runs after this rule); a
        larger one gets this rule's tile. One thread, znver4: 32 -> 32 channels on 80x80
        1.15 (matmul tile) -> 0.27 ms, 192 -> 128 on 20x20 0.45 -> 0.28 ms; 256 -> 256 on
        10x10 0.31 -> 0.32 ms.
    schedule_depthwise : bool
        Schedule every depthwise convolution (one input channel per output). Off: the wide
        ones (``tvm_depthwise_min_width``) keep
        TVM's unscheduled kernel (returned unchanged, so that the later rules, whose result
        was slower still, do not take it), which LLVM vectorises and which ran
        2.4-4x faster than this rule's tile (one thread, znver4: ppocrv4-det's 3x3 depthwise
        32 channels stride 2 on 160x160 0.26 vs 0.62 ms, 48 channels on 80x80 0.17 vs
        0.70 ms; the padding copy and a one-channel tile dominate).
    tvm_depthwise_min_width : int
        Only depthwise convolutions with an output at least this wide keep TVM's kernel;
        narrower ones get this rule's tile, which wins there (ppocrv4-det's 5x5 depthwise
        with hard-swish, one thread: 192 channels on 20x20 0.14 vs 0.73 ms, 384 on 10x10
        0.10 vs 0.22 ms, 3x3 96 channels on 40x40 0.11 vs 1.32 ms). The threshold lies
        between the widths measured (10-40 vs 80).
    """

    def __init__(self, max_column_vectors: int = 2, channel_tiles=(12, 8, 6, 4, 3, 2),
                 accumulators_fma: int = 12, accumulators_no_fma: int = 8,
                 accumulators_avx512: int = 24, min_parallel_macs: int = 1 << 20,
                 deinterleave_strided: bool = True, min_deinterleave_channels: int = 8,
                 min_direct_1x1_pixels: int = 256, schedule_depthwise: bool = False,
                 tvm_depthwise_min_width: int = 64, min_parallel_reduction: int = 32):
        self.min_parallel_reduction = min_parallel_reduction
        self.max_column_vectors = max_column_vectors
        self.channel_tiles = tuple(channel_tiles)
        self.accumulators_fma = accumulators_fma
        self.accumulators_avx512 = accumulators_avx512
        self.accumulators_no_fma = accumulators_no_fma
        self.min_parallel_macs = min_parallel_macs
        self.deinterleave_strided = deinterleave_strided
        self.min_deinterleave_channels = min_deinterleave_channels
        self.min_direct_1x1_pixels = min_direct_1x1_pixels
        self.schedule_depthwise = schedule_depthwise
        self.tvm_depthwise_min_width = tvm_depthwise_min_width

    def is_target_available(self, target: Target) -> bool:
        return target is not None and target.kind.name == "llvm"

    def _channel_tile(self, axes: ConvAxes, vectors: int, target: Target) -> int:
        if axes.depthwise:
            return 1
        budget = self.accumulators_fma if _has_fma(target) else self.accumulators_no_fma
        if simd_lanes(target, "float32") >= 16:  # AVX-512: 32 vector registers, not 16
            budget = self.accumulators_avx512
        channels = axes.spatial_extents[1]
        return next((mr for mr in self.channel_tiles
                     if channels % mr == 0 and mr * vectors <= budget), 1)

    def apply(self, func: tirx.PrimFunc, target: Target, _tunable: bool):
        if not isinstance(func, tirx.PrimFunc) or not self.is_target_available(target):
            return None
        sch = s_tir.Schedule(func)
        try:
            axes = match_conv(sch)
        except ValueError:  # body is not a root block
            return None
        if axes is None or self._left_to_matmul(axes):
            return None
        if self._one_channel_per_output(axes) and not self.schedule_depthwise and \
                axes.spatial_extents[self._column(axes)] >= self.tvm_depthwise_min_width:
            return sch  # TVM's kernel as is, marked scheduled so no later rule takes it
        dtype = str(sch.get(axes.block).writes[0].source.dtype)
        lanes = simd_lanes(target, dtype)
        deinterleave_first = self.deinterleave_strided and not axes.depthwise \
            and axes.reduce_extents[0] >= self.min_deinterleave_channels
        for deinterleave in (deinterleave_first, False):
            try:
                if deinterleave and not deinterleave_strided_input(sch, axes, self._column(axes)):
                    continue
                self._schedule(sch, axes, lanes, target)
                return sch
            except (_ScheduleError, tvm.error.InternalError):
                pass  # a primitive's check failed on an unusual variant: retry plainly
            sch = s_tir.Schedule(func)
            axes = match_conv(sch)
        return None  # leave it

    @staticmethod
    def _one_channel_per_output(axes: ConvAxes) -> bool:
        """Depthwise: each output channel sums over one input channel only."""
        return axes.depthwise and axes.reduce_extents[0] == 1

    def _left_to_matmul(self, axes: ConvAxes) -> bool:
        """A 1x1 convolution (every reduction extent but the channel one is 1) with an output
        map under ``min_direct_1x1_pixels``: StaticMatmul's tile (which runs after this
        rule) is faster there."""
        if axes.depthwise or any(e != 1 for e in axes.reduce_extents[1:]):
            return False
        pixels = 1
        for extent in axes.spatial_extents[2:]:
            pixels *= extent
        return pixels < self.min_direct_1x1_pixels

    @staticmethod
    def _column(axes: ConvAxes) -> int:
        """The output dim tiled into vectors: the width, or the length of a conv1d written
        as a conv2d over ``(length, 1)`` (magika)."""
        n_sp = len(axes.spatial_extents)
        if n_sp == 4 and axes.spatial_extents[3] == 1 and axes.spatial_extents[2] > 1:
            return 2
        return n_sp - 1

    def _schedule(self, sch: s_tir.Schedule, axes: ConvAxes, lanes: int, target: Target) -> None:
        block = axes.block
        n_sp = len(axes.spatial_extents)
        col = self._column(axes)
        width = axes.spatial_extents[col]
        xt = _column_tile(width, lanes, self.max_column_vectors)
        macs = per_output = 1
        for extent in axes.reduce_extents:
            per_output *= extent
        for extent in axes.spatial_extents:
            macs *= extent
        macs *= per_output
        parallel = macs >= self.min_parallel_macs and per_output >= self.min_parallel_reduction
        if xt < lanes < width:
            self._schedule_with_tail(sch, axes, col, lanes, target, parallel)
            return
        vectors = -(-xt // lanes)
        mr = self._channel_tile(axes, vectors, target)
        loops = sch.get_loops(block)
        spatial, reduce = loops[:n_sp], loops[n_sp:]
        n, f, x = spatial[0], spatial[1], spatial[col]
        rows = [lp for k, lp in enumerate(spatial[2:], start=2) if k != col]
        fo, fi = sch.split(f, factors=[None, mr])
        xo, xi = sch.split(x, factors=[None, xt])
        sch.reorder(n, fo, *rows, xo, *reduce, fi, xi)
        tile = sch.fuse(n, fo, *rows, xo)
        if parallel:
            sch.parallel(tile)

        write_back = sch.cache_write(block, 0, "local")
        sch.reverse_compute_at(write_back, tile, preserve_unit_loops=True)
        # epilogue intermediates inlined forward (one of them may feed two blocks, as in
        # ``sigmoid(y) * y``), then the last block into the write-back
        remaining = [c for c in axes.consumers[:-1] if not _try(sch.compute_inline, c)]
        remaining += axes.consumers[-1:]
        for consumer in remaining:
            # a consumer over a larger domain (squeeze-excitation: the 1x1 conv output times
            # a feature map) makes reverse_compute_inline fail with an InternalError in TVM
            if not (_same_domain(sch, consumer, axes.spatial_extents)
                    and _try(sch.reverse_compute_inline, consumer)):
                parallelize_spatial(sch, consumer, lanes, parallel=parallel)
        wb_loops = sch.get_loops(write_back)
        sch.vectorize(wb_loops[-1])
        for producer in axes.producers:  # padding: a parallel copy, no bounds test inside
            parallelize_spatial(sch, producer, lanes, parallel=parallel)
        sch.unroll(fi)
        sch.vectorize(xi)
        init = sch.decompose_reduction(block, reduce[0])
        sch.vectorize(sch.get_loops(init)[-1])

    def _schedule_with_tail(self, sch: s_tir.Schedule, axes: ConvAxes, col: int, lanes: int,
                            target: Target, parallel: bool) -> None:
        """Columns in full tiles of whole vectors plus one tail tile under one vector.

        ``loop_partition`` of the column loop gives two copies of the convolution
        block (columns ``[0, main)`` and ``[main, width)``); each keeps the
        channel tile unrolled and its columns vectorised, accumulating in the
        output. The epilogue cannot be inlined into two producers: it runs after,
        as a parallel pass.
        """
        n_sp = len(axes.spatial_extents)
        width = axes.spatial_extents[col]
        vectors = _tail_vectors(width, lanes, self.max_column_vectors)
        xt = lanes * vectors
        mr = self._channel_tile(axes, vectors, target)
        loops = sch.get_loops(axes.block)
        spatial, reduce = loops[:n_sp], loops[n_sp:]
        n, f, x = spatial[0], spatial[1], spatial[col]
        rows = [lp for k, lp in enumerate(spatial[2:], start=2) if k != col]
        fo, fi = sch.split(f, factors=[None, mr])
        sch.reorder(n, fo, *rows, x, *reduce, fi)
        n_red = len(reduce)
        for part, lp in zip(("main", "tail"), sch.loop_partition(x, [width // xt * xt, None])):
            block = sch.get_child_blocks(lp)[0]
            # loops inside the partition's scope: column, reductions, channel tile
            inner = sch.get_loops(block)[-(n_red + 2):]
            cols, red, ch = inner[0], inner[1:-1], inner[-1]
            if part == "main":
                xo, xi = sch.split(cols, factors=[None, xt])
                sch.reorder(xo, *red, ch, xi)
            else:  # a loop not starting at 0 cannot be split: the tail is one tile
                xi = cols
                sch.reorder(*red, ch, xi)
            sch.unroll(ch)
            sch.vectorize(xi)
            init = sch.decompose_reduction(block, red[0])
            sch.vectorize(sch.get_loops(init)[-1])
        tile = sch.fuse(n, fo, *rows)
        if parallel:
            sch.parallel(tile)
        remaining = [c for c in axes.consumers[:-1] if not _try(sch.compute_inline, c)]
        for block in remaining + axes.consumers[-1:] + axes.producers:
            parallelize_spatial(sch, block, lanes, parallel=parallel)
