"""magika's LayerNorm pattern at batch > 1: tf2onnx shape arithmetic on the batch dim
(Shape -> Cast(int32) -> Slice -> Concat -> Cast(int64)) feeding Reshape/Expand, ReduceSum
over axis 1 and the variance as E[x^2] - E[x]^2.

Regression for "magika differs from onnxruntime at batch 5, not at batch 1": the import keeps
every batch row independent (rows at batch N are bit-identical to the same rows at batch 1)
and matches onnxruntime on well-conditioned data.  The magika difference itself came from
onnxruntime: its ReduceSum sums in a different order when N > 1 (at N == 1 it is the plain
sequential float32 sum, like TVM's), and magika's variance, E[x^2] - E[x]^2 with eps 1e-6,
amplifies that float32 rounding about a thousand times on inputs whose bytes are all 0 or 1.
"""

import warnings

import numpy as np
import tvm
from onnx import TensorProto, helper
from tvm import relax

from relax_memplan.frontend import import_onnx

from .helpers import compile_and_compare, const, output_dims, tensor, tiny_model

ROWS, COLS = 8, 128  # x: [n, 64, 16] is reshaped to [n, ROWS, COLS]


def layernorm_model():
    """LayerNorm over axis 1 as tf2onnx exports jax's: sums, not ReduceMean, and the
    statistics broadcast back through Reshape + Expand to shapes built from Shape(x)."""
    node = helper.make_node
    nodes = [
        node("Shape", ["x"], ["s"]),
        node("Cast", ["s"], ["s32"], to=TensorProto.INT32),
        node("Slice", ["s32", "zero", "one", "zero"], ["batch"]),
        node("Concat", ["batch", "rows_cols"], ["target32"], axis=0),
        node("Cast", ["target32"], ["target"], to=TensorProto.INT64),
        node("Reshape", ["x", "target"], ["r"]),
        node("ReduceSum", ["r", "one"], ["sum"], keepdims=0),
        node("Mul", ["r", "r"], ["square"]),
        node("ReduceSum", ["square", "one"], ["sum_sq"], keepdims=0),
        node("Mul", ["sum", "inv_rows"], ["mean"]),
        node("Mul", ["sum_sq", "inv_rows"], ["mean_sq"]),
        node("Mul", ["mean", "mean"], ["mean2"]),
        node("Sub", ["mean_sq", "mean2"], ["var0"]),
        node("Max", ["zero_f", "var0"], ["var"]),
        node("Concat", ["batch", "one_cols"], ["stat32"], axis=0),
        node("Cast", ["stat32"], ["stat_shape"], to=TensorProto.INT64),
        node("Reshape", ["var", "stat_shape"], ["var_r"]),
        node("Expand", ["var_r", "stat_shape"], ["var_b"]),
        node("Add", ["var_b", "eps"], ["var_eps"]),
        node("Sqrt", ["var_eps"], ["std"]),
        node("Reciprocal", ["std"], ["inv_std"]),
        node("Reshape", ["mean", "stat_shape"], ["mean_r"]),
        node("Expand", ["mean_r", "stat_shape"], ["mean_b"]),
        node("Sub", ["r", "mean_b"], ["centered"]),
        node("Mul", ["centered", "inv_std"], ["y"]),
    ]
    return tiny_model(
        nodes,
        [tensor("x", TensorProto.FLOAT, ["n", 64, 16])],
        [tensor("y", TensorProto.FLOAT, ["n", ROWS, COLS])],
        [const("zero", [0]), const("one", [1]),
         const("rows_cols", [ROWS, COLS], np.int32), const("one_cols", [1, COLS], np.int32),
         const("inv_rows", 1.0 / ROWS, np.float32), const("zero_f", 0.0, np.float32),
         const("eps", 1e-6, np.float32)],
        opset=15,
    )


def _rows(batch, seed=0):
    rng = np.random.default_rng(seed)
    return (rng.standard_normal((batch, 64, 16)) * 2.0 + 0.5).astype(np.float32)


def test_layernorm_pattern_matches_onnxruntime_at_batch_1_3_5():
    mod = compile_and_compare(layernorm_model(), [{"x": _rows(n)} for n in (1, 3, 5)])
    assert output_dims(mod) == ["n", ROWS, COLS]


def test_layernorm_pattern_rows_at_batch_5_equal_batch_1():
    """No op of the import mixes batch rows or depends on the batch size."""
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        mod, _ = import_onnx(layernorm_model(), keep_dynamic=True)
    vm = relax.VirtualMachine(tvm.compile(mod, "llvm"), tvm.cpu())
    x = _rows(5, seed=1)
    at_5 = vm["main"](tvm.runtime.tensor(x)).numpy()
    for row in range(5):
        at_1 = vm["main"](tvm.runtime.tensor(x[row : row + 1])).numpy()
        np.testing.assert_array_equal(at_5[row : row + 1], at_1)
