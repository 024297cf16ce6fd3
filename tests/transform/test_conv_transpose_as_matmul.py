"""ConvTransposeAsMatmul: kernel-equals-stride transposed convolutions as matmul +
depth-to-space; numerics equal TVM's own legalization; other variants left to TVM."""

import numpy as np
import pytest
import tvm
from tvm import relax

from relax_memplan.pipeline import backend_phases, get_pipeline
from relax_memplan.schedules import host_target
from relax_memplan.transform.conv_transpose_as_matmul import ConvTransposeAsMatmul
from tests.conftest import relax_ops


def _module(shape=(1, 6, 5, 7), out_channels=4, kernel=2, stride=2, padding=0,
            output_padding=0, groups=1, epilogue=True):
    x = relax.Var("x", relax.TensorType(list(shape), "float32"))
    w = relax.Var("w", relax.TensorType([shape[1], out_channels // groups, kernel, kernel],
                                        "float32"))
    b = relax.Var("b", relax.TensorType([1, out_channels, 1, 1], "float32"))
    bb = relax.BlockBuilder()
    with bb.function("main", [x, w, b]):
        with bb.dataflow():
            y = bb.emit(relax.op.nn.conv2d_transpose(
                x, w, strides=stride, padding=padding, output_padding=output_padding,
                groups=groups))
            if epilogue:  # ppocrv4-det's head: bias then sigmoid
                y = bb.emit(relax.op.sigmoid(relax.op.add(y, b)))
            out = bb.emit_output(y)
        bb.emit_func_output(out)
    return bb.get()


def _run(mod, schedule, arrays):
    target = host_target() if schedule else tvm.target.Target("llvm")
    ex = tvm.compile(mod, target, relax_pipeline=get_pipeline(target, schedule=schedule))
    vm = relax.VirtualMachine(ex, tvm.cpu())
    return vm["main"](*[tvm.runtime.tensor(a) for a in arrays]).numpy()


def _arrays(mod, seed=0):
    rng = np.random.default_rng(seed)
    return [rng.standard_normal([int(d) for d in p.ty.shape], dtype="float32")
            for p in mod["main"].params]


@pytest.mark.parametrize("shape, out_channels, stride", [((1, 6, 5, 7), 4, 2),
                                                         ((2, 3, 4, 4), 5, 3),
                                                         ((1, 24, 8, 8), 24, 2)])
def test_kernel_equals_stride_becomes_matmul_and_matches_tvm(shape, out_channels, stride):
    mod = _module(shape, out_channels, kernel=stride, stride=stride)
    pass_ = ConvTransposeAsMatmul()
    rewritten = pass_(mod)
    assert pass_.rewritten == 1
    assert "relax.nn.conv2d_transpose" not in relax_ops(rewritten)
    assert "relax.matmul" in relax_ops(rewritten)
    arrays = _arrays(mod)
    want = _run(mod, False, arrays)  # TVM's legalization (dilate, pad, conv)
    got = _run(mod, True, arrays)  # our pipeline: this pass, then our schedules
    assert got.shape == want.shape
    np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-5)


def test_check_catches_a_wrong_depth_to_space():
    """The comparison above can fail: the same rewrite with the two sub-pixel axes swapped
    (``(N, O, H, sw, W, sh)``) gives other numbers."""
    mod = _module((1, 6, 5, 7), 4, kernel=2, stride=2, epilogue=False)
    arrays = _arrays(mod)
    want = _run(mod, False, arrays)
    x, w = arrays[0], arrays[1]
    n, c, h, wd = x.shape
    o = w.shape[1]
    y = np.transpose(w, (1, 2, 3, 0)).reshape(o * 4, c) @ x.reshape(n, c, h * wd)
    right = y.reshape(n, o, 2, 2, h, wd).transpose(0, 1, 4, 2, 5, 3).reshape(want.shape)
    wrong = y.reshape(n, o, 2, 2, h, wd).transpose(0, 1, 4, 3, 5, 2).reshape(want.shape)
    np.testing.assert_allclose(right, want, rtol=1e-5, atol=1e-5)
    assert not np.allclose(wrong, want, rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("kwargs", [dict(kernel=3, stride=2),  # overlapping windows
                                    dict(kernel=2, stride=2, padding=1),
                                    dict(kernel=2, stride=2, output_padding=1),
                                    dict(kernel=2, stride=2, out_channels=4, groups=2)])
def test_other_transposed_convolutions_are_left_to_tvm(kwargs):
    kwargs.setdefault("out_channels", 4)
    mod = _module((1, 6, 5, 7), **kwargs)
    pass_ = ConvTransposeAsMatmul()
    assert "relax.nn.conv2d_transpose" in relax_ops(pass_(mod)) and pass_.rewritten == 0


def test_runs_before_legalize_in_scheduled_llvm_builds_only():
    def names(schedule):
        legalize = dict(backend_phases(tvm.target.Target("llvm"), schedule=schedule))["legalize"]
        return [p.info.name for p in legalize]

    assert names(True).index("ConvTransposeAsMatmul") < names(True).index("LegalizeOps")
    assert "ConvTransposeAsMatmul" not in names(False)
