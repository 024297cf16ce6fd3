"""Tests of the fold_constants step."""

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper

from relax_memplan.errors import UnsupportedOperatorError
from relax_memplan.frontend import import_onnx, run_onnxruntime
from relax_memplan.frontend.prepare.fold_constants import FoldConstants

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


# ----------------------------------------------------------------------------- If/Loop bodies
def branch_pad_model():
    """If(c): then Pad(x, pads computed from a Constant inside the branch), else Pad(-x,
    pads of the main graph) with edge mode."""
    then_branch = helper.make_graph(
        [helper.make_node("Constant", [], ["half"],
                          value=onnx.numpy_helper.from_array(np.array([0, 1], np.int64))),
         helper.make_node("Concat", ["half", "half"], ["pads"], axis=0),
         helper.make_node("Pad", ["x", "pads"], ["padded"], name="branch_pad")],
        "then", [], [tensor("padded", TensorProto.FLOAT, ["n", 5])])
    else_branch = helper.make_graph(
        [helper.make_node("Neg", ["x"], ["negated"]),
         helper.make_node("Pad", ["negated", "outer_pads"], ["edge"], mode="edge")],
        "else", [], [tensor("edge", TensorProto.FLOAT, ["n", 5])])
    return tiny_model(
        [helper.make_node("If", ["c"], ["y"], then_branch=then_branch, else_branch=else_branch)],
        [tensor("c", TensorProto.BOOL, []), tensor("x", TensorProto.FLOAT, ["n", 3])],
        [tensor("y", TensorProto.FLOAT, ["n", 5])],
        [const("outer_pads", [0, 1, 0, 1])],
    )


def test_constant_pads_inside_an_if_branch_fail_without_folding():
    with pytest.raises(UnsupportedOperatorError,
                       match="^cannot import ONNX node 'branch_pad' \\(op Pad, opset 17\\): "
                             "Dynamic pads are not supported yet.$"):
        import_onnx(branch_pad_model(), keep_dynamic=True, disable_steps=["fold_constants"])


def test_constants_inside_an_if_branch_fold_and_both_branches_run():
    """Regression: pads made from a Constant in a branch stayed a node ('Dynamic pads')."""
    model = branch_pad_model()
    folded, note = FoldConstants()(model)
    then_branch = next(a.g for a in folded.graph.node[0].attribute if a.name == "then_branch")
    assert [n.op_type for n in then_branch.node] == ["Pad"]
    assert [i.name for i in then_branch.initializer] == ["pads"]
    assert "Concat 1" in note and "removed 1 unused" in note
    onnx.checker.check_model(folded)
    rng = np.random.default_rng(0)
    feeds = [{"c": np.array(c), "x": rng.standard_normal((n, 3)).astype("float32")}
             for c, n in ((True, 2), (False, 2), (True, 7), (False, 1))]
    compile_and_compare(model, feeds)


def test_constants_inside_a_loop_body_fold():
    """Loop bodies fold like If branches (TVM 0.27 has no Loop: checked with onnxruntime)."""
    body = helper.make_graph(
        [helper.make_node("Constant", [], ["step"],
                          value=onnx.numpy_helper.from_array(np.array([1.0, 2.0], np.float32))),
         helper.make_node("Mul", ["step", "two"], ["step2"]),
         helper.make_node("Add", ["acc_in", "step2"], ["acc_out"]),
         helper.make_node("Identity", ["cond_in"], ["cond_out"])],
        "body",
        [tensor("i", TensorProto.INT64, []), tensor("cond_in", TensorProto.BOOL, []),
         tensor("acc_in", TensorProto.FLOAT, [2])],
        [tensor("cond_out", TensorProto.BOOL, []), tensor("acc_out", TensorProto.FLOAT, [2])])
    model = tiny_model(
        [helper.make_node("Loop", ["trips", "", "x"], ["y"], body=body)],
        [tensor("x", TensorProto.FLOAT, [2]), tensor("trips", TensorProto.INT64, [])],
        [tensor("y", TensorProto.FLOAT, [2])],
        [onnx.numpy_helper.from_array(np.array(2.0, np.float32), "two")],
    )
    folded, note = FoldConstants()(model)
    assert [n.op_type for n in folded.graph.node[0].attribute[0].g.node] == ["Add", "Identity"]
    assert "Mul 1" in note
    feeds = {"x": np.array([0.5, -1.0], np.float32), "trips": np.array(3, np.int64)}
    np.testing.assert_array_equal(run_onnxruntime(folded, feeds), run_onnxruntime(model, feeds))


def test_constant_given_by_value_ints_in_a_branch_becomes_an_initializer():
    """TVM 0.27 reads only a Constant's ``value`` tensor ('no value in Constant')."""
    then_branch = helper.make_graph(
        [helper.make_node("Constant", [], ["pads"], value_ints=[0, 1, 0, 1], name="ints"),
         helper.make_node("Pad", ["x", "pads"], ["padded"])],
        "then", [], [tensor("padded", TensorProto.FLOAT, ["n", 5])])
    else_branch = helper.make_graph(
        [helper.make_node("Constant", [], ["scale"], value_float=2.0),
         helper.make_node("Pad", ["x", "outer_pads"], ["wide"]),
         helper.make_node("Mul", ["wide", "scale"], ["scaled"])],
        "else", [], [tensor("scaled", TensorProto.FLOAT, ["n", 5])])
    model = tiny_model(
        [helper.make_node("If", ["c"], ["y"], then_branch=then_branch, else_branch=else_branch)],
        [tensor("c", TensorProto.BOOL, []), tensor("x", TensorProto.FLOAT, ["n", 3])],
        [tensor("y", TensorProto.FLOAT, ["n", 5])],
        [const("outer_pads", [0, 1, 0, 1])],
    )
    with pytest.raises(UnsupportedOperatorError, match="'ints' \\(op Constant.*no value in Constant"):
        import_onnx(model, keep_dynamic=True, disable_steps=["fold_constants"])
    rng = np.random.default_rng(0)
    feeds = [{"c": np.array(c), "x": rng.standard_normal((3, 3)).astype("float32")}
             for c in (True, False)]
    compile_and_compare(model, feeds)
