"""Checks run in a subprocess by test_cpu_fallback.py (an out-of-bounds store then fails a
test instead of killing pytest): kernels left to :class:`SpatialFallback` (element-wise chains,
pooling, resize, transpose, concat; odd and tiny sizes) give the numbers of the unscheduled
build."""

import numpy as np
import tvm
from tvm import relax

from relax_memplan.schedules import host_target

from tests.schedules.conv_checks import conv_module
from tests.schedules.isolated_checks import build_and_run


def _module(shapes, body):
    params = [relax.Var(f"x{k}", relax.TensorType(list(s), "float32")) for k, s in enumerate(shapes)]
    bb = relax.BlockBuilder()
    with bb.function("main", params):
        with bb.dataflow():
            out = bb.emit_output(bb.emit(body(*params)))
        bb.emit_func_output(out)
    return bb.get()


def batch_norm_relu(shape):
    """Inference batch-norm then relu (five full-size intermediates when unscheduled)."""
    c = shape[1]

    def body(x, g, b, m, v):
        bn = relax.op.nn.batch_norm(x, g, b, m, v, axis=1, epsilon=1e-5, training=False)
        return relax.op.nn.relu(relax.TupleGetItem(bn, 0))
    return _module([shape, (c,), (c,), (c,), (c,)], body)


def shared_exp(shape):
    """``exp(x)`` read by two slices, then concatenated (ultraface's box decoding in small)."""
    half = shape[-1] // 2

    def body(x):
        e = relax.op.exp(x)
        lo = relax.op.strided_slice(e, axes=[2], begin=[0], end=[half])
        hi = relax.op.strided_slice(e, axes=[2], begin=[half], end=[shape[-1]])
        return relax.op.concat([relax.op.multiply(lo, relax.const(0.5, "float32")),
                                relax.op.add(hi, relax.const(1.0, "float32"))], axis=2)
    return _module([shape], body)


def concat_split_head(sizes=(20, 10), channels=82, split=64, rejoin=True):
    """Maps flattened, concatenated and split along channels (yolov8n's detection head); the
    two halves concatenated again (``rejoin``) or returned as a tuple."""
    def body(*xs):
        flat = [relax.op.reshape(x, (1, channels, n * n)) for x, n in zip(xs, sizes)]
        parts = relax.op.split(relax.op.concat(flat, axis=2), [split], axis=1)
        halves = [relax.op.multiply(relax.TupleGetItem(parts, 0), relax.const(2.0, "float32")),
                  relax.op.sigmoid(relax.TupleGetItem(parts, 1))]
        return relax.op.concat(halves, axis=1) if rejoin else relax.Tuple(halves)
    return _module([(1, channels, n, n) for n in sizes], body)


