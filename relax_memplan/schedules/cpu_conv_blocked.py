"""Dlight-style CPU (llvm) schedule rule: convolutions with output channels in the vector lanes.

Where it runs
-------------
After ``FuseTIR`` (see :func:`relax_memplan.schedules.cpu_schedule_pass`), first of the CPU
rules, on the PrimFuncs :class:`~relax_memplan.schedules.DirectConv` also takes
(:func:`~relax_memplan.schedules.conv_match.match_conv`: a padding block, one reduction block
``out[n, f, y, x] += pad[n, c, y * sh + ry * dh, x * sw + rx * dw] * w[f, c, ry, rx]``, an
element-wise epilogue; constant extents). It declines grouped and depthwise convolutions
(the input channel read depends on the output channel) and output channel counts that are
not a multiple of the SIMD width; :class:`~relax_memplan.schedules.DirectConv` takes those.

Algorithm
---------
The register blocking of NCHWc direct convolutions (Georganas et al., "Anatomy of
high-performance deep learning convolutions on SIMD architectures", SC 2018; TVM TOPI's
``conv2d_NCHWc`` x86 schedule; oneDNN's and MLAS's NCHWc kernels), without the layout change
of the feature maps: the register tile is ``ocv`` vectors of output channels (``ocv * lanes``
channels) times a box of ``yt x xt`` output pixels. Per reduction step ``(ry, rx, c)`` the
kernel loads ``ocv`` weight vectors, broadcasts the ``yt * xt`` input values (scalars read
from the NCHW input, any stride) and issues ``ocv * yt * xt`` fused multiply-adds into
accumulators that stay in registers for the whole reduction. Unlike
:class:`~relax_memplan.schedules.DirectConv` (output columns in the lanes) every lane is used
whatever the width of the map (ResNet's 7x7 and 14x14 maps fill 7/16 and 14/16 of an
AVX-512 vector there).

* The weights are read in the layout ``(f // (ocv * lanes), ry, rx, c, f % (ocv * lanes))``,
  contiguous along the reduction: given to a constant weight at compile time
  (``layout_free_buffers``, the layout-rewrite block of
  :mod:`relax_memplan.schedules.prepack`), else copied once per call.
* The reduction runs ``(ry, rx)`` outside ``c``: with ``rx`` innermost LLVM unrolls it and
  keeps the input values shared by neighbouring ``rx`` in registers, and the accumulators
  spill (one thread, znver5, 3x3 64 -> 64 channels on 56x56: 68 -> 115 GMAC/s).
* The accumulators live in a ``local`` buffer laid out ``(n, y, x, f)`` (``cache_write`` +
  ``transform_layout``), so the channel loop indexes it contiguously and LLVM keeps it in
  registers; the write-back stores each channel's row of pixels into the NCHW output
  with the epilogue (bias, activation, residual add) inlined
  (``reverse_compute_inline``).
* The tiles ``(n, channel block, pixel box)`` are fused into one parallel loop (serial below
  ``min_parallel_macs`` multiply-adds); the padding block stays a parallel copy.

The tile: ``ocv * yt * xt`` accumulators plus ``ocv`` weight registers and one broadcast
register must fit the register file (32 vector registers with AVX-512, else 16); among the
tiles whose ``yt``/``xt`` divide the output map, the most accumulators win, then the most
channel vectors (fewer broadcasts per multiply-add).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import List, Optional

import tvm
from tvm import s_tir, tirx
from tvm.s_tir.dlight import ScheduleRule
from tvm.target import Target

from .conv_match import ConvAxes, _uses, match_conv
from .cpu_conv import _column_stride
from .cpu_matmul import _try, simd_lanes
from .cpu_spatial import parallelize_spatial
from .prepack import PREPROC_ANNOTATION, _is_layout_free_param
from tvm.target.codegen import llvm_cpu_has_features

__all__ = ["ChannelBlockedConv", "ChannelTile"]

_ScheduleError = s_tir.ScheduleError


@dataclass(frozen=True)
class ChannelTile:
    """The register tile of :class:`ChannelBlockedConv`.

    Attributes
    ----------
    channel_vectors : int
        Output channels per tile, in SIMD vectors (``ocv``).
    rows, columns : int
        Output pixels per tile: ``rows`` (``yt``) output rows of ``columns`` (``xt``) pixels.
    """

    channel_vectors: int
    rows: int
    columns: int

    @property
    def accumulators(self) -> int:
        return self.channel_vectors * self.rows * self.columns


def vector_registers(target: Target) -> int:
    """Vector registers of an llvm target: 32 with AVX-512, else 16."""
    try:
        return 32 if llvm_cpu_has_features("avx512f", target) else 16
    except Exception:  # noqa: BLE001 -- non-x86 triples lack the feature name
        return 16


def column_lane_use(width: int, lanes: int) -> float:
    """Fraction of the vector lanes a tile of output columns keeps busy on a ``width``-wide
    output (:class:`~relax_memplan.schedules.DirectConv`'s orientation): whole vectors with a
    last one partly filled."""
    return width / (-(-width // lanes) * lanes)


def _divisors(n: int) -> List[int]:
    return [d for d in range(1, n + 1) if n % d == 0]


def choose_tile(channels: int, height: int, width: int, lanes: int, registers: int,
                channel_vectors=(4, 3, 2, 1), max_pixels: int = 28) -> Optional[ChannelTile]:
    """The register tile for an output of ``channels x height x width``, or ``None``.

    Parameters
    ----------
    channels, height, width : int
        Output channels and output map (``height = 1`` for conv1d).
    lanes : int
        SIMD lanes of the element type.
    registers : int
        Vector registers of the target.
    channel_vectors : tuple of int
        ``ocv`` values to consider.
    max_pixels : int
        Most pixels in one tile.

    Returns
    -------
    ChannelTile or None
        ``None`` when ``channels`` is not a multiple of ``lanes``.
    """
    best = None
    for ocv in channel_vectors:
        if channels % (ocv * lanes):
            continue
        # accumulators + ocv weight vectors + one broadcast value in the register file
        pixels = min(max_pixels, (registers - 1 - ocv) // ocv)
        for rows in _divisors(height):
            for cols in _divisors(width):
                if rows * cols > pixels:
                    continue
                tile = ChannelTile(ocv, rows, cols)
                key = (tile.accumulators, ocv, cols)
                if best is None or key > best[0]:
                    best = (key, tile)
    return None if best is None else best[1]


class ChannelBlockedConv(ScheduleRule):
    """Convolution with output channels in the vector lanes (see the module docstring).

    Parameters
    ----------
    min_accumulators : int
        Fewest accumulators for the rule to apply (a map whose height and width have no
        divisors making a larger tile, e.g. squeezenet's 109 x 109): below it the tile is
        load-bound and :class:`~relax_memplan.schedules.DirectConv` is left the kernel.
    min_parallel_macs : int
        Fewest multiply-adds for the tile loop to be parallel (as DirectConv's).
    max_pixels : int
        Most output pixels per tile.
    min_lane_gain : float
        The kernel is declined (left to DirectConv's column tile, which stores its tile
        without a transpose) unless ``K * (1 / use - 1) >= min_lane_gain``, ``K`` the
        multiply-adds per output, ``use`` the fraction of lanes the column tile keeps busy
        (:func:`column_lane_use`): the transposing write-back costs about this many
        multiply-add instructions per output vector. One thread, znver5, ms, this rule /
        DirectConv: 1x1 16 -> 64 on 55x55 0.123 / 0.076 and 16 -> 32 on 160x160 0.608 /
        0.218 (declined), 3x3 32 -> 32 on 40x40 0.151 / 0.173 and 1x1 192 -> 128 on 20x20
        0.138 / 0.187 (taken).
    strided_lane_use : float
        ``use`` is multiplied by this for a column stride above 1 (DirectConv then reads a
        deinterleaved copy of its input): 3x3 stride 2, 16 -> 32 on 160x160 0.437 / 0.725 ms.
    matmul_below_pixels, min_pointwise_reduction : int
        A stride-1 1x1 convolution on fewer output pixels than ``matmul_below_pixels`` (which
        DirectConv leaves to StaticMatmul, :attr:`DirectConv.min_direct_1x1_pixels`) is taken
        without the lane test when it has at least ``min_pointwise_reduction`` input channels
        (:meth:`_left_to_matmul`).
    """

    def __init__(self, min_accumulators: int = 8, min_parallel_macs: int = 1 << 20,
                 max_pixels: int = 28, min_lane_gain: float = 22.0,
                 strided_lane_use: float = 0.67, matmul_below_pixels: int = 256,
                 min_pointwise_reduction: int = 16):
        self.min_accumulators = min_accumulators
        self.min_parallel_macs = min_parallel_macs
        self.max_pixels = max_pixels
        self.min_lane_gain = min_lane_gain
        self.strided_lane_use = strided_lane_use
        self.matmul_below_pixels = matmul_below_pixels
        self.min_pointwise_reduction = min_pointwise_reduction

    def is_target_available(self, target: Target) -> bool:
        return target is not None and target.kind.name == "llvm"

    def plan(self, sch: s_tir.Schedule, axes: ConvAxes, dtype: str,
             target: Target) -> Optional[ChannelTile]:
        """The tile for the matched convolution ``axes``, or ``None`` when the rule declines."""
        if axes.depthwise:
            return None
        lanes = simd_lanes(target, dtype)
        spatial = axes.spatial_extents
        height, width = (spatial[2], spatial[3]) if len(spatial) == 4 else (1, spatial[2])
        tile = choose_tile(spatial[1], height, width, lanes, vector_registers(target),
                           max_pixels=self.max_pixels)
        if tile is None or tile.accumulators < self.min_accumulators:
            return None
        per_output = 1
        for extent in axes.reduce_extents:
            per_output *= extent
        if self._left_to_matmul(axes, height * width):
            return tile if per_output >= self.min_pointwise_reduction else None
        use = column_lane_use(width, lanes)
        if _column_stride(sch, axes, len(axes.spatial_extents) - 1)[1] > 1:
            use *= self.strided_lane_use
        # multiply-adds per output the column tile wastes on idle lanes, against the cost of
        # the transposing write-back (in multiply-add instructions per output, x lanes)
        if per_output * (1.0 / use - 1.0) < self.min_lane_gain:
            return None
        return tile

    def _left_to_matmul(self, axes: ConvAxes, pixels: int) -> bool:
        """A stride-1 1x1 convolution on a map under ``matmul_below_pixels``: DirectConv leaves
        it to StaticMatmul, whose tile reads the input inside the parallel loop (the in-place
        rule then refuses the output over the input: the unscheduled kernel copies the input
        first) and ran slower than this rule's from 80 input channels (one thread, znver5,
        14x14 map: 80 -> 480 channels 0.104 vs 0.085 ms, 112 -> 672 0.198 vs 0.154 ms)."""
        return all(e == 1 for e in axes.reduce_extents[1:]) and pixels < self.matmul_below_pixels

    def apply(self, func: tirx.PrimFunc, target: Target, _tunable: bool):
        if not isinstance(func, tirx.PrimFunc) or not self.is_target_available(target):
            return None
        sch = s_tir.Schedule(func)
        try:
            axes = match_conv(sch)
        except ValueError:  # body is not a root block
            return None
        if axes is None:
            return None
        dtype = str(sch.get(axes.block).writes[0].source.dtype)
        tile = self.plan(sch, axes, dtype, target)
        if tile is None:
            return None
        try:
            self._schedule(sch, func, axes, tile, simd_lanes(target, dtype))
        except (_ScheduleError, tvm.error.InternalError):
            return None  # a primitive's check failed on an unusual variant: leave it
        return sch

    def _schedule(self, sch: s_tir.Schedule, func: tirx.PrimFunc, axes: ConvAxes,
                  tile: ChannelTile, lanes: int) -> None:
        block = axes.block
        conv1d = len(axes.spatial_extents) == 3
        macs = 1
        for extent in axes.spatial_extents + axes.reduce_extents:
            macs *= extent
        parallel = macs >= self.min_parallel_macs
        block_channels = tile.channel_vectors * lanes
        _weights_blocked(sch, func, axes, block_channels, conv1d, parallel, lanes)

        loops = sch.get_loops(block)
        if conv1d:
            n, f, x, rc, rx = loops
            reduce = [rx, rc]
        else:
            n, f, y, x, rc, ry, rx = loops
            reduce = [ry, rx, rc]
        fo, fv, fl = sch.split(f, factors=[None, tile.channel_vectors, lanes])
        xo, xi = sch.split(x, factors=[None, tile.columns])
        if conv1d:
            outer, pixels = [n, fo, xo], [xi]
        else:
            yo, yi = sch.split(y, factors=[None, tile.rows])
            outer, pixels = [n, fo, yo, xo], [yi, xi]
        sch.reorder(*outer, *reduce, *pixels, fv, fl)
        tiles = sch.fuse(*outer)
        if parallel:
            sch.parallel(tiles)

        write_back = sch.cache_write(block, 0, "local")
        # accumulators indexed contiguously along the channel lanes (registers, not memory)
        if conv1d:
            sch.transform_layout(block, ("write", 0), lambda n, f, x: (n, x, f))
        else:
            sch.transform_layout(block, ("write", 0), lambda n, f, y, x: (n, y, x, f))
        sch.reverse_compute_at(write_back, tiles, preserve_unit_loops=True)
        remaining = [c for c in axes.consumers[:-1] if not _try(sch.compute_inline, c)]
        remaining += axes.consumers[-1:]
        for consumer in remaining:
            if not _try(sch.reverse_compute_inline, consumer):
                parallelize_spatial(sch, consumer, lanes, parallel=parallel)
        for producer in axes.producers:  # padding: a parallel copy, no bounds test inside
            parallelize_spatial(sch, producer, lanes, parallel=parallel)
        # write-back: (.., f, [y,] x) below the tile loop; rows of pixels as vectors
        wb_loops = sch.get_loops(write_back)
        for lp in wb_loops[-(len(pixels) + 1):-1]:
            sch.unroll(lp)
        sch.vectorize(wb_loops[-1])
        for lp in pixels + [fv]:
            sch.unroll(lp)
        sch.vectorize(fl)
        init = sch.decompose_reduction(block, reduce[0])
        sch.vectorize(sch.get_loops(init)[-1])


def _weight_read(sch: s_tir.Schedule, axes: ConvAxes) -> int:
    """Index of the weight read of the convolution block (the one not indexed by ``x``)."""
    block = sch.get(axes.block)
    x_var = block.iter_vars[len(axes.spatial_extents) - 1].var
    return next(k for k, r in enumerate(block.reads)
                if not any(_uses(rng.min, x_var) for rng in r.region))


def _weights_blocked(sch: s_tir.Schedule, func: tirx.PrimFunc, axes: ConvAxes,
                     block_channels: int, conv1d: bool, parallel: bool, lanes: int) -> None:
    """Read the weights in the layout ``(f // b, [ry,] rx, c, f % b)``: prepacked at compile
    time for a constant (layout-free) weight, else copied per call at the root."""
    index = _weight_read(sch, axes)
    weight = sch.get(axes.block).reads[index].source
    packed = sch.cache_read(axes.block, index, "global")
    if _is_layout_free_param(func, weight):
        sch.annotate(packed, PREPROC_ANNOTATION, 1)
    if conv1d:
        layout = tirx.IndexMap.from_func(
            lambda f, c, rx: (f // block_channels, rx, c, f % block_channels), ndim=3)
    else:
        layout = tirx.IndexMap.from_func(
            lambda f, c, ry, rx: (f // block_channels, ry, rx, c, f % block_channels), ndim=4)
    sch.transform_layout(axes.block, ("read", index), layout)
    if not _is_layout_free_param(func, weight):
        parallelize_spatial(sch, packed, lanes, parallel=parallel)
