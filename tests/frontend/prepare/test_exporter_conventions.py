"""Conventions real exporters write that ONNX Runtime accepts, each reproduced with
``onnx.helper`` and compared with onnxruntime.

- paddle2onnx marks a dynamic dim with ``dim_value: -1`` (rapidocr's PP-OCR classifier):
  any negative ``dim_value`` is an unknown dim, in inputs and in declared shapes.
- torch's TorchScript exporter writes ``If`` on a shape test (``x.squeeze(d)`` of a dim it
  cannot prove 1, an LSTM's ``input.dim() == 2``), which is constant once the shapes are
  (silero-vad, openwakeword, akiki): the taken branch is inlined.
"""

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper

from relax_memplan.errors import ShapeSpecError, UnsupportedOperatorError
from relax_memplan.frontend import import_onnx, run_onnxruntime
from relax_memplan.frontend.input_shapes import input_dim_symbols, static_dim, without_negative_dims

from .helpers import compile_and_compare, const, param_dims, tensor, tiny_model


def _negative_dim(value, axis, dim_value=-1):
    value.type.tensor_type.shape.dim[axis].Clear()
    value.type.tensor_type.shape.dim[axis].dim_value = dim_value
    return value


def paddle_batch_model(dim_value=-1):
    """x [-1, 4] @ w -> Flatten -> y [-1, 2], as paddle2onnx declares a dynamic batch."""
    return tiny_model(
        [helper.make_node("MatMul", ["x", "w"], ["h"]),
         helper.make_node("Flatten", ["h"], ["y"], axis=1)],
        [_negative_dim(tensor("x", TensorProto.FLOAT, [1, 4]), 0, dim_value)],
        [_negative_dim(tensor("y", TensorProto.FLOAT, [1, 2]), 0, dim_value)],
        [const("w", np.arange(8).reshape(4, 2) / 8.0, np.float32)],
        opset=11,
    )


def _feeds(batch, width=4):
    return {"x": np.random.default_rng(batch).standard_normal((batch, width)).astype("float32")}


@pytest.mark.parametrize("dim_value", [-1, -7])
def test_negative_dim_value_is_a_dynamic_dim(dim_value):
    model = paddle_batch_model(dim_value)
    assert static_dim(model.graph.input[0].type.tensor_type.shape.dim[0]) is None
    assert input_dim_symbols(model.graph.input) == {"x": ["x_dim0", 4]}
    mod = compile_and_compare(model, [_feeds(1), _feeds(3), _feeds(7)])
    assert param_dims(mod) == ["x_dim0", 4]


def test_negative_dim_value_takes_a_shape_flag():
    # was: "input 'x' dim 0 is static -1 in the model, got 3"
    mod, info = import_onnx(paddle_batch_model(), {"x": (3, 4)})
    assert param_dims(mod) == [3, 4]
    assert info.fixed_dims == {"x_dim0": 3}


def test_zero_dim_value_stays_a_static_empty_dim():
    # ONNX Runtime runs an input declared 0 only at size 0: refused, not read as dynamic
    model = paddle_batch_model()
    model.graph.input[0].type.tensor_type.shape.dim[0].dim_value = 0
    with pytest.raises(ShapeSpecError, match="size 0 at axis 0"):
        import_onnx(model)


def test_negative_declared_dim_is_not_folded_as_a_value():
    """A value_info [-1, 4] read as static would fold Shape(h)[0] to -1 (a wrong result)."""
    model = tiny_model(
        [helper.make_node("Relu", ["x"], ["h"]),
         helper.make_node("Shape", ["h"], ["shape"]),
         helper.make_node("Gather", ["shape", "zero"], ["rows"], axis=0),
         helper.make_node("Cast", ["rows"], ["rows_f"], to=TensorProto.FLOAT),
         helper.make_node("Add", ["h", "rows_f"], ["y"])],
        [tensor("x", TensorProto.FLOAT, ["n", 4])],
        [tensor("y", TensorProto.FLOAT, ["n", 4])],
        [const("zero", 0)],
    )
    model.graph.value_info.append(_negative_dim(tensor("h", TensorProto.FLOAT, [1, 4]), 0))
    cleaned, count = without_negative_dims(model)
    assert count == 1 and model.graph.value_info[0].type.tensor_type.shape.dim[0].dim_value == -1
    for batch in (2, 5):
        mod, _ = import_onnx(model, {"x": (batch, 4)})
        feeds = _feeds(batch)
        expected = run_onnxruntime(model, feeds)[0]
        assert expected[0, 0] == pytest.approx(max(feeds["x"][0, 0], 0) + batch)
        import tvm
        from tvm import relax

        vm = relax.VirtualMachine(tvm.compile(mod, "llvm"), tvm.cpu())
        got = vm["main"](tvm.runtime.tensor(feeds["x"])).numpy()
        np.testing.assert_allclose(got, expected, rtol=1e-6)


def _branch(name, nodes, output, shape):
    return helper.make_graph(nodes, name, [], [tensor(output, TensorProto.FLOAT, shape)])


