"""Real models from ../shared/models imported with symbolic dims, compiled once with the
default Relax pipeline, and run at several shapes against onnxruntime.

Tolerance: max |tvm - ort| <= 1e-4 * max |ort| + 1e-5 per output.  ppocrv4-det and
yolov8n take ~25 s each to compile on 2 cores: marked slow.
"""

import warnings

import numpy as np
import pytest
import tvm
from tvm import relax

from relax_memplan.frontend import import_onnx, load_onnx, run_onnxruntime

from ...conftest import shared_model


def _ints(rng, shape, high=2, dtype=np.int64):
    return rng.integers(0, high, shape).astype(dtype)


def bert(rng, batch, seq):
    return {"input_ids": _ints(rng, (batch, seq)), "attention_mask": np.ones((batch, seq), np.int64),
            "token_type_ids": _ints(rng, (batch, seq))}


def gpt2(rng, batch, seq):
    return {"input_ids": _ints(rng, (batch, seq))}


def magika(rng, batch):
    return {"bytes": _ints(rng, (batch, 2048), 256, np.int32)}


def image(name):
    return lambda rng, h, w: {name: rng.standard_normal((1, 3, h, w)).astype(np.float32)}


def mobilenet(rng, batch):
    return {"x": rng.standard_normal((batch, 3, 96, 96)).astype(np.float32)}


def silero(rng, batch, seq):
    return {"input": rng.standard_normal((batch, seq)).astype(np.float32),
            "sr": np.array(16000, np.int64), "state": np.zeros((2, batch, 128), np.float32)}


CASES = [
    pytest.param("bert-tiny-randw.onnx", bert, [(1, 1), (2, 16), (1, 77), (2, 128)],
                 ["batch", "seq"], id="bert"),
    pytest.param("gpt2-tiny-randw.onnx", gpt2, [(1, 1), (2, 16), (1, 77), (2, 128)],
                 ["s77", "s27"], id="gpt2"),
    pytest.param("magika-1.0.3.onnx", magika, [(1,), (2,), (5,)], ["unk__214", 2048],
                 id="magika"),
    pytest.param("mobilenetv2-tiny.onnx", mobilenet, [(1,), (2,), (5,)], ["batch", 3, 96, 96],
                 id="mobilenet"),
    pytest.param("silero-vad-op18-ifless.onnx", silero, [(1, 512), (2, 512), (1, 256)],
                 ["batch", "sequence"], id="silero"),
    pytest.param("ppocrv4-det.onnx", image("x"), [(32, 32), (64, 96), (640, 640)],
                 ["p2o_DynamicDimension_0", 3, "p2o_DynamicDimension_1", "p2o_DynamicDimension_2"],
                 id="ppocrv4-det", marks=pytest.mark.slow),
    pytest.param("yolov8n-nudenet-320n.onnx", image("images"), [(160, 160), (320, 320), (256, 320)],
                 ["batch", 3, "height", "width"], id="yolov8n", marks=pytest.mark.slow),
]


@pytest.mark.parametrize("name, make_feeds, shapes, first_param_dims", CASES)
def test_symbolic_import_compiles_once_and_matches_onnxruntime(
    name, make_feeds, shapes, first_param_dims
):
    model = load_onnx(shared_model(name))
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        mod, info = import_onnx(model, keep_dynamic=True)
    dims = [int(d) if isinstance(d, tvm.tirx.IntImm) else str(d)
            for d in mod["main"].params[0].ty.shape]
    assert dims == first_param_dims  # symbolic, named after the dim_param
    assert info.dynamic_dims_kept
    ex = tvm.compile(mod, "llvm", relax_pipeline=relax.get_default_pipeline(tvm.target.Target("llvm")))
    vm = relax.VirtualMachine(ex, tvm.cpu())
    rng = np.random.default_rng(0)
    for shape in shapes:
        feeds = make_feeds(rng, *shape)
        expected = run_onnxruntime(model, feeds)
        got = vm["main"](*[tvm.runtime.tensor(v) for v in feeds.values()])
        got = [got] if hasattr(got, "numpy") else list(got)
        assert len(got) == len(expected)
        for out, ref in zip(got, expected):
            out = out.numpy()
            assert out.shape == ref.shape, (shape, out.shape, ref.shape)
            error = float(np.abs(out.astype(np.float64) - ref).max()) if ref.size else 0.0
            bound = 1e-4 * float(np.abs(ref).max() if ref.size else 0.0) + 1e-5
            assert error <= bound, f"{name} at {shape}: max error {error:.3g} > {bound:.3g}"
