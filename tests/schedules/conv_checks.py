"""Checks run in a subprocess by test_cpu_conv.py (an out-of-bounds store of a scheduled
convolution then fails a test instead of killing pytest): convolutions built with and without
our CPU schedules give the same numbers."""

import numpy as np
import tvm
from tvm import relax

from relax_memplan.schedules import host_target

from tests.schedules.isolated_checks import build_and_run

# (label, in shape (N, C, *spatial), filters, kernel, stride, padding, dilation, groups, epilogue)
CASES = [
    ("3x3 s1 p1 bias relu", (1, 8, 9, 9), 16, 3, 1, 1, 1, 1, "relu"),
    ("3x3 s2 p1 7x7-out odd channels", (1, 5, 13, 13), 7, 3, 2, 1, 1, 1, "clip"),
    ("1x1 gemm-like", (2, 32, 14, 14), 24, 1, 1, 0, 1, 1, "silu"),
    ("depthwise 3x3 s2", (1, 12, 15, 15), 12, 3, 2, 1, 1, 12, "relu"),
    ("depthwise 3x3 wide rows", (1, 6, 40, 70), 6, 3, 1, 1, 1, 6, "clip"),
    ("grouped 3x3 dilated", (1, 8, 11, 11), 4, 3, 1, 2, 2, 2, "bias"),
    ("7x7 s2 p3 prime width", (1, 3, 37, 37), 10, 7, 2, 3, 1, 1, "relu"),
    ("conv1d k5 s1 p2", (1, 6, 50), 9, 5, 1, 2, 1, 1, "relu"),
    ("conv1d k3 s2 one output", (1, 16, 3), 32, 3, 2, 0, 1, 1, "bias"),
    ("conv1d depthwise", (2, 8, 33), 8, 3, 1, 1, 1, 8, "silu"),
    ("conv1d as conv2d over (length, 1)", (1, 16, 70, 1), 24, (5, 1), 1, 0, 1, 1, "relu"),
    # widths with no divisor of a full vector: full tiles plus a tail (loop_partition)
    ("7x7 s2 p0 37-wide (prime) bias relu", (1, 3, 79, 79), 8, 7, 2, 0, 1, 1, "relu"),
    ("3x3 s2 p1 38-wide silu", (1, 5, 9, 75), 12, 3, 2, 1, 1, 1, "silu"),
    ("depthwise 3x3 s1 41-wide", (1, 6, 5, 41), 6, 3, 1, 1, 1, 6, "clip"),
    ("conv1d as conv2d over (127, 1) s1", (1, 8, 131, 1), 12, (5, 1), 1, 0, 1, 1, "relu"),
    ("conv1d k3 s2 p1 53 outputs", (1, 4, 105), 6, 3, 2, 1, 1, 1, "bias"),
    ("squeeze-excitation 1x1 output times a 10x10 map", (1, 48, 1, 1), 192, 1, 1, 0, 1, 1,
     "se"),
    # 1x1 convolutions on maps whose width is no vector multiple: StaticMatmul's tile of whole
    # rows (12 wide: 48 = 4 rows on 16 lanes), one vector narrower than a register (14, 7),
    # or padded columns (27 wide)
    ("1x1 12x12 map whole-row tiles clip", (1, 20, 12, 12), 24, 1, 1, 0, 1, 1, "clip"),
    ("1x1 batch 2 14x14 map silu", (2, 16, 14, 14), 10, 1, 1, 0, 1, 1, "silu"),
    ("1x1 7x7 map odd channels", (1, 9, 7, 7), 13, 1, 1, 0, 1, 1, "relu"),
    ("1x1 27x27 map padded columns", (1, 8, 27, 27), 6, 1, 1, 0, 1, 1, "bias"),
    ("1x1 3x10 map rows of 10", (1, 12, 6, 10), 20, 1, 1, 0, 1, 1, "relu"),
    # widths whose tile would be an odd width above one vector: whole vectors plus a tail
    ("3x3 s1 p1 20-wide silu", (1, 8, 5, 20), 12, 3, 1, 1, 1, 1, "silu"),
    ("3x3 s2 p1 40 outputs, 24 channels", (1, 4, 6, 80), 24, 3, 2, 1, 1, 1, "relu"),
    ("3x3 s1 p1 54-wide", (1, 6, 4, 54), 16, 3, 1, 1, 1, 1, "clip"),
    # column-strided: input deinterleaved to (.., W % s, W // s), contiguous vector reads
    ("3x3 s2 p1 3-channel stem silu", (1, 3, 20, 64), 16, 3, 2, 1, 1, 1, "silu"),
    ("depthwise 3x3 s2 p0", (1, 8, 9, 64), 8, 3, 2, 0, 1, 8, "relu"),
    ("conv1d k3 s2 p0 64 long", (1, 4, 64), 8, 3, 2, 0, 1, 1, "relu"),
    ("5x5 s3 p2 47-wide", (1, 8, 11, 47), 8, 5, 3, 2, 1, 1, "bias"),
    ("3x3 s2 p1 16 channels silu", (1, 16, 10, 64), 24, 3, 2, 1, 1, 1, "silu"),
    ("3x3 s2 p0 63-wide (odd: not deinterleaved)", (1, 4, 9, 63), 8, 3, 2, 0, 1, 1, "relu"),
]