def squeeze_if_model():
    """TorchScript's ``h.squeeze(2)``: ``If(Shape(h)[2] == 1, Squeeze, Identity)``, then
    an LSTM-style rank test on the result (``If(Size(Shape(s)) == 2, ...)``) nested in the
    then branch, and a MatMul that needs the squeezed rank."""
    rank_test = [
        helper.make_node("Shape", ["squeezed"], ["sq_shape"]),
        helper.make_node("Size", ["sq_shape"], ["sq_rank"]),
        helper.make_node("Equal", ["sq_rank", "two"], ["is_2d"]),
        helper.make_node("If", ["is_2d"], ["picked"], name="rank_if",
                         then_branch=_branch("rank2", [helper.make_node(
                             "Identity", ["squeezed"], ["kept"])], "kept", ["n", 4]),
                         else_branch=_branch("rank3", [helper.make_node(
                             "Squeeze", ["squeezed", "axis0"], ["dropped"])], "dropped",
                             ["n", 4])),
    ]
    then_branch = _branch("squeeze", [helper.make_node("Squeeze", ["h", "axis2"],
                                                       ["squeezed"])] + rank_test, "picked",
                          ["n", 4])
    else_branch = _branch("keep", [helper.make_node("Identity", ["h"], ["same"])], "same",
                          ["n", 4, "k"])
    return tiny_model(
        [helper.make_node("Relu", ["x"], ["h"]),
         helper.make_node("Shape", ["h"], ["shape"]),
         helper.make_node("Gather", ["shape", "axis2_scalar"], ["extent"], axis=0),
         helper.make_node("Equal", ["extent", "one"], ["is_one"]),
         helper.make_node("If", ["is_one"], ["s"], name="squeeze_if",
                          then_branch=then_branch, else_branch=else_branch),
         helper.make_node("MatMul", ["s", "w"], ["y"])],
        [tensor("x", TensorProto.FLOAT, ["n", 4, "k"])],
        [tensor("y", TensorProto.FLOAT, ["n", 3])],
        [const("axis2", [2]), const("axis0", [0]), const("axis2_scalar", 2), const("one", 1),
         const("two", 2), const("w", np.ones((4, 3)) / 4, np.float32)],
    )


def _run(mod, feeds):
    import tvm
    from tvm import relax

    vm = relax.VirtualMachine(tvm.compile(mod, "llvm"), tvm.cpu())
    return vm["main"](*[tvm.runtime.tensor(v) for v in feeds.values()]).numpy()


@pytest.mark.parametrize("batch", [1, 3])
def test_if_on_a_constant_shape_test_is_inlined(batch):
    model = squeeze_if_model()
    feeds = {"x": np.random.default_rng(batch).standard_normal((batch, 4, 1)).astype("float32")}
    mod, info = import_onnx(model, {"x": (batch, 4, 1)})
    assert any("inline_constant_if: inlined 2 If node(s)" in n for n in info.notes)
    np.testing.assert_allclose(_run(mod, feeds), run_onnxruntime(model, feeds)[0], rtol=1e-6)


def test_if_on_a_shape_test_fails_without_inlining():
    # TVM imports the branches as a Relax If: the rank test reads Size of a shape
    with pytest.raises(UnsupportedOperatorError, match="'sq_rank' \\(op Size"):
        import_onnx(squeeze_if_model(), {"x": (1, 4, 1)}, disable_steps=["inline_constant_if"])


def test_if_on_a_run_time_value_stays():
    """silero's ``If(sr == 16000)`` on an input: both branches kept, ORT's results."""
    then_branch = _branch("double", [helper.make_node("Add", ["x", "x"], ["twice"])], "twice",
                          [2, 3])
    else_branch = _branch("negate", [helper.make_node("Neg", ["x"], ["minus"])], "minus",
                          [2, 3])
    model = tiny_model(
        [helper.make_node("Equal", ["sr", "rate"], ["is_16k"]),
         helper.make_node("If", ["is_16k"], ["y"], then_branch=then_branch,
                          else_branch=else_branch)],
        [tensor("x", TensorProto.FLOAT, [2, 3]), tensor("sr", TensorProto.INT64, [])],
        [tensor("y", TensorProto.FLOAT, [2, 3])],
        [const("rate", 16000)],
    )
    mod, info = import_onnx(model)
    assert not any("inline_constant_if" in n for n in info.notes)
    x = np.arange(6, dtype=np.float32).reshape(2, 3)
    for rate in (16000, 8000):
        feeds = {"x": x, "sr": np.array(rate, np.int64)}
        np.testing.assert_allclose(_run(mod, feeds), run_onnxruntime(model, feeds)[0])