# (label, module)
CASES = [
    ("batch_norm relu 64x30x40", batch_norm_relu((1, 64, 30, 40))),
    ("batch_norm relu odd 5x7x9", batch_norm_relu((1, 5, 7, 9))),
    ("batch_norm relu wide 16x20x97", batch_norm_relu((1, 16, 20, 97))),
    ("max_pool 3x3 s2 odd", _module([(1, 24, 55, 55)],
                                    lambda x: relax.op.nn.max_pool2d(x, 3, 2, ceil_mode=True))),
    ("avg_pool 2x2 s2", _module([(1, 32, 40, 48)], lambda x: relax.op.nn.avg_pool2d(x, 2, 2))),
    ("resize nearest x2", _module([(1, 16, 20, 24)], lambda x: relax.op.image.resize2d(
        x, (40, 48), method="nearest_neighbor"))),
    ("transpose nchw->nhwc", _module([(1, 48, 33, 32)],
                                     lambda x: relax.op.permute_dims(x, [0, 2, 3, 1]))),
    ("concat channels", _module([(1, 24, 40, 40), (1, 40, 40, 40)],
                                lambda a, b: relax.op.concat([a, b], axis=1))),
    ("sigmoid mul tiny", _module([(3, 5)], lambda x: relax.op.multiply(relax.op.sigmoid(x), x))),
    ("add broadcast 1-d long", _module([(70000,), (1,)], lambda a, b: relax.op.add(a, b))),
    ("max_pool 5x5 s1 pad2 (yolov8n SPPF)", _module(
        [(1, 128, 10, 10)], lambda x: relax.op.nn.max_pool2d(x, 5, 1, padding=2))),
    ("exp read by two slices", shared_exp((1, 4420, 4))),
    # column reductions (magika's sums over the sequence axis): loops interchanged
    ("column sum 512x256 (magika)", _module([(1, 512, 256)],
                                            lambda x: relax.op.sum(x, axis=[1]))),
    ("column sum of squares odd 3x7x24", _module(
        [(3, 7, 24)], lambda x: relax.op.sum(relax.op.multiply(x, x), axis=[1]))),
    ("column sum keepdims 2x5x33", _module(
        [(2, 5, 33)], lambda x: relax.op.sum(x, axis=[1], keepdims=True))),
    ("column max over two axes 6x4x48", _module(
        [(6, 4, 48)], lambda x: relax.op.max(x, axis=[0, 1]))),
    ("concat of flattened maps read by a split", concat_split_head()),
    # transposes over more than a level-1 cache: tiled (vad-lstm's; an odd one by 8)
    ("transpose 1x64x256 -> 256x1x64 (vad-lstm)", _module(
        [(1, 64, 256)], lambda x: relax.op.permute_dims(x, [2, 0, 1]))),
    ("transpose odd 96x104 tiled by 8", _module(
        [(96, 104)], lambda x: relax.op.permute_dims(x, [1, 0]))),
    ("resize nearest x2 96x10x10 (ppocr)", _module([(1, 96, 10, 10)], lambda x: (
        relax.op.image.resize2d(x, (20, 20), method="nearest_neighbor")))),
    # 1x1 convolutions on a 1x1 map (ppocrv4-det's squeeze-excitation): vector partial sums
    ("dot conv 384->96 on 1x1 relu", conv_module((1, 384, 1, 1), 96, 1, 1, 0, 1, 1, "relu")),
    ("dot conv 96->384 on 1x1 se", conv_module((1, 96, 1, 1), 384, 1, 1, 0, 1, 1, "se")),
    ("dot conv 24->96 on 1x1 se (half vector)",
     conv_module((1, 24, 1, 1), 96, 1, 1, 0, 1, 1, "se")),
    ("dot conv 20->40 on 1x1 batch 2 (quarter vector)",
     conv_module((2, 20, 1, 1), 40, 1, 1, 0, 1, 1, "relu")),
    ("dot conv 18->33 on 1x1 (no vector width)",
     conv_module((1, 18, 1, 1), 33, 1, 1, 0, 1, 1, "relu")),
]


LEFT_ALONE = {"max_pool 5x5 s1 pad2 (yolov8n SPPF)", "transpose nchw->nhwc",
              "resize nearest x2", "resize nearest x2 96x10x10 (ppocr)"}
"""Labels of CASES the rule leaves unscheduled on purpose (LLVM vectorises them serial; a
transpose of a slab within a level-1 cache)."""


def check_fallback_cases(target_name):
    target = host_target() if target_name == "host" else tvm.target.Target("llvm")
    rng = np.random.default_rng(0)
    for label, mod in CASES:
        arrays = [rng.standard_normal([int(d) for d in p.ty.shape], dtype="float32")
                  for p in mod["main"].params]
        if label.startswith("batch_norm"):
            arrays[4] = np.abs(arrays[4]) + 0.1  # variance
        want = build_and_run(mod, target, False, arrays)
        for _ in range(2):  # repeated: heap damage often shows on a later allocation
            got = build_and_run(mod, target, True, arrays)
            np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-5, err_msg=label)
    print("FALLBACK OK")