def conv_module(shape, filters, kernel, stride, padding, dilation, groups, epilogue):
    """Relax ``epilogue(conv(x, w) + b)`` with constant shapes (conv1d for 3-D inputs)."""
    dims = len(shape) - 2
    x = relax.Var("x", relax.TensorType(list(shape), "float32"))
    kernel = list(kernel) if isinstance(kernel, tuple) else [kernel] * dims
    w = relax.Var("w", relax.TensorType([filters, shape[1] // groups] + kernel, "float32"))
    b = relax.Var("b", relax.TensorType([1, filters] + [1] * dims, "float32"))
    params = [x, w, b]
    if epilogue == "se":  # ppocrv4-det's squeeze-excitation: hard-sigmoid(conv) * feature map
        params.append(relax.Var("m", relax.TensorType([shape[0], filters] + [10] * dims,
                                                      "float32")))
    conv = relax.op.nn.conv2d if dims == 2 else relax.op.nn.conv1d
    bb = relax.BlockBuilder()
    with bb.function("main", params):
        with bb.dataflow():
            y = bb.emit(conv(x, w, strides=stride, padding=padding, dilation=dilation,
                             groups=groups))
            y = bb.emit(relax.op.add(y, b))
            if epilogue == "relu":
                y = bb.emit(relax.op.nn.relu(y))
            elif epilogue == "clip":
                y = bb.emit(relax.op.clip(y, 0.0, 6.0))
            elif epilogue == "silu":
                y = bb.emit(relax.op.multiply(relax.op.sigmoid(y), y))
            elif epilogue == "se":
                y = bb.emit(relax.op.clip(relax.op.add(relax.op.multiply(y, relax.const(
                    0.1667, "float32")), relax.const(0.5, "float32")), 0.0, 1.0))
                y = bb.emit(relax.op.multiply(params[3], y))
            out = bb.emit_output(y)
        bb.emit_func_output(out)
    return bb.get()


def check_conv_cases(target_name):
    target = host_target() if target_name == "host" else tvm.target.Target("llvm")
    rng = np.random.default_rng(0)
    for label, shape, filters, kernel, stride, padding, dilation, groups, epi in CASES:
        mod = conv_module(shape, filters, kernel, stride, padding, dilation, groups, epi)
        params = mod["main"].params
        arrays = [rng.standard_normal([int(d) for d in p.ty.shape], dtype="float32")
                  for p in params]
        want = build_and_run(mod, target, False, arrays)
        for _ in range(2):  # repeated: heap damage often shows on a later allocation
            got = build_and_run(mod, target, True, arrays)
            np.testing.assert_allclose(got, want, rtol=1e-4, atol=1e-4, err_msg=label)
    print("CONV OK")


def check_inlined_pad_deinterleaved():
    """A stride-2 convolution reading its input parameter directly (the padding block
    inlined): DirectConv copies the input into the deinterleaved layout; the scheduled
    PrimFunc equals the unscheduled one."""
    from tvm import s_tir

    from relax_memplan.schedules import DirectConv

    mod = conv_module((1, 4, 9, 64), 8, 3, 2, 0, 1, 1, "relu")
    seq = tvm.transform.Sequential([relax.transform.LegalizeOps(),
                                    relax.transform.AnnotateTIROpPattern(),
                                    relax.transform.FuseOps(), relax.transform.FuseTIR()])
    (func,) = [f for _, f in seq(mod).functions_items() if isinstance(f, tvm.tirx.PrimFunc)]
    sch = s_tir.Schedule(func)
    sch.compute_inline(sch.get_sblock("pad_temp"))
    plain = sch.mod["main"]
    scheduled = DirectConv(min_parallel_macs=0, min_deinterleave_channels=0).apply(
        plain, host_target(), False).mod["main"]
    rng = np.random.default_rng(0)
    arrays = [rng.standard_normal([int(d) for d in p.shape], dtype="float32")
              for p in plain.params]  # the params are the buffers in TVM 0.27
    outs = []
    for f in (plain, scheduled):
        lib = tvm.compile(tvm.IRModule({"main": f.with_attr("global_symbol", "main")}),
                          target=host_target())
        args = [tvm.runtime.tensor(a) for a in arrays]
        args[-1] = tvm.runtime.tensor(np.zeros_like(arrays[-1]))
        lib["main"](*args)
        outs.append(args[-1].numpy())
    np.testing.assert_allclose(outs[1], outs[0], rtol=1e-4, atol=1e-4)
    print("deinterleaved copy ok")
