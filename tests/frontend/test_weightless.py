"""The structure-only copy of a model (large weights as zeros): shape inference and
onnxruntime's optimized node count see the same graph, and nothing converts or copies a
weight that no step reads."""

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper, numpy_helper

from relax_memplan.frontend import import_onnx
from relax_memplan.frontend.prepare import _graph, fold_constants
from relax_memplan.frontend.prepare.fold_constants import FoldConstants
from relax_memplan.frontend.prepare.inline_constant_if import InlineConstantIf
from relax_memplan.frontend.prepare.shape_casts import Int64ShapeArithmetic
from relax_memplan.frontend.weightless import (MIN_BYTES, ZERO_FILE, weightless_copy,
                                               write_zero_file)
from relax_memplan.report.fusion_summary import ort_optimized_nodes
from tests.conftest import shared_model


def _mlp():
    """x [b, 64] @ W [64, 256] (64 KiB) + bias (1 KiB), Relu, Reshape to [b, 16, 16]."""
    rng = np.random.default_rng(0)
    inits = [numpy_helper.from_array(rng.standard_normal((64, 256)).astype("float32"), "W"),
             numpy_helper.from_array(rng.standard_normal(256).astype("float32"), "bias"),
             numpy_helper.from_array(np.array([-1, 16, 16], np.int64), "shape")]
    nodes = [helper.make_node("MatMul", ["x", "W"], ["h"]),
             helper.make_node("Add", ["h", "bias"], ["a"]),
             helper.make_node("Relu", ["a"], ["r"]),
             helper.make_node("Reshape", ["r", "shape"], ["y"])]
    graph = helper.make_graph(nodes, "mlp",
                              [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["b", 64])],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, ["b", 16, 16])],
                              initializer=inits)
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])


def test_large_weights_become_zero_external_data_and_the_rest_is_kept():
    model = _mlp()
    before = model.SerializeToString()
    lean, largest = weightless_copy(model)
    assert model.SerializeToString() == before  # the model itself is not changed
    assert largest == 64 * 256 * 4
    by_name = {t.name: t for t in lean.graph.initializer}
    assert by_name["W"].data_location == TensorProto.EXTERNAL and not by_name["W"].raw_data
    assert list(by_name["W"].dims) == [64, 256]
    assert by_name["bias"].data_location == TensorProto.EXTERNAL  # 1 KiB = MIN_BYTES
    assert by_name["shape"].raw_data == model.graph.initializer[2].raw_data  # 24 B: kept
    assert MIN_BYTES == 1024
    assert list(lean.graph.node) == list(model.graph.node)
    assert len(lean.SerializeToString()) < len(before) // 10


def test_a_weight_of_the_wrong_size_is_kept_for_the_checker_to_refuse(tmp_path):
    model = _mlp()
    model.graph.initializer[0].raw_data = model.graph.initializer[0].raw_data[:4096]
    lean, _ = weightless_copy(model)
    assert lean.graph.initializer[0].raw_data == model.graph.initializer[0].raw_data
    path = tmp_path / "m.onnx"
    onnx.save(model, str(path))
    from relax_memplan.errors import ModelLoadError
    from relax_memplan.frontend import load_onnx

    with pytest.raises(ModelLoadError, match="fails onnx.checker.*raw_data size"):
        load_onnx(path)


def test_the_structure_check_refuses_what_the_whole_model_check_refuses(tmp_path):
    model = _mlp()
    model.graph.node[1].input[0] = "nope"  # read before anything writes it
    path = tmp_path / "m.onnx"
    onnx.save(model, str(path))
    from relax_memplan.errors import ModelLoadError
    from relax_memplan.frontend import load_onnx

    with pytest.raises(ModelLoadError, match="input 'nope'.*is not output of any previous"):
        load_onnx(path)
    with pytest.raises(onnx.checker.ValidationError):
        onnx.checker.check_model(model)


def test_shape_inference_on_the_copy_equals_inference_on_the_model():
    model = _mlp()
    full = onnx.shape_inference.infer_shapes(model, data_prop=True)
    lean = onnx.shape_inference.infer_shapes(weightless_copy(model)[0], data_prop=True)
    assert list(lean.graph.value_info) == list(full.graph.value_info)
    assert list(lean.graph.output) == list(full.graph.output)
    assert [d.dim_value for d in lean.graph.output[0].type.tensor_type.shape.dim][1:] == [16, 16]


