"""Tests of the fold_constants step."""

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper

from relax_memplan.errors import UnsupportedOperatorError
from relax_memplan.frontend import import_onnx
from relax_memplan.onnx_prepare.fold_constants import FoldConstants

from .helpers import compile_and_compare, const, param_dims, tensor, tiny_model


def scalar_constant_of_shape_model():
    """bert's failure kind: ConstantOfShape of an empty shape makes a scalar."""
    return tiny_model(
        [
            helper.make_node("ConstantOfShape", ["empty"], ["zero"], name="cos0",
                             value=helper.make_tensor("v", TensorProto.FLOAT, [1], [2.0])),
            helper.make_node("Add", ["x", "zero"], ["y"], name="add0"),
        ],
        [tensor("x", TensorProto.FLOAT, ["n", 3])],
        [tensor("y", TensorProto.FLOAT, ["n", 3])],
        [const("empty", np.zeros(0))],
    )


def test_scalar_constant_of_shape_fails_without_folding():
    with pytest.raises(UnsupportedOperatorError, match="'cos0' \\(op ConstantOfShape"):
        import_onnx(scalar_constant_of_shape_model(), keep_dynamic=True,
                    disable_steps=["fold_constants"])


def test_scalar_constant_of_shape_folded_and_runs_at_several_shapes():
    model = scalar_constant_of_shape_model()
    feeds = [{"x": np.random.default_rng(n).standard_normal((n, 3)).astype("float32")}
             for n in (1, 4, 9)]
    mod = compile_and_compare(model, feeds)
    assert param_dims(mod) == ["n", 3]


def test_note_counts_folded_ops_and_input_is_not_modified():
    model = scalar_constant_of_shape_model()
    before = model.SerializeToString()
    folded, note = FoldConstants()(model)
    assert model.SerializeToString() == before
    assert "folded 1 nodes" in note and "ConstantOfShape 1" in note
    assert [n.op_type for n in folded.graph.node] == ["Add"]
    onnx.checker.check_model(folded)


def test_shape_of_static_dims_folds_but_dynamic_dims_stay():
    model = tiny_model(
        [
            helper.make_node("Shape", ["x"], ["tail"], start=1),  # [4]: static
            helper.make_node("Shape", ["x"], ["full"]),  # [n, 4]: dynamic
            helper.make_node("Concat", ["minus_one", "tail"], ["target"], axis=0),
            helper.make_node("Reshape", ["x", "target"], ["y"]),
            helper.make_node("Reshape", ["y", "full"], ["z"]),
        ],
        [tensor("x", TensorProto.FLOAT, ["n", 4])],
        [tensor("z", TensorProto.FLOAT, ["n", 4])],
        [const("minus_one", [-1])],
    )
    folded, note = FoldConstants()(model)
    ops = [n.op_type for n in folded.graph.node]
    assert ops == ["Shape", "Reshape", "Reshape"]  # Shape(start=1) and Concat folded
    assert "Concat 1, Shape 1" in note


def test_large_outputs_and_graph_outputs_stay_nodes():
    model = tiny_model(
        [
            helper.make_node("ConstantOfShape", ["big_shape"], ["big"]),
            helper.make_node("Add", ["x", "big"], ["y"]),
            helper.make_node("Identity", ["small"], ["out2"]),
        ],
        [tensor("x", TensorProto.FLOAT, [256, 256])],
        [tensor("y", TensorProto.FLOAT, [256, 256]), tensor("out2", TensorProto.INT64, [1])],
        [const("big_shape", [256, 256]), const("small", [7])],
    )
    folded, note = FoldConstants(max_folded_bytes=1024)(model)
    assert note == ""
    assert [n.op_type for n in folded.graph.node] == ["ConstantOfShape", "Add", "Identity"]
    folded, note = FoldConstants(max_folded_bytes=1 << 20)(model)
    assert [n.op_type for n in folded.graph.node] == ["Add", "Identity"]
