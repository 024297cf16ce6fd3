"""Tests of the converter steps: symbolic_range, shape_value_reshape, exact_resize,
assume_equal_dims, symbolic_expand, and their scoped installation."""

import numpy as np
import pytest
import tvm
from onnx import TensorProto, helper
from tvm import relax
from tvm.relax.frontend.onnx import onnx_frontend

from relax_memplan.errors import PrepareStepError, UnsupportedOperatorError
from relax_memplan.frontend import import_onnx
from relax_memplan.frontend.prepare.converters import CONVERTER_STEPS, corrected_converters

from .helpers import compile_and_compare, const, output_dims, tensor, tiny_model

RNG = np.random.default_rng(0)


def rand(*shape):
    return RNG.standard_normal(shape).astype("float32")


# ----------------------------------------------------------------------------- symbolic_range
def range_model():
    """gpt2/bert's kind: positions = Range(0, seq, 1) added to a [batch, seq] tensor."""
    return tiny_model(
        [
            helper.make_node("Shape", ["x"], ["s"]),
            helper.make_node("Gather", ["s", "one"], ["seq"], axis=0),
            helper.make_node("Range", ["zero", "seq", "one"], ["pos"]),
            helper.make_node("Cast", ["pos"], ["posf"], to=TensorProto.FLOAT),
            helper.make_node("Add", ["x", "posf"], ["y"]),
        ],
        [tensor("x", TensorProto.FLOAT, ["batch", "seq"])],
        [tensor("y", TensorProto.FLOAT, ["batch", "seq"])],
        [const("zero", 0), const("one", 1)],
    )


def test_range_length_is_the_symbolic_dim():
    feeds = [{"x": rand(b, s)} for b, s in ((1, 1), (2, 16), (3, 77))]
    mod = compile_and_compare(range_model(), feeds, disable_steps=["assume_equal_dims"])
    assert output_dims(mod) == ["batch", "seq"]


def test_range_without_the_step_gets_a_fresh_length():
    mod, _ = import_onnx(range_model(), keep_dynamic=True,
                         disable_steps=["symbolic_range", "assume_equal_dims"])
    assert mod["main"].ret_ty.shape is None  # batch x seq + range_len_0: unknown


# ----------------------------------------------------------------------------- shape_value_reshape
def reshape_dim_model():
    """gpt2's kind: Reshape(seq + 1, [-1]) used as a shape."""
    return tiny_model(
        [
            helper.make_node("Shape", ["x"], ["s"]),
            helper.make_node("Gather", ["s", "zero"], ["n"], axis=0),
            helper.make_node("Add", ["n", "one"], ["n1"]),
            helper.make_node("Reshape", ["n1", "minus_one"], ["n1_vec"], name="reshape0"),
            helper.make_node("ConstantOfShape", ["n1_vec"], ["y"],
                             value=helper.make_tensor("v", TensorProto.FLOAT, [1], [1.5])),
        ],
        [tensor("x", TensorProto.FLOAT, ["n"])],
        [tensor("y", TensorProto.FLOAT, ["n1"])],
        [const("zero", 0), const("one", 1), const("minus_one", [-1])],
    )


def test_reshape_of_a_dim_fails_without_the_step():
    with pytest.raises(UnsupportedOperatorError, match="'reshape0' \\(op Reshape.*PrimType"):
        import_onnx(reshape_dim_model(), keep_dynamic=True,
                    disable_steps=["shape_value_reshape"])


def test_reshape_of_a_dim_stays_a_symbolic_shape():
    mod = compile_and_compare(reshape_dim_model(), [{"x": rand(n)} for n in (1, 5, 64)])
    assert output_dims(mod) == ["n + 1"]


# ----------------------------------------------------------------------------- exact_resize
def upsample_model(scales=None, sizes_from=None):
    inputs = [tensor("x", TensorProto.FLOAT, [1, 2, "h", "w"])]
    nodes, inits = [], []
    if sizes_from:  # Resize x to the spatial size of a second input (computed sizes)
        inputs.append(tensor("ref", TensorProto.FLOAT, [1, 2, "H", "W"]))
        nodes = [
            helper.make_node("Shape", ["ref"], ["ref_shape"]),
            helper.make_node("Resize", ["x", "", "", "ref_shape"], ["y"], name="resize0",
                             mode="nearest"),
        ]
    else:
        inits = [helper.make_tensor("scales", TensorProto.FLOAT, [4], scales)]
        nodes = [helper.make_node("Resize", ["x", "", "scales"], ["y"], name="resize0",
                                  mode="nearest")]
    return tiny_model(nodes, inputs, [tensor("y", TensorProto.FLOAT, [1, 2, "oh", "ow"])], inits)


def test_integral_scales_give_exact_sizes():
    model = upsample_model(scales=[1, 1, 2, 3])
    mod = compile_and_compare(model, [{"x": rand(1, 2, h, w)} for h, w in ((1, 1), (4, 6), (32, 20))])
    assert output_dims(mod) == [1, 2, "h * 2", "w * 3"]
    mod, _ = import_onnx(model, keep_dynamic=True, disable_steps=["exact_resize"])
    assert "float32" in str(mod["main"].ret_ty.shape)  # TVM's float round trip


def test_resize_to_computed_sizes():
    model = upsample_model(sizes_from="ref")
    with pytest.raises(UnsupportedOperatorError, match="'resize0' \\(op Resize"):
        import_onnx(model, keep_dynamic=True, disable_steps=["exact_resize"])
    feeds = [{"x": rand(1, 2, h, w), "ref": rand(1, 2, 2 * h, 3 * w)}
             for h, w in ((1, 1), (4, 6), (16, 10))]
    mod = compile_and_compare(model, feeds)
    assert output_dims(mod) == [1, 2, "H", "W"]


