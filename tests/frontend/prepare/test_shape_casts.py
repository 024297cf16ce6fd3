"""Tests of the int64_shape_arithmetic step."""

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper

from relax_memplan.errors import UnsupportedOperatorError
from relax_memplan.frontend import import_onnx, run_onnxruntime
from relax_memplan.frontend.prepare.shape_casts import Int64ShapeArithmetic

from .helpers import compile_and_compare, const, output_dims, tensor, tiny_model


def int32_shape_model(extra_reader=False):
    """magika's failure kind: Shape -> Cast(int32) -> Slice -> Concat(int32) -> Cast(int64)
    -> Reshape."""
    nodes = [
        helper.make_node("Shape", ["x"], ["s"]),
        helper.make_node("Cast", ["s"], ["s32"], to=TensorProto.INT32),
        helper.make_node("Slice", ["s32", "zero", "one"], ["batch"]),
        helper.make_node("Concat", ["batch", "dims"], ["target32"], axis=0),
        helper.make_node("Cast", ["target32"], ["target"], to=TensorProto.INT64),
        helper.make_node("Reshape", ["x", "target"], ["y"], name="reshape0"),
    ]
    outputs = [tensor("y", TensorProto.FLOAT, ["n", 2, 4])]
    if extra_reader:  # an int32 reader outside the shape computation
        nodes.append(helper.make_node("Mul", ["batch", "two32"], ["b2"]))
        nodes.append(helper.make_node("Cast", ["b2"], ["b2f"], to=TensorProto.FLOAT))
        nodes.append(helper.make_node("Add", ["y", "b2f"], ["y2"]))
        outputs = [tensor("y2", TensorProto.FLOAT, ["n", 2, 4])]
    return tiny_model(
        nodes,
        [tensor("x", TensorProto.FLOAT, ["n", 8])],
        outputs,
        [const("zero", [0]), const("one", [1]), const("dims", [2, 4], np.int32),
         const("two32", [2], np.int32)],
    )


def feeds():
    rng = np.random.default_rng(0)
    return [{"x": rng.standard_normal((n, 8)).astype("float32")} for n in (1, 3, 8)]


def test_int32_shape_reshape_fails_without_the_step():
    with pytest.raises(UnsupportedOperatorError, match="'reshape0' \\(op Reshape"):
        import_onnx(int32_shape_model(), keep_dynamic=True,
                    disable_steps=["int64_shape_arithmetic"])


def test_int32_shape_reshape_keeps_batch_symbolic():
    mod = compile_and_compare(int32_shape_model(), feeds())
    assert output_dims(mod) == ["n", 2, 4]


def test_casts_removed_and_other_readers_cast_back():
    model = int32_shape_model(extra_reader=True)
    prepared, note = Int64ShapeArithmetic()(model)
    assert "removed 2 integer Cast(s)" in note and "added 1 Cast(s) back" in note
    onnx.checker.check_model(prepared, full_check=True)
    for feed in feeds():  # the rewritten model means the same
        np.testing.assert_array_equal(run_onnxruntime(prepared, feed)[0],
                                      run_onnxruntime(model, feed)[0])
    compile_and_compare(model, feeds())


def test_model_without_shape_casts_is_unchanged():
    model = tiny_model(
        [helper.make_node("Shape", ["x"], ["s"]), helper.make_node("Reshape", ["x", "s"], ["y"])],
        [tensor("x", TensorProto.FLOAT, ["n", 8])],
        [tensor("y", TensorProto.FLOAT, ["n", 8])],
    )
    prepared, note = Int64ShapeArithmetic()(model)
    assert note == "" and prepared.SerializeToString() == model.SerializeToString()
