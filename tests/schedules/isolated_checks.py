"""Checks run in a subprocess by test_cpu_matmul.py, so that a heap corruption fails a test
instead of killing pytest: 3-D dense + bias + residual with symbolic (batch, seq) rows, and
bert-tiny with symbolic dims, both built with our CPU schedules."""

import numpy as np
import tvm
from tvm import relax, tirx

from relax_memplan.pipeline import get_pipeline


def build_and_run(mod, target, schedule, arrays):
    """Build ``mod`` with our pipeline (``schedule``: our CPU schedules) and run ``main`` once."""
    ex = tvm.compile(mod, target, relax_pipeline=get_pipeline(target, schedule=schedule))
    vm = relax.VirtualMachine(ex, tvm.cpu())
    return vm["main"](*[tvm.runtime.tensor(a) for a in arrays]).numpy()


def dense3d_module(batch, seq, k=64, n=96):
    """Relax ``x @ w + bias + res`` with ``x: (batch, seq, k)``; dims may be ``tirx.Var``."""
    x = relax.Var("x", relax.TensorType([batch, seq, k], "float32"))
    w = relax.Var("w", relax.TensorType([k, n], "float32"))
    bias = relax.Var("bias", relax.TensorType([n], "float32"))
    res = relax.Var("res", relax.TensorType([batch, seq, n], "float32"))
    bb = relax.BlockBuilder()
    with bb.function("main", [x, w, bias, res]):
        with bb.dataflow():
            y = bb.emit(relax.op.add(relax.op.matmul(x, w), bias))
            out = bb.emit_output(bb.emit(relax.op.add(y, res)))
        bb.emit_func_output(out)
    return bb.get()


def _check_dense3d(mod, shapes):
    ex = tvm.compile(mod, "llvm", relax_pipeline=get_pipeline("llvm", schedule=True))
    vm = relax.VirtualMachine(ex, tvm.cpu())
    rng = np.random.default_rng(0)
    w = rng.standard_normal((64, 96), dtype="float32")
    bias = rng.standard_normal(96, dtype="float32")
    for _ in range(3):  # repeated: heap damage often shows on a later allocation
        for b, s in shapes:
            x = rng.standard_normal((b, s, 64), dtype="float32")
            res = rng.standard_normal((b, s, 96), dtype="float32")
            out = vm["main"](*[tvm.runtime.tensor(v) for v in (x, w, bias, res)]).numpy()
            np.testing.assert_allclose(out, x @ w + bias + res, rtol=1e-4, atol=1e-4,
                                       err_msg=f"batch={b} seq={s}")


def check_dense3d():
    batch, seq = tirx.Var("batch", "int64"), tirx.Var("seq", "int64")
    _check_dense3d(dense3d_module(batch, seq), [(1, 17), (2, 5), (1, 1), (2, 128), (2, 17), (3, 3)])
    _check_dense3d(dense3d_module(2, 17), [(2, 17)])  # static: StaticMatmul on 2 x 17 rows
    _check_dense3d(dense3d_module(tirx.Var("batch", "int64"), 17), [(1, 17), (2, 17)])  # odd seq
    print("DENSE3D OK")


def check_bert_tiny(path):
    from relax_memplan.frontend import import_onnx, run_onnxruntime

    mod, _ = import_onnx(path, keep_dynamic=True)
    ex = tvm.compile(mod, "llvm", relax_pipeline=get_pipeline(
        "llvm", schedule=True, dim_ranges={"batch": (1, 2), "seq": (1, 128)}))
    vm = relax.VirtualMachine(ex, tvm.cpu())
    rng = np.random.default_rng(0)
    names = ("input_ids", "attention_mask", "token_type_ids")
    for b, s in [(1, 17), (2, 128), (1, 1), (1, 17)]:
        feeds = {"input_ids": rng.integers(0, 1000, (b, s)).astype("int64"),
                 "attention_mask": np.ones((b, s), "int64"),
                 "token_type_ids": np.zeros((b, s), "int64")}
        out = vm["main"](*[tvm.runtime.tensor(feeds[k]) for k in names])
        outs = [out.numpy()] if hasattr(out, "numpy") else [o.numpy() for o in out]
        ref = run_onnxruntime(path, feeds)
        assert len(outs) == len(ref)
        for got, want in zip(outs, ref):
            np.testing.assert_allclose(got, want, rtol=1e-3, atol=1e-3, err_msg=f"({b}, {s})")
    print("BERT OK")
