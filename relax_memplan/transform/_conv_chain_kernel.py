"""The kernel of :class:`~relax_memplan.transform.fuse_conv_chain.FuseConvChain`.

One PrimFunc computes ``consumer_epilogue(conv_b(pad(producer_epilogue(conv_a(x)))))`` for an
NCHW batch, ``conv_b`` having a stride >= 2 (the tensor between the two convolutions is never
stored whole). Written as a TE compute (four blocks: ``producer`` = conv_a, ``producer_padded``
= its epilogue with conv_b's zero padding, ``consumer`` = conv_b, ``out`` = its epilogue) and
scheduled with :mod:`tvm.s_tir` primitives, as Halide/TVM ``compute_at`` does:

* the output rows are split into tiles of ``tile_rows`` rows; ``(batch, row tile)`` is one
  parallel loop (the consumer's kernel height must be >= its row stride: tiles that skip
  intermediate rows make a loop binding TVM's schedule primitives refuse);
* ``producer`` and ``producer_padded`` are computed at that loop (``compute_at``): per tile
  only the ``(tile_rows - 1) * stride + kernel_h`` rows of the intermediate the tile reads, all
  its channels and columns. TVM's lowering (``CompactBufferAllocation``) shrinks the two
  intermediates to that region; these kernel-local buffers are allocated per parallel
  iteration by ``TVMBackendAllocWorkspace`` (TVM's CPU workspace pool: they exceed its stack
  limit; checked in the LLVM IR of mobilenetv2's first site), the consumer's accumulator of
  ``tile_rows`` output rows on the stack; :func:`scratch_bytes` gives their size;
* the innermost loop of each block runs over output columns, vectorized when the SIMD width
  divides it; the epilogue ``out`` is computed per (tile, output channel) from the
  ``consumer`` rows just accumulated.

That is the generic kernel (any channel counts and groups). A pair whose channel counts are
multiples of the SIMD width, with a dense producer and a dense or depthwise consumer, gets
the register-blocked variant of :mod:`~relax_memplan.transform._conv_chain_blocked` instead
(``plan``), 5-10x faster (one thread, znver5: yolov8n's stem pair 8.2 -> 0.74 ms,
efficientnet-b0's 40 -> 240 channel 5x5 pair 2.6 -> 0.22 ms).

Rows of the intermediate shared by two tiles are computed twice (recompute at tile borders):
a tile computes ``(tile_rows - 1) * stride + kernel_h`` rows for ``tile_rows * stride`` new
ones, :func:`recompute_factor`.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Optional, Sequence, Tuple

import tvm
from tvm import s_tir, te, tirx

from ._conv_chain_blocked import BlockedPlan, blocked_compute, blocked_schedule

__all__ = ["ConvSpec", "EpilogueStep", "conv_chain_kernel", "scratch_bytes",
           "recompute_factor", "tile_rows_of", "EPILOGUE_KINDS"]

#: Epilogue steps: ``add``/``mul`` a per-channel array (``(C,)`` argument), ``add_scalar``/
#: ``mul_scalar``/``max``/``min`` a scalar, ``relu``, ``sigmoid``, ``silu`` (``x * sigmoid(x)``).
EPILOGUE_KINDS = ("add", "mul", "add_scalar", "mul_scalar", "max", "min", "relu", "sigmoid",
                  "silu")


@dataclass(frozen=True)
class ConvSpec:
    """A 2-d NCHW/OIHW convolution with dilation 1. Sizes in elements.

    ``padding`` is (top, left, bottom, right); ``groups`` divides both channel counts.
    """

    in_channels: int
    out_channels: int
    in_hw: Tuple[int, int]
    kernel: Tuple[int, int]
    stride: Tuple[int, int]
    padding: Tuple[int, int, int, int]
    groups: int

    @property
    def out_hw(self) -> Tuple[int, int]:
        (h, w), (kh, kw), (sh, sw) = self.in_hw, self.kernel, self.stride
        top, left, bottom, right = self.padding
        return (h + top + bottom - kh) // sh + 1, (w + left + right - kw) // sw + 1


@dataclass(frozen=True)
class EpilogueStep:
    """One elementwise step after a convolution: ``kind`` (:data:`EPILOGUE_KINDS`) and its
    scalar ``value`` (``add_scalar``, ``mul_scalar``, ``max``, ``min``); ``add``/``mul`` read
    the next per-channel argument."""

    kind: str
    value: Optional[float] = None


def _apply(steps: Sequence[EpilogueStep], arrays, value, channel, dtype):
    arrays = iter(arrays)
    for step in steps:
        if step.kind == "add":
            value = value + next(arrays)[channel]
        elif step.kind == "mul":
            value = value * next(arrays)[channel]
        elif step.kind == "add_scalar":
            value = value + tirx.const(step.value, dtype)
        elif step.kind == "mul_scalar":
            value = value * tirx.const(step.value, dtype)
        elif step.kind == "max":
            value = tvm.tirx.max(value, tirx.const(step.value, dtype))
        elif step.kind == "min":
            value = tvm.tirx.min(value, tirx.const(step.value, dtype))
        elif step.kind == "relu":
            value = tvm.tirx.max(value, tirx.const(0, dtype))
        elif step.kind == "sigmoid":
            value = tvm.tirx.sigmoid(value)
        elif step.kind == "silu":
            value = value * tvm.tirx.sigmoid(value)
        else:
            raise ValueError(f"unknown epilogue step {step.kind!r}")
    return value


def _arrays(steps, channels, dtype, prefix):
    return [te.placeholder((channels,), dtype, name=f"{prefix}{k}")
            for k, s in enumerate(steps) if s.kind in ("add", "mul")]


def _conv(data_at, weight, spec: ConvSpec, shape, name):
    """``sum data_at(b, c_in, y * sh + ry, x * sw + rx) * weight[f, rc, ry, rx]``."""
    cin_g = spec.in_channels // spec.groups
    cout_g = spec.out_channels // spec.groups
    rc = te.reduce_axis((0, cin_g), name="rc")
    ry = te.reduce_axis((0, spec.kernel[0]), name="ry")
    rx = te.reduce_axis((0, spec.kernel[1]), name="rx")
    sh, sw = spec.stride
    return te.compute(shape, lambda b, f, y, x: te.sum(
        data_at(b, f // cout_g * cin_g + rc, y * sh + ry, x * sw + rx)
        * weight[f, rc, ry, rx], axis=[rc, ry, rx]), name=name)


def _input_at(x, a: ConvSpec):
    """``x`` read at padded coordinates of ``a`` (zero outside the input)."""
    (h0, w0), top, left = a.in_hw, a.padding[0], a.padding[1]
    zero = tirx.const(0, x.dtype)

    def x_at(n, c, y, xx):
        inside = tvm.tirx.all(y >= top, y < h0 + top, xx >= left, xx < w0 + left)
        return tvm.tirx.if_then_else(inside, x[n, c, y - top, xx - left], zero)
    return x_at


def _padded(prod, a: ConvSpec, b: ConvSpec, a_steps, ea):
    """``a``'s epilogue on ``prod``, with ``b``'s zero padding around it."""
    (ha, wa_), dtype = a.out_hw, prod.dtype
    btop, bleft, bbottom, bright = b.padding
    zero = tirx.const(0, dtype)

    def padded(n, c, y, xx):
        inside = tvm.tirx.all(y >= btop, y < ha + btop, xx >= bleft, xx < wa_ + bleft)
        yy = tvm.tirx.max(tvm.tirx.min(y - btop, ha - 1), 0)
        xc = tvm.tirx.max(tvm.tirx.min(xx - bleft, wa_ - 1), 0)
        return tvm.tirx.if_then_else(inside, _apply(a_steps, ea, prod[n, c, yy, xc], c, dtype),
                                     zero)

    return te.compute((prod.shape[0], a.out_channels, ha + btop + bbottom, wa_ + bleft + bright),
                      padded, name="producer_padded")


def _compute(batch, a: ConvSpec, a_steps, b: ConvSpec, b_steps, dtype):
    x = te.placeholder((batch, a.in_channels) + tuple(a.in_hw), dtype, name="x")
    wa = te.placeholder((a.out_channels, a.in_channels // a.groups) + tuple(a.kernel), dtype,
                        name="w_a")
    ea = _arrays(a_steps, a.out_channels, dtype, "e_a")
    wb = te.placeholder((b.out_channels, b.in_channels // b.groups) + tuple(b.kernel), dtype,
                        name="w_b")
    eb = _arrays(b_steps, b.out_channels, dtype, "e_b")
    ha, wa_ = a.out_hw
    prod = _conv(_input_at(x, a), wa, a, (batch, a.out_channels, ha, wa_), "producer")
    pad = _padded(prod, a, b, a_steps, ea)
    hb, wb_ = b.out_hw
    cons = _conv(lambda n, c, y, xx: pad[n, c, y, xx], wb, b,
                 (batch, b.out_channels, hb, wb_), "consumer")
    out = te.compute(cons.shape, lambda n, f, y, xx: _apply(b_steps, eb, cons[n, f, y, xx], f, dtype),
                     name="out")
    return [x, wa] + ea + [wb] + eb + [out]


_PARTS = {"apply": _apply, "arrays": _arrays, "x_at": _input_at, "padded": _padded}
"""The pieces :func:`~relax_memplan.transform._conv_chain_blocked.blocked_compute` shares."""


def _vectorize(sch, loop, lanes: int):
    """Vectorize ``loop`` by ``lanes`` where that divides it (whole when it is at most
    ``lanes``); left serial where TVM refuses (a tile cut by ``T.where`` at the last rows)."""
    extent = sch.get(loop).extent
    if not isinstance(extent, tirx.IntImm) or lanes <= 1:
        return
    try:
        if int(extent) % lanes == 0 and int(extent) > lanes:
            sch.vectorize(sch.split(loop, [None, lanes])[1])
        elif int(extent) <= lanes:
            sch.vectorize(loop)
    except s_tir.ScheduleError:
        pass


def _schedule(func, tile_rows: int, lanes: int):
    sch = s_tir.Schedule(func)
    cons = sch.get_sblock("consumer")
    n, f, y, x, rc, ry, rx = sch.get_loops(cons)
    yo, yi = sch.split(y, [None, tile_rows])
    sch.reorder(n, yo, f, yi, rc, ry, rx, x)
    outer = sch.fuse(n, yo)
    sch.reverse_compute_at(sch.get_sblock("out"), sch.get_loops(cons)[1])
    sch.compute_at(sch.get_sblock("producer_padded"), outer, preserve_unit_loops=True)
    sch.compute_at(sch.get_sblock("producer"), outer, preserve_unit_loops=True)
    sch.parallel(outer)
    prod = sch.get_sblock("producer")
    _, _, pc, py, px, prc, pry, prx = sch.get_loops(prod)
    sch.reorder(pc, py, prc, pry, prx, px)
    _vectorize(sch, px, lanes)
    sch.decompose_reduction(prod, prc)
    _vectorize(sch, sch.get_loops(sch.get_sblock("producer_padded"))[-1], lanes)
    _vectorize(sch, sch.get_loops(cons)[-1], lanes)
    sch.decompose_reduction(cons, sch.get_loops(cons)[3])
    _vectorize(sch, sch.get_loops(sch.get_sblock("out"))[-1], lanes)
    return sch.mod["main"]


def conv_chain_kernel(batch: int, a: ConvSpec, a_steps: Sequence[EpilogueStep], b: ConvSpec,
                      b_steps: Sequence[EpilogueStep], dtype: str = "float32",
                      tile_rows: int = 2, lanes: int = 4,
                      plan: Optional[BlockedPlan] = None) -> tirx.PrimFunc:
    """The scheduled CPU kernel (module docstring).

    Parameters
    ----------
    batch : int
        Batch size N.
    a, b : ConvSpec
        The producer convolution (any stride) and the consumer (``b.in_hw == a.out_hw``,
        ``b.in_channels == a.out_channels``).
    a_steps, b_steps : sequence of EpilogueStep
        Their elementwise epilogues, in order.
    dtype : str
        Element type of every argument.
    tile_rows : int
        Output rows per parallel iteration (>= 1; :func:`tile_rows_of` makes it divide the
        output height).
    lanes : int
        SIMD lanes of the inner loops (1: no vectorization).
    plan : BlockedPlan, optional
        From :func:`~relax_memplan.transform._conv_chain_blocked.blocked_plan`: the
        register-blocked variant, whose weights are given in the blocked layouts of
        :func:`~relax_memplan.transform._conv_chain_blocked.pack_weight`.

    Returns
    -------
    tvm.tirx.PrimFunc
        Arguments ``(x (N, Ca, H, W), w_a (Cb, Ca / ga, kh, kw), per-channel arrays of a's
        epilogue (Cb,), w_b (Co, Cb / gb, kh', kw'), arrays of b's epilogue (Co,), out
        (N, Co, H', W'))`` (with ``plan``, ``w_a`` and ``w_b`` blocked); marked
        ``tirx.is_scheduled``, ``tirx.noalias`` and opaque (``op_pattern`` 8) so that no
        schedule rule or FuseOps touches it.

    Raises
    ------
    ValueError
        ``tile_rows < 1`` or shapes that do not chain.
    """
    if tile_rows < 1:
        raise ValueError(f"tile_rows must be >= 1, got {tile_rows}")
    if tuple(b.in_hw) != tuple(a.out_hw) or b.in_channels != a.out_channels:
        raise ValueError(f"consumer input {b.in_channels}x{b.in_hw} is not the producer output "
                         f"{a.out_channels}x{a.out_hw}")
    if plan is not None:
        func = te.create_prim_func(blocked_compute(batch, a, a_steps, b, b_steps, dtype, plan,
                                                   _PARTS))
        func = blocked_schedule(func, tile_rows_of(b, tile_rows), plan)
    else:
        func = te.create_prim_func(_compute(batch, a, a_steps, b, b_steps, dtype))
        func = _schedule(func, tile_rows_of(b, tile_rows), lanes)
    return func.without_attr("global_symbol").with_attrs(
        {"tirx.is_scheduled": True, "tirx.noalias": True, "op_pattern": 8})


def tile_rows_of(b: ConvSpec, tile_rows: int) -> int:
    """Rows per tile used: the largest divisor of the output height that is <= ``tile_rows``
    (TVM refuses to parallelize a tile loop cut by a predicate at the last rows)."""
    rows = max(1, min(tile_rows, b.out_hw[0]))
    while b.out_hw[0] % rows:
        rows -= 1
    return rows


def scratch_bytes(a: ConvSpec, b: ConvSpec, tile_rows: int, dtype_bytes: int = 4) -> int:
    """Bytes of the kernel-local buffers of one parallel iteration (an upper bound: the
    padded copy may skip a last column the consumer never reads): the producer rows of a
    tile before and after padding, and one output channel's tile rows of the consumer."""
    tile = tile_rows_of(b, tile_rows)
    rows = (tile - 1) * b.stride[0] + b.kernel[0]
    padded_w = a.out_hw[1] + b.padding[1] + b.padding[3]
    per_row = a.out_channels * (a.out_hw[1] + padded_w)
    return dtype_bytes * (rows * per_row + tile * b.out_hw[1])


def recompute_factor(b: ConvSpec, tile_rows: int) -> float:
    """Producer rows computed per row of the intermediate (1.0: none recomputed), away from
    the image border: ``((tile_rows - 1) * stride + kernel_h) / (tile_rows * stride)``,
    at least 1."""
    tile = tile_rows_of(b, tile_rows)
    rows = (tile - 1) * b.stride[0] + b.kernel[0]
    return max(1.0, rows / (tile * b.stride[0]))
