"""The conv-chain kernel with output channels in the vector lanes (register-blocked).

:func:`~relax_memplan.transform._conv_chain_kernel.conv_chain_kernel` builds this variant when
:func:`blocked_plan` accepts the pair: a dense producer and a dense or depthwise consumer whose
channel counts are multiples of the SIMD width. The computation is the same (per output-row
tile of the consumer, the intermediate rows it reads are computed into kernel-local buffers);
the schedule is the one of :class:`~relax_memplan.schedules.ChannelBlockedConv`:

* both convolutions keep a register tile of channel vectors x output pixels, the reduction
  ``(ry, rx, c)`` streaming through it; the weights are given in the blocked layout
  ``(f // b, ry, rx, c, f % b)`` (depthwise: ``(f // b, ry, rx, f % b)``) by the caller
  (:func:`pack_weight`, at compile time: they are constants);
* the two kernel-local buffers (the producer's rows, and the same after its epilogue and the
  consumer's zero padding) are laid out ``(n, c // lanes, y, x, c % lanes)``: the producer's
  tile is stored without a transpose, the padded copy is vectorized along the channels, and
  a depthwise consumer reads one contiguous vector of channels per tap;
* the consumer's tile is written back to the NCHW output with its epilogue inlined.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Optional

import numpy as np
from tvm import s_tir, te

from ..schedules.cpu_conv_blocked import ChannelTile, choose_tile
from .fast_bounded_math import fast_sigmoid

__all__ = ["BlockedPlan", "blocked_plan", "pack_weight", "blocked_compute", "blocked_schedule"]


@dataclass(frozen=True)
class BlockedPlan:
    """Register tiles of the two convolutions.

    Attributes
    ----------
    lanes : int
        SIMD lanes (the channel block of the kernel-local buffers).
    producer, consumer : ChannelTile
        The tiles (channel vectors, 1 row, columns).
    depthwise : bool
        The consumer has one input channel per output channel.
    """

    lanes: int
    producer: ChannelTile
    consumer: ChannelTile
    depthwise: bool

    @property
    def producer_block(self) -> int:
        return self.producer.channel_vectors * self.lanes

    @property
    def consumer_block(self) -> int:
        return self.consumer.channel_vectors * self.lanes


def blocked_plan(a, b, lanes: int, registers: int) -> Optional[BlockedPlan]:
    """The tiles for producer ``a`` and consumer ``b`` (``ConvSpec``), or ``None`` when the
    blocked kernel does not apply (grouped producer, grouped-not-depthwise consumer, channel
    counts not multiples of ``lanes``, no tile of at least 4 accumulators)."""
    depthwise = b.groups == b.in_channels == b.out_channels
    if a.groups != 1 or not (depthwise or b.groups == 1) or lanes < 4:
        return None
    if a.out_channels % lanes or b.out_channels % lanes:
        return None
    producer = choose_tile(a.out_channels, 1, a.out_hw[1], lanes, registers)
    # a depthwise tap loads one input vector per accumulator (no broadcast shared by the
    # channel vectors): at most 2 channel vectors
    consumer = choose_tile(b.out_channels, 1, b.out_hw[1], lanes, registers,
                           channel_vectors=(2, 1) if depthwise else (4, 3, 2, 1))
    if producer is None or consumer is None or min(producer.accumulators,
                                                   consumer.accumulators) < 4:
        return None
    return BlockedPlan(lanes, producer, consumer, depthwise)


def pack_weight(weight: np.ndarray, block: int, depthwise: bool = False) -> np.ndarray:
    """``weight`` (OIHW) in the blocked layout ``(O // block, H, W, I, block)``, or
    ``(O // block, H, W, block)`` for a depthwise weight (``I == 1``)."""
    out_ch, in_ch, kh, kw = weight.shape
    blocked = weight.reshape(out_ch // block, block, in_ch, kh, kw).transpose(0, 3, 4, 2, 1)
    if depthwise:
        blocked = blocked[:, :, :, 0, :]
    return np.ascontiguousarray(blocked)


def _epilogue(steps, arrays, tensor, apply, name):
    """``steps`` applied to ``tensor`` (NCHW), one TE stage per step (inlined by the schedule);
    ``sigmoid`` and ``silu`` through :func:`~relax_memplan.transform.fast_bounded_math.
    fast_sigmoid`, as our scheduled builds compute them elsewhere (LLVM gives a vector
    ``exp`` one libm call per lane: efficientnet-b0's first chain 7.8 ms with it)."""
    arrays = iter(arrays)
    for k, step in enumerate(steps):
        array = [next(arrays)] if step.kind in ("add", "mul") else []
        tensor = _stage(step, array, tensor, apply, f"{name}{k}")
    return tensor


def _stage(step, array, tensor, apply, name):
    """One epilogue step as a TE stage (a function, so that the lambdas bind their own
    values: TE's ``compute`` refuses default arguments)."""
    if step.kind in ("sigmoid", "silu"):
        sig = fast_sigmoid(tensor)
        if step.kind == "sigmoid":
            return sig
        return te.compute(tensor.shape, lambda *i: tensor(*i) * sig(*i), name=name)
    return te.compute(tensor.shape, lambda n, c, y, x: apply(
        [step], array, tensor[n, c, y, x], c, tensor.dtype), name=name)


def blocked_compute(batch, a, a_steps, b, b_steps, dtype, plan: BlockedPlan, parts):
    """The TE tensors ``[x, w_a, e_a.., w_b, e_b.., out]``; ``parts`` gives the helpers of the
    generic kernel (``apply``, ``arrays``, ``x_at``, ``padded``), so that both variants compute
    alike."""
    apply, arrays = parts["apply"], parts["arrays"]
    ba, bb = plan.producer_block, plan.consumer_block
    x = te.placeholder((batch, a.in_channels) + tuple(a.in_hw), dtype, name="x")
    wa = te.placeholder((a.out_channels // ba,) + tuple(a.kernel) + (a.in_channels, ba), dtype,
                        name="w_a")
    ea = arrays(a_steps, a.out_channels, dtype, "e_a")
    if plan.depthwise:
        wb = te.placeholder((b.out_channels // bb,) + tuple(b.kernel) + (bb,), dtype, name="w_b")
    else:
        wb = te.placeholder((b.out_channels // bb,) + tuple(b.kernel) + (b.in_channels, bb),
                            dtype, name="w_b")
    eb = arrays(b_steps, b.out_channels, dtype, "e_b")
    x_at = parts["x_at"](x, a)
    (ha, wa_), (sa_h, sa_w) = a.out_hw, a.stride
    ry = te.reduce_axis((0, a.kernel[0]), name="ry")
    rx = te.reduce_axis((0, a.kernel[1]), name="rx")
    rc = te.reduce_axis((0, a.in_channels), name="rc")
    prod = te.compute((batch, a.out_channels, ha, wa_), lambda n, c, y, xx: te.sum(
        x_at(n, rc, y * sa_h + ry, xx * sa_w + rx) * wa[c // ba, ry, rx, rc, c % ba],
        axis=[ry, rx, rc]), name="producer")
    pad = parts["padded"](_epilogue(a_steps, ea, prod, apply, "epilogue_a"), a, b, [], [])
    (hb, wb_), (sb_h, sb_w) = b.out_hw, b.stride
    qy = te.reduce_axis((0, b.kernel[0]), name="qy")
    qx = te.reduce_axis((0, b.kernel[1]), name="qx")
    if plan.depthwise:
        cons = te.compute((batch, b.out_channels, hb, wb_), lambda n, f, y, xx: te.sum(
            pad[n, f, y * sb_h + qy, xx * sb_w + qx] * wb[f // bb, qy, qx, f % bb],
            axis=[qy, qx]), name="consumer")
    else:
        qc = te.reduce_axis((0, b.in_channels), name="qc")
        cons = te.compute((batch, b.out_channels, hb, wb_), lambda n, f, y, xx: te.sum(
            pad[n, qc, y * sb_h + qy, xx * sb_w + qx] * wb[f // bb, qy, qx, qc, f % bb],
            axis=[qy, qx, qc]), name="consumer")
    last = _epilogue(b_steps, eb, cons, apply, "epilogue_b")
    out = te.compute(cons.shape, lambda *i: last(*i), name="out")
    return [x, wa] + ea + [wb] + eb + [out]


def _channels_blocked(sch: s_tir.Schedule, block, lanes: int) -> None:
    sch.transform_layout(block, ("write", 0),
                         lambda n, c, y, x: (n, c // lanes, y, x, c % lanes))


def _tile(sch: s_tir.Schedule, block, loops, tile: ChannelTile, lanes: int):
    """Register tile on ``loops`` = (channel, row, column, reductions..) of ``block``; returns
    the write-back block (accumulators in a ``local`` buffer, channels innermost)."""
    c, y, x, *red = loops
    co, cv, cl = sch.split(c, factors=[None, tile.channel_vectors, lanes])
    xo, xi = sch.split(x, factors=[None, tile.columns])
    sch.reorder(co, y, xo, *red, xi, cv, cl)
    write_back = sch.cache_write(block, 0, "local")
    sch.reverse_compute_at(write_back, xo, preserve_unit_loops=True)
    sch.unroll(xi)
    sch.unroll(cv)
    sch.vectorize(cl)
    init = sch.decompose_reduction(block, red[0])
    sch.vectorize(sch.get_loops(init)[-1])
    return write_back


def blocked_schedule(func, tile_rows: int, plan: BlockedPlan):
    """Schedule :func:`blocked_compute`'s PrimFunc (see the module docstring)."""
    lanes = plan.lanes
    sch = s_tir.Schedule(func)
    main = ("producer", "producer_padded", "consumer", "out")
    for block in sch.get_child_blocks(sch.get_sblock("root")):
        if sch.get(block).name_hint not in main:  # epilogue stages
            sch.compute_inline(block)
    prod, pad = sch.get_sblock("producer"), sch.get_sblock("producer_padded")
    cons, out = sch.get_sblock("consumer"), sch.get_sblock("out")
    _channels_blocked(sch, prod, lanes)
    _channels_blocked(sch, pad, lanes)
    n, f, y, x, *red = sch.get_loops(cons)
    yo, yi = sch.split(y, [None, tile_rows])
    sch.reorder(n, yo, f, yi, x, *red)
    outer = sch.fuse(n, yo)
    sch.parallel(outer)
    f, yi, x, *red = sch.get_loops(cons)[1:]
    sch.reorder(f, yi, x, *red)
    # consumer: accumulators (n, y, x, f) so that the channel lanes are contiguous
    co, cv, cl = sch.split(f, factors=[None, plan.consumer.channel_vectors, lanes])
    xo, xi = sch.split(x, factors=[None, plan.consumer.columns])
    sch.reorder(co, yi, xo, *red, xi, cv, cl)
    write_back = sch.cache_write(cons, 0, "local")
    sch.transform_layout(cons, ("write", 0), lambda n, f, y, x: (n, y, x, f))
    sch.reverse_compute_at(write_back, xo, preserve_unit_loops=True)
    sch.reverse_compute_inline(out)
    sch.unroll(xi)
    sch.unroll(cv)
    sch.vectorize(cl)
    init = sch.decompose_reduction(cons, red[0])
    sch.vectorize(sch.get_loops(init)[-1])
    wb_loops = sch.get_loops(write_back)
    sch.vectorize(wb_loops[-1])
    # the intermediate rows of the tile, then the producer's register tile
    sch.compute_at(pad, outer, preserve_unit_loops=True)
    sch.compute_at(prod, outer, preserve_unit_loops=True)
    _n, pc, py, px = sch.get_loops(pad)[1:5]
    pco, pcl = sch.split(pc, factors=[None, lanes])
    sch.reorder(pco, py, px, pcl)
    sch.vectorize(pcl)
    loops = sch.get_loops(prod)[2:]  # below (outer, n): c, y, x, ry, rx, rc
    write_back = _tile(sch, prod, loops, plan.producer, lanes)
    sch.vectorize(sch.get_loops(write_back)[-1])
    return sch.mod["main"]
