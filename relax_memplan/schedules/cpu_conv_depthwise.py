"""Dlight-style CPU (llvm) schedule rule: depthwise convolutions with channels in the lanes.

Where it runs
-------------
After ``FuseTIR`` (see :func:`relax_memplan.schedules.cpu_schedule_pass`), before
:class:`~relax_memplan.schedules.DirectConv`, on the depthwise convolutions ``match_conv``
finds (one input channel per output channel) whose output is narrower than ``max_width`` and
whose kernel has at least ``min_taps`` taps, or a column stride above 1, or whose output is
at most ``narrow_width`` wide: ConvNeXt's 7x7 and EfficientNet's 5x5 depthwise convolutions on
28-, 14- and 7-wide maps, strided ones, 3x3 ones on 7-wide maps. Elsewhere DirectConv (or
TVM's kernel) keeps them.

Algorithm
---------
With the output columns in the lanes (DirectConv's orientation), a 14-wide row is a vector
LLVM splits into 8 + 4 + 2 lanes: three instructions for each of the ``kh * kw`` taps of 14
outputs. Here the lanes hold 16 channels, as in NCHWc depthwise kernels (oneDNN, MLAS):

* per block of 16 channels (the parallel loop), the padding block is computed into a
  kernel-local buffer laid out ``(n, c // 16, y, x, c % 16)``: the one transpose of the input;
* the register tile is a box of output pixels, one vector of channels each; a tap loads the
  weight vector (the weights prepacked to ``(c // 16, ry, rx, 1, c % 16)`` at compile time,
  :mod:`relax_memplan.schedules.prepack`) and one input vector per pixel;
* the tile is written back to the NCHW output with the epilogue inlined (a transpose, as in
  :class:`~relax_memplan.schedules.ChannelBlockedConv`).

The two transposes cost about as much as the taps of a 3x3 kernel, so small kernels are left
to DirectConv where its vectors are full enough. One thread, znver5, ms, DirectConv / this
rule (weights copied per call in both): 7x7 384 channels on 14x14 0.267 / 0.071, 768 on 7x7
0.302 / 0.051, 192 on 28x28 0.257 / 0.120; 5x5 672 on 14x14 0.168 / 0.111, stride 2 to 7x7
0.102 / 0.047; 3x3 960 on 7x7 0.049 / 0.032, 3x3 stride 2 576 to 7x7 0.049 / 0.033; left:
3x3 384 on 14x14 0.045 / 0.045, 144 on 56x56 0.165 / 0.218.
"""

from __future__ import annotations

import tvm
from tvm import s_tir, tirx
from tvm.s_tir.dlight import ScheduleRule
from tvm.target import Target

from .conv_match import ConvAxes, match_conv
from .cpu_conv import _column_stride
from .cpu_conv_blocked import _weights_blocked, choose_tile, vector_registers
from .cpu_matmul import _try, simd_lanes
from .cpu_spatial import parallelize_spatial

__all__ = ["ChannelBlockedDepthwise"]

_ScheduleError = s_tir.ScheduleError


class ChannelBlockedDepthwise(ScheduleRule):
    """Depthwise convolution with channels in the vector lanes (module docstring).

    Parameters
    ----------
    min_taps : int
        Fewest kernel taps (``kh * kw``) for a stride-1 convolution wider than
        ``narrow_width``.
    max_width : int
        The output must be narrower (columns).
    narrow_width : int
        Outputs at most this wide are taken whatever the kernel.
    min_parallel_macs : int
        Fewest multiply-adds for the channel-block loop to be parallel.
    """

    def __init__(self, min_taps: int = 25, max_width: int = 32, narrow_width: int = 8,
                 min_parallel_macs: int = 1 << 18):
        self.min_taps = min_taps
        self.max_width = max_width
        self.narrow_width = narrow_width
        self.min_parallel_macs = min_parallel_macs

    def is_target_available(self, target: Target) -> bool:
        return target is not None and target.kind.name == "llvm"

    def _applies(self, sch, axes: ConvAxes, lanes: int) -> bool:
        spatial, reduce = axes.spatial_extents, axes.reduce_extents
        if len(spatial) != 4 or not axes.depthwise or reduce[0] != 1 or not axes.producers:
            return False
        if spatial[1] % lanes or spatial[3] >= self.max_width:
            return False
        strided = _column_stride(sch, axes, 3)[1] > 1
        return reduce[1] * reduce[2] >= self.min_taps or strided or \
            spatial[3] <= self.narrow_width

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
        lanes = simd_lanes(target, str(sch.get(axes.block).writes[0].source.dtype))
        if not self._applies(sch, axes, lanes):
            return None
        _n, channels, height, width = axes.spatial_extents
        tile = choose_tile(channels, height, width, lanes, vector_registers(target),
                           channel_vectors=(1,))
        if tile is None:
            return None
        try:
            self._schedule(sch, func, axes, tile, lanes)
        except (_ScheduleError, tvm.error.InternalError):
            return None  # a primitive's check failed on an unusual variant: leave it
        return sch

    def _schedule(self, sch, func, axes: ConvAxes, tile, lanes: int) -> None:
        block = axes.block
        macs = 1
        for extent in axes.spatial_extents + axes.reduce_extents:
            macs *= extent
        parallel = macs >= self.min_parallel_macs
        _weights_blocked(sch, func, axes, lanes, False, parallel, lanes)
        (pad,) = [p for p in axes.producers
                  if any(w.source.same_as(r.source) for w in sch.get(p).writes
                         for r in sch.get(block).reads)]
        sch.transform_layout(pad, ("write", 0),
                             lambda n, c, y, x: (n, c // lanes, y, x, c % lanes))
        n, f, y, x, rc, ry, rx = sch.get_loops(block)
        fo, fl = sch.split(f, factors=[None, lanes])
        yo, yi = sch.split(y, factors=[None, tile.rows])
        xo, xi = sch.split(x, factors=[None, tile.columns])
        sch.reorder(n, fo, yo, xo, rc, ry, rx, yi, xi, fl)
        blocks = sch.fuse(n, fo)
        if parallel:
            sch.parallel(blocks)
        write_back = sch.cache_write(block, 0, "local")
        sch.transform_layout(block, ("write", 0), lambda n, f, y, x: (n, y, x, f))
        sch.reverse_compute_at(write_back, xo, preserve_unit_loops=True)
        remaining = [c for c in axes.consumers[:-1] if not _try(sch.compute_inline, c)]
        remaining += axes.consumers[-1:]
        for consumer in remaining:
            if not _try(sch.reverse_compute_inline, consumer):
                parallelize_spatial(sch, consumer, lanes, parallel=parallel)
        # the channel block's padded rows, transposed once into the kernel-local buffer
        sch.compute_at(pad, blocks, preserve_unit_loops=True)
        pn, pc, py, px = sch.get_loops(pad)[1:5]
        pco, pcl = sch.split(pc, factors=[None, lanes])
        sch.reorder(pco, pn, py, px, pcl)
        sch.vectorize(pcl)
        wb_loops = sch.get_loops(write_back)
        for lp in wb_loops[-3:-1]:
            sch.unroll(lp)
        sch.vectorize(wb_loops[-1])
        sch.unroll(yi)
        sch.unroll(xi)
        sch.vectorize(fl)
        init = sch.decompose_reduction(block, rc)
        sch.vectorize(sch.get_loops(init)[-1])
        for other in axes.producers:
            if not sch.get(other).same_as(sch.get(pad)):
                parallelize_spatial(sch, other, lanes, parallel=parallel)