def test_if_constant_only_after_a_second_shape_inference_is_inlined():
    """akiki-vad: ONNX shape inference does not see through a reshape target computed by
    an op it does not propagate (here Transpose); once fold_constants has folded the target,
    the next inference makes the squeeze test constant."""
    then_branch = _branch("squeeze", [helper.make_node("Squeeze", ["r", "axis1"], ["sq"])],
                          "sq", [8])
    else_branch = _branch("keep", [helper.make_node("Identity", ["r"], ["same"])], "same",
                          [8, 1])
    model = tiny_model(
        [helper.make_node("Transpose", ["target_t"], ["target"]),
         helper.make_node("Reshape", ["x", "target"], ["r"]),
         helper.make_node("Shape", ["r"], ["shape"]),
         helper.make_node("Gather", ["shape", "one"], ["extent"], axis=0),
         helper.make_node("Equal", ["extent", "one"], ["is_one"]),
         helper.make_node("If", ["is_one"], ["s"], then_branch=then_branch,
                          else_branch=else_branch),
         helper.make_node("MatMul", ["s", "w"], ["y"])],
        [tensor("x", TensorProto.FLOAT, [2, 4])],
        [tensor("y", TensorProto.FLOAT, [3])],
        [const("target_t", [8, 1]), const("axis1", [1]), const("one", 1),
         const("w", np.arange(24).reshape(8, 3) / 24, np.float32)],
    )
    mod, info = import_onnx(model)
    assert any("inline_constant_if: inlined 1 If node(s)" in n for n in info.notes)
    feeds = {"x": np.arange(8, dtype=np.float32).reshape(2, 4)}
    np.testing.assert_allclose(_run(mod, feeds), run_onnxruntime(model, feeds)[0], rtol=1e-6)


def pooled_squeeze_model():
    """PP-OCRv4 rec's head: the height pooled to 1 (an expression of the input height that
    is 1 only at the heights the model runs at), then squeezed."""
    return tiny_model(
        [helper.make_node("MaxPool", ["x"], ["pooled"], kernel_shape=[2], strides=[2]),
         helper.make_node("Squeeze", ["pooled", "axis2"], ["rows"], name="squeeze_height"),
         helper.make_node("MatMul", ["rows", "w"], ["y"])],
        [tensor("x", TensorProto.FLOAT, ["n", 4, "h"])],
        [tensor("y", TensorProto.FLOAT, ["n", 3])],
        [const("axis2", [2]), const("w", np.arange(12).reshape(4, 3) / 12, np.float32)],
    )


def test_squeeze_of_a_symbolic_axis_is_checked_at_run_time():
    model = pooled_squeeze_model()
    with pytest.raises(UnsupportedOperatorError, match="'squeeze_height' \\(op Squeeze"):
        import_onnx(model, keep_dynamic=True, disable_steps=["assume_equal_dims"])
    feeds = [{"x": np.random.default_rng(n * h).standard_normal((n, 4, h)).astype("float32")}
             for n, h in ((1, 2), (3, 3), (2, 2))]
    mod = compile_and_compare(model, feeds)
    assert param_dims(mod) == ["n", 4, "h"]
    import tvm
    from tvm import relax

    vm = relax.VirtualMachine(tvm.compile(mod, "llvm"), tvm.cpu())
    with pytest.raises(Exception):  # pooled height 2: onnxruntime fails too
        run_onnxruntime(model, {"x": np.ones((1, 4, 4), np.float32)})
    with pytest.raises(Exception, match="match_cast|shape|1"):
        vm["main"](tvm.runtime.tensor(np.ones((1, 4, 4), np.float32)))


def same_pad_conv_model(mode, stride, dilation):
    """tf2onnx's Keras ``padding="same"``: Conv with auto_pad over symbolic height/width
    (onnxruntime refuses a dilation with SAME_*; TVM's path is the same formula)."""
    weight = np.random.default_rng(1).standard_normal((4, 2, 3, 3)).astype(np.float32)
    return tiny_model(
        [helper.make_node("Conv", ["x", "w"], ["y"], name="same_conv", auto_pad=mode,
                          kernel_shape=[3, 3], strides=[stride, stride],
                          dilations=[dilation, dilation])],
        [tensor("x", TensorProto.FLOAT, ["n", 2, "h", "w_"])],
        [tensor("y", TensorProto.FLOAT, ["n", 4, "oh", "ow"])],
        [onnx.numpy_helper.from_array(weight, "w")],
    )


@pytest.mark.parametrize("mode, stride, dilation", [("SAME_UPPER", 2, 1), ("SAME_LOWER", 2, 1),
                                                    ("SAME_UPPER", 3, 1), ("SAME_LOWER", 3, 1)])
def test_conv_same_auto_pad_over_symbolic_dims(mode, stride, dilation):
    model = same_pad_conv_model(mode, stride, dilation)
    if stride > 1:  # TVM's numpy padding arithmetic fails on h % stride
        with pytest.raises(UnsupportedOperatorError, match="'same_conv' \\(op Conv"):
            import_onnx(model, keep_dynamic=True, disable_steps=["symbolic_auto_pad"])
    feeds = [{"x": np.random.default_rng(h * w).standard_normal((n, 2, h, w)).astype("float32")}
             for n, h, w in ((1, 8, 8), (2, 7, 10), (1, 5, 3))]
    mod = compile_and_compare(model, feeds)
    assert param_dims(mod) == ["n", 2, "h", "w_"]
