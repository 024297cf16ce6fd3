"""ClampEmptySlices: a dynamic slice whose end lies before its begin is empty, not std::bad_alloc."""

import numpy as np
import onnx
import pytest
import tvm
from onnx import TensorProto, helper
from tvm import relax

from relax_memplan.frontend import import_onnx, run_onnxruntime
from relax_memplan.pipeline import get_pipeline
from relax_memplan.transform.clamp_empty_slices import ClampEmptySlices


def _slice_model():
    """Slice of a (10, 8) float32 tensor with starts/ends/steps as int64 graph inputs."""
    node = helper.make_node("Slice", ["data", "starts", "ends", "axes", "steps"], ["out"])
    graph = helper.make_graph(
        [node], "slice",
        [helper.make_tensor_value_info("data", TensorProto.FLOAT, [10, 8]),
         helper.make_tensor_value_info("starts", TensorProto.INT64, [1]),
         helper.make_tensor_value_info("ends", TensorProto.INT64, [1]),
         helper.make_tensor_value_info("steps", TensorProto.INT64, [1])],
        [helper.make_tensor_value_info("out", TensorProto.FLOAT, ["r", 8])],
        initializer=[helper.make_tensor("axes", TensorProto.INT64, [1], [0])])
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 13)])


@pytest.fixture(scope="module")
def slice_vm():
    model = _slice_model()
    mod, _ = import_onnx(model)
    ex = tvm.compile(mod, "llvm", relax_pipeline=get_pipeline("llvm"))
    return model, relax.VirtualMachine(ex, tvm.cpu())


@pytest.mark.parametrize("start, end, step", [
    (5, 2, 1), (2, 5, 1), (5, 5, 1), (-1, 3, 1), (20, 30, 1), (0, 10, 3),
    (2, 5, -1), (5, 2, -1), (-1, -20, -1), (9, 9, -2)])
def test_dynamic_slice_matches_onnxruntime_including_empty(slice_vm, start, end, step):
    model, vm = slice_vm
    data = np.arange(80, dtype="float32").reshape(10, 8)
    feed = {"data": data, "starts": np.array([start]), "ends": np.array([end]),
            "steps": np.array([step])}
    expected = run_onnxruntime(model, feed)[0]
    got = vm["main"](*[tvm.runtime.tensor(v) for v in feed.values()]).numpy()
    assert got.shape == expected.shape
    np.testing.assert_array_equal(got, expected)


def test_module_without_dynamic_slice_is_returned_unchanged():
    mod, _ = import_onnx(onnx.helper.make_model(helper.make_graph(
        [helper.make_node("Relu", ["x"], ["y"])], "relu",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, [2])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [2])]),
        opset_imports=[helper.make_opsetid("", 13)]))
    assert ClampEmptySlices()(mod).same_as(mod)