# ----------------------------------------------------------------------------- assume_equal_dims
def skip_connection_model(op="Add", order=("up", "x")):
    """yolov8/ppocr's kind: a feature map pooled by 2 and upsampled by 2 joins the
    original; equal only when H, W are even, which TVM cannot prove. ``order``: the join's
    inputs (yolov8 puts the upsampled map first, a UNet's residual the input)."""
    join = (helper.make_node("Concat", list(order), ["y"], axis=1) if op == "Concat"
            else helper.make_node("Add", list(order), ["y"], name="join"))
    return tiny_model(
        [
            helper.make_node("MaxPool", ["x"], ["down"], kernel_shape=[2, 2], strides=[2, 2]),
            helper.make_node("Resize", ["down", "", "scales"], ["up"], mode="nearest"),
            join,
            helper.make_node("Relu", ["y"], ["z"]),
        ],
        [tensor("x", TensorProto.FLOAT, [1, 2, "h", "w"])],
        [tensor("z", TensorProto.FLOAT, [1, "oc", "oh", "ow"])],
        [helper.make_tensor("scales", TensorProto.FLOAT, [4], [1, 1, 2, 2])],
    )


@pytest.mark.parametrize("order", [("up", "x"), ("x", "up")], ids=["up_first", "input_first"])
@pytest.mark.parametrize("op", ["Add", "Concat"])
def test_unprovable_equal_dims_are_checked_at_run_time(op, order):
    """With the input first, the dims of the upsampled map used to be cast to the bare input
    dims (``h // 2 * 2`` to ``h``), and that cast crashed the compile with a segfault (a
    UNet with symbolic height and width, from both torch exporters). The input is now cast
    to the expression instead, the same run-time check."""
    model = skip_connection_model(op, order)
    mod, _ = import_onnx(model, keep_dynamic=True, disable_steps=["assume_equal_dims"])
    assert mod["main"].ret_ty.shape is None  # TVM loses the shape
    mod = compile_and_compare(model, [{"x": rand(1, 2, h, w)} for h, w in ((2, 2), (8, 6), (32, 32))])
    assert output_dims(mod) == [1, 4 if op == "Concat" else 2, "h // 2 * 2", "w // 2 * 2"]


# ----------------------------------------------------------------------------- symbolic_expand
def expand_model(target):
    """x[n, 4] expanded to a constant shape (rank 2 or 3)."""
    out_dims = ["m"] * (len(target) - 1) + [4]
    return tiny_model([helper.make_node("Expand", ["x", "target"], ["y"], name="expand0")],
                      [tensor("x", TensorProto.FLOAT, ["n", 4])],
                      [tensor("y", TensorProto.FLOAT, out_dims)], [const("target", target)])


def test_expand_of_a_symbolic_dim_fails_without_the_step():
    with pytest.raises(UnsupportedOperatorError,
                       match="^cannot import ONNX node 'expand0' \\(op Expand, opset 17\\): "
                             "AttributeError: 'Var' object has no attribute 'value'"):
        import_onnx(expand_model([1, 1, 4]), keep_dynamic=True, disable_steps=["symbolic_expand"])


@pytest.mark.parametrize("target, out", [([1, 4], ["n", 4]), ([1, 1, 4], [1, "n", 4]),
                                         ([3, 1, 4], [3, "n", 4]), ([4], ["n", 4])])
def test_expand_to_a_constant_shape_keeps_the_symbolic_dim(target, out):
    mod = compile_and_compare(expand_model(target), [{"x": rand(n, 4)} for n in (1, 5)])
    assert output_dims(mod) == out


@pytest.mark.parametrize("target", [[1, 4], [1, 1, 4]])
def test_expand_matches_onnxruntime_through_the_dynamic_path(target):
    from relax_memplan.compile import BuildOptions, CheckOptions, compile_model

    report = compile_model(expand_model(target), None, {"n": (1, 8)},
                           options=BuildOptions(compare_with_tvm=False),
                           check=CheckOptions(sample_shapes=2, verify=True)).report
    assert [s.dims for s in report.shapes] == [{"n": 1}, {"n": 8}]
    assert all(s.max_abs_error == 0.0 for s in report.shapes)


# ----------------------------------------------------------------------------- installation
def test_converters_restored_after_import_and_after_failure():
    original = onnx_frontend._get_convert_map
    with corrected_converters(CONVERTER_STEPS) as usage:
        assert onnx_frontend._get_convert_map is not original
        assert onnx_frontend._get_convert_map()["Range"].__name__ == "SymbolicRange"
    assert onnx_frontend._get_convert_map is original and not usage
    with pytest.raises(RuntimeError), corrected_converters(["exact_resize"]):
        raise RuntimeError("boom")
    assert onnx_frontend._get_convert_map is original
    assert onnx_frontend._get_convert_map()["Range"] is onnx_frontend.Range


def test_only_selected_converters_installed():
    with corrected_converters(["symbolic_range"]):
        table = onnx_frontend._get_convert_map()
        assert table["Range"].__name__ == "SymbolicRange"
        assert table["Resize"] is onnx_frontend.Resize


def test_unknown_converter_step_rejected():
    with pytest.raises(PrepareStepError, match="'nope'"):
        with corrected_converters(["nope"]):
            pass