def test_the_zero_file_reads_as_zeros(tmp_path):
    path = write_zero_file(tmp_path, 4096)
    assert path.endswith(ZERO_FILE) and open(path, "rb").read() == bytes(4096)


@pytest.mark.parametrize("name", ["bert-tiny-randw.onnx", "silero-vad-op18-ifless.onnx"])
def test_onnxruntime_counts_the_same_nodes_on_zero_weights(name, monkeypatch):
    pytest.importorskip("onnxruntime")
    model = onnx.load(shared_model(name))
    lean = ort_optimized_nodes(model, split=True)
    from relax_memplan.report import fusion_summary

    def whole(onnx_model, folder):  # the model with its weights, as before
        path = f"{folder}/whole.onnx"
        onnx.save(onnx_model, path)
        return path

    monkeypatch.setattr(fusion_summary, "_with_zero_weights", whole)
    assert lean == ort_optimized_nodes(model, split=True) and lean[0] > 0


def test_constants_are_converted_only_when_read(monkeypatch):
    converted = []
    real = numpy_helper.to_array
    monkeypatch.setattr(_graph.numpy_helper, "to_array",
                        lambda t, *a: converted.append(t.name) or real(t, *a))
    values = _graph.constant_values(_mlp().graph)
    assert set(values) == {"W", "bias", "shape"} and "W" in values and converted == []
    assert values["shape"].tolist() == [-1, 16, 16] and converted == ["shape"]
    assert values.data_type("W") == TensorProto.FLOAT and converted == ["shape"]
    with pytest.raises(KeyError):
        values["x"]


def test_a_subgraph_input_hides_the_outer_value_of_its_name():
    body = helper.make_graph([], "body", [helper.make_tensor_value_info("W", TensorProto.FLOAT,
                                                                        [1])], [])
    outer = {"W": np.zeros(1), "k": np.ones(1)}
    scope = _graph.scope_values(body, outer)
    assert "W" not in scope and "k" in scope and list(scope) == ["k"]
    scope["new"] = np.ones(2)
    assert "new" in scope and "new" not in outer


def test_folding_does_not_evaluate_a_node_shape_inference_calls_too_large(monkeypatch):
    # Transpose(W) of a 64 KiB weight, above max_folded_bytes: evaluating it would be wasted
    model = _mlp()
    model.graph.node.insert(0, helper.make_node("Transpose", ["W"], ["Wt"], perm=[1, 0]))
    model.graph.output.append(helper.make_tensor_value_info("Wt2", TensorProto.FLOAT, [256, 64]))
    model.graph.node.append(helper.make_node("Relu", ["Wt"], ["Wt2"]))
    evaluated = []
    real = fold_constants._evaluate
    monkeypatch.setattr(fold_constants, "_evaluate",
                        lambda node, *a: evaluated.append(node.op_type) or real(node, *a))
    folded, _ = FoldConstants(max_folded_bytes=1024)(model)
    assert "Transpose" not in evaluated
    assert [n.op_type for n in folded.graph.node][0] == "Transpose"  # kept, not folded


def test_steps_with_nothing_to_do_return_the_model_itself_unchanged():
    model = _mlp()
    before = model.SerializeToString()
    for step in (InlineConstantIf(), Int64ShapeArithmetic()):
        out, note = step(model)
        assert out is model and note == ""
    assert model.SerializeToString() == before


def test_the_import_restores_onnx_checker():
    check = onnx.checker.check_model
    import_onnx(_mlp(), {"x": (2, 64)})
    assert onnx.checker.check_model is check


def test_a_model_without_outputs_is_refused(tmp_path):
    model = _mlp()
    del model.graph.output[:]
    path = tmp_path / "m.onnx"
    onnx.save(model, str(path))
    from relax_memplan.errors import ModelLoadError
    from relax_memplan.frontend import load_onnx

    with pytest.raises(ModelLoadError, match="has no graph outputs"):
        load_onnx(path)
