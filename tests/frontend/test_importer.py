"""Tests of relax_memplan.frontend: loading, shape specs, import errors, reference runs."""

import pickle
from pathlib import Path

import numpy as np
import onnx
import pytest
from hypothesis import given
from hypothesis import strategies as st
from onnx import TensorProto, helper, numpy_helper
from tvm.relax.frontend.onnx import onnx_frontend

from relax_memplan.errors import (
    ModelLoadError,
    PrepareStepError,
    ShapeSpecError,
    UnsupportedOperatorError,
    summarize_error,
)
from relax_memplan.frontend import (
    SAMPLE_RATE_DEFAULT_HZ,
    import_onnx,
    load_onnx,
    make_random_inputs,
    parse_shape_spec,
    run_onnxruntime,
)
from relax_memplan.frontend.prepare import STEP_NAMES

MODELS = Path(__file__).resolve().parents[2].parent / "shared" / "models"

BERT_SHAPES = {name: (2, 16) for name in ("input_ids", "attention_mask", "token_type_ids")}
SILERO_SHAPES = {"input": (1, 512), "state": (2, 1, 128)}


def model_path(name: str) -> Path:
    path = MODELS / name
    if not path.exists():
        pytest.skip(f"model {path} not available")
    return path


def tiny_model(nodes, inputs, outputs, initializers=(), opset=17) -> onnx.ModelProto:
    graph = helper.make_graph(nodes, "g", inputs, outputs, initializer=list(initializers))
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", opset)])


def tensor(name, elem_type, shape):
    return helper.make_tensor_value_info(name, elem_type, shape)


def all_nodes(graph):
    for node in graph.node:
        yield node
        for attr in node.attribute:
            if attr.type == onnx.AttributeProto.GRAPH:
                yield from all_nodes(attr.g)


def main_param_shapes(mod):
    return {p.name: tuple(int(d) for d in p.ty.shape) for p in mod["main"].params}


# ----------------------------------------------------------------------------- parse_shape_spec
@pytest.mark.parametrize(
    "text, expected",
    [
        ("x=1,3,96,96", ("x", (1, 3, 96, 96))),
        (" input_ids = 2, 16 ", ("input_ids", (2, 16))),
        ("a=b=4", ("a=b", (4,))),
    ],
)
def test_parse_shape_spec(text, expected):
    assert parse_shape_spec(text) == expected


@given(
    name=st.from_regex(r"[A-Za-z_][A-Za-z0-9_.:/]{0,20}", fullmatch=True),
    dims=st.lists(st.integers(1, 10**6), min_size=1, max_size=6),
)
def test_parse_shape_spec_round_trips(name, dims):
    assert parse_shape_spec(f"{name}={','.join(map(str, dims))}") == (name, tuple(dims))


@pytest.mark.parametrize("text", ["x", "=1,2", "x=", "x=1,,2", "x=1,a", "x=0,3", "x=2,-1", "x=1.5"])
def test_parse_shape_spec_rejects_malformed_text(text):
    with pytest.raises(ShapeSpecError, match="bad shape spec") as info:
        parse_shape_spec(text)
    assert repr(text) in str(info.value)


# ----------------------------------------------------------------------------- load_onnx
def test_load_onnx_missing_file(tmp_path):
    with pytest.raises(ModelLoadError, match="not found"):
        load_onnx(tmp_path / "absent.onnx")


def test_load_onnx_directory(tmp_path):
    with pytest.raises(ModelLoadError, match="directory"):
        load_onnx(tmp_path)


def test_load_onnx_text_file(tmp_path):
    path = tmp_path / "notes.onnx"
    path.write_text("hello, this is not a model\n")
    with pytest.raises(ModelLoadError, match="not a"):
        load_onnx(path)


@pytest.mark.parametrize("keep_bytes", [0, 10, 13000])
def test_load_onnx_truncated_bytes(tmp_path, keep_bytes):
    data = model_path("mnist-8/model.onnx").read_bytes()
    path = tmp_path / "truncated.onnx"
    path.write_bytes(data[:keep_bytes])
    with pytest.raises(ModelLoadError, match="truncated.onnx"):
        load_onnx(path)


def test_load_onnx_checker_failure_is_one_line_naming_the_node(tmp_path):
    """Regression (tutorial 07): the checker's message is one sentence over three lines, and
    only the first ("... input 'undefined' of node:") was kept, without the node."""
    model = tiny_model(
        [helper.make_node("Relu", ["undefined"], ["y"], name="relu0")],
        [tensor("x", TensorProto.FLOAT, [2])],
        [tensor("y", TensorProto.FLOAT, [2])],
    )
    path = tmp_path / "bad.onnx"
    onnx.save(model, path)
    with pytest.raises(ModelLoadError, match="onnx.checker.*undefined") as info:
        load_onnx(path)
    message = str(info.value)
    assert "\n" not in message
    assert "input 'undefined' of node: name: relu0 OpType: Relu is not output of" in message


# ----------------------------------------------------------------------------- import: failures
@pytest.fixture(scope="module")
def loaded_models():
    cache = {}

    def get(name):
        if name not in cache:
            cache[name] = load_onnx(model_path(name))
        return cache[name]

    return get


FAILING = [
    ("bert-tiny-randw.onnx", BERT_SHAPES),
    ("bert-tiny-randw.onnx", None),
    ("gpt2-tiny-randw.onnx", {"input_ids": (2, 16)}),
    ("gpt2-tiny-randw.onnx", None),
    ("magika-1.0.3.onnx", {"bytes": (1, 2048)}),
    ("magika-1.0.3.onnx", None),
    ("yolov8n-nudenet-320n.onnx", None),  # a 1x1 image: Concat of mismatched feature maps
]


def test_custom_domain_op_failure_names_its_domain_and_pickles():
    """Tutorial 07: com.microsoft's FusedMatMul failed as '(op FusedMatMul, opset 1)' in an
    opset-17 model, without the domain that opset 1 belongs to."""
    import pickle

    w = numpy_helper.from_array(np.ones((4, 4), np.float32), "w")
    graph = helper.make_graph(
        [helper.make_node("FusedMatMul", ["x", "w"], ["y"], domain="com.microsoft", name="fmm")],
        "g", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [2, 4])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [2, 4])], [w])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17),
                                                    helper.make_opsetid("com.microsoft", 1)])
    with pytest.raises(UnsupportedOperatorError) as info:
        import_onnx(model)
    error = info.value
    assert (error.node_name, error.op_type, error.domain, error.opset) == (
        "fmm", "FusedMatMul", "com.microsoft", 1)
    assert "(op FusedMatMul, com.microsoft opset 1)" in str(error)
    again = pickle.loads(pickle.dumps(error))
    assert str(again) == str(error) and again.domain == "com.microsoft"


@pytest.mark.parametrize("name, shapes", FAILING)
def test_failing_model_names_node_and_op(loaded_models, name, shapes):
    """TVM's importer alone (no preparation steps) fails on these; the node is named."""
    model = loaded_models(name)
    with pytest.raises(UnsupportedOperatorError) as info:
        import_onnx(model, shapes, prepare_steps=())
    error = info.value
    message = str(error)
    assert "\n" not in message and "Traceback" not in message
    nodes = {node.name or node.output[0]: node for node in all_nodes(model.graph)}
    assert error.node_name in nodes
    assert nodes[error.node_name].op_type == error.op_type
    assert f"'{error.node_name}'" in message and f"op {error.op_type}" in message
    default_opset = next(o.version for o in model.opset_import if o.domain in ("", "ai.onnx"))
    assert error.reason and error.opset == default_opset
    assert ("set to 1" in message) == (shapes is None)  # hint when dims were defaulted


@pytest.mark.parametrize(
    "name, op_type",
    [("ppocrv4-det.onnx", "Resize"), ("yolov8n-nudenet-320n.onnx", "Resize")],
)
def test_keep_dynamic_failure_names_resize(loaded_models, name, op_type):
    # Without the ONNX preparation steps TVM 0.27 still fails on the Resize.
    model = loaded_models(name)
    with pytest.raises(UnsupportedOperatorError) as info:
        import_onnx(model, keep_dynamic=True, prepare_steps=())
    assert info.value.op_type == op_type
    assert info.value.node_name in {n.name for n in model.graph.node}


@pytest.mark.parametrize(
    "name, disabled, op_type",
    [
        ("bert-tiny-randw.onnx", "fold_constants", "ConstantOfShape"),
        ("magika-1.0.3.onnx", "int64_shape_arithmetic", "Reshape"),
        ("ppocrv4-det.onnx", "assume_equal_dims", "Resize"),
    ],
)
def test_disabling_a_step_brings_back_its_failure(loaded_models, name, disabled, op_type):
    model = loaded_models(name)
    import_onnx(model, keep_dynamic=True)  # all steps: imports
    with pytest.raises(UnsupportedOperatorError) as info:
        import_onnx(model, keep_dynamic=True, disable_steps=[disabled])
    assert info.value.op_type == op_type


def test_keep_dynamic_notes_name_the_preparation_steps(loaded_models):
    mod, info = import_onnx(loaded_models("bert-tiny-randw.onnx"), keep_dynamic=True)
    steps = {note.split(":")[0] for note in info.notes}
    assert {"fold_constants", "int64_shape_arithmetic", "symbolic_range"} <= steps
    assert [str(d) for d in mod["main"].params[0].ty.shape] == ["batch", "seq"]


def test_static_import_runs_the_preparation_steps_unless_opted_out(loaded_models):
    model = loaded_models("bert-tiny-randw.onnx")
    with pytest.raises(UnsupportedOperatorError, match="ConstantOfShape"):
        import_onnx(model, BERT_SHAPES, prepare_steps=())
    mod, info = import_onnx(model, BERT_SHAPES)
    assert main_param_shapes(mod)["input_ids"] == (2, 16)
    assert any(note.startswith("fold_constants:") for note in info.notes)


def test_unknown_step_name_is_rejected(loaded_models):
    with pytest.raises(PrepareStepError, match="'no_such_step'.*known steps: fold_constants"):
        import_onnx(loaded_models("mobilenetv2-tiny.onnx"), keep_dynamic=True,
                    disable_steps=["no_such_step"])


def test_importer_methods_restored_after_failure(loaded_models):
    saved = (
        onnx_frontend.ONNXGraphImporter._construct_nodes,
        onnx_frontend.ONNXGraphImporter._convert_operator,
    )
    with pytest.raises(UnsupportedOperatorError):
        import_onnx(loaded_models("gpt2-tiny-randw.onnx"), prepare_steps=())
    assert saved == (
        onnx_frontend.ONNXGraphImporter._construct_nodes,
        onnx_frontend.ONNXGraphImporter._convert_operator,
    )


def test_op_tvm_lacks_is_named():
    model = tiny_model(
        [
            helper.make_node("Relu", ["x"], ["r"], name="relu0"),
            helper.make_node("Det", ["r"], ["y"], name="det0"),
        ],
        [tensor("x", TensorProto.FLOAT, [3, 3])],
        [tensor("y", TensorProto.FLOAT, [])],
    )
    with pytest.raises(UnsupportedOperatorError, match=r"'det0' \(op Det, opset 17\)"):
        import_onnx(model)


def test_missing_converter_error_has_no_dims_hint():
    """'[dynamic dims n were set to 1]' explains a converter's failure on shapes, never an
    op that nothing converts (Det, and LSTM with the step recurrent off); an LSTM that our
    converter refuses (clip) is not a missing converter, so it keeps the hint."""
    def lstm_model(**attrs):
        w = numpy_helper.from_array(np.full((1, 8, 3), 0.1, np.float32), "W")
        r = numpy_helper.from_array(np.full((1, 8, 2), 0.1, np.float32), "R")
        return tiny_model([helper.make_node("LSTM", ["x", "W", "R"], ["y"], hidden_size=2,
                                            name="lstm0", **attrs)],
                          [tensor("x", TensorProto.FLOAT, ["n", 1, 3])],
                          [tensor("y", TensorProto.FLOAT, ["n", 1, 1, 2])], [w, r])

    det = tiny_model([helper.make_node("Det", ["x"], ["y"], name="det0")],
                     [tensor("x", TensorProto.FLOAT, ["n", 3, 3])], [tensor("y", TensorProto.FLOAT, ["n"])])
    for model, disable in ((det, ()), (lstm_model(), ["recurrent"])):
        with pytest.raises(UnsupportedOperatorError, match="not supported") as info:
            import_onnx(model, disable_steps=disable)
        assert info.value.hint == "" and "set to 1" not in str(info.value)
    with pytest.raises(UnsupportedOperatorError, match="clip") as info:
        import_onnx(lstm_model(clip=1.0))
    assert str(info.value).endswith("[dynamic dims n were set to 1]")


def test_op_tvm_lacks_inside_if_branch_is_named():
    then_branch = helper.make_graph(
        [helper.make_node("Det", ["x"], ["t"], name="inner_det")],
        "then", [], [tensor("t", TensorProto.FLOAT, [])],
    )
    else_branch = helper.make_graph(
        [helper.make_node("ReduceSum", ["x"], ["e"], name="inner_sum", keepdims=0)],
        "else", [], [tensor("e", TensorProto.FLOAT, [])],
    )
    model = tiny_model(
        [helper.make_node("If", ["c"], ["y"], name="if0",
                          then_branch=then_branch, else_branch=else_branch)],
        [tensor("x", TensorProto.FLOAT, [3, 3]), tensor("c", TensorProto.BOOL, [])],
        [tensor("y", TensorProto.FLOAT, [])],
    )
    with pytest.raises(UnsupportedOperatorError) as info:
        import_onnx(model)
    assert (info.value.node_name, info.value.op_type) == ("inner_det", "Det")


def test_unnamed_failing_node_is_named_by_first_output():
    # Two unnamed Reshapes: the first (constant shape) converts, the second (shape from a
    # graph input) fails; the error must name the second by its output.
    model = tiny_model(
        [
            helper.make_node("Reshape", ["x", "c"], ["a"]),
            helper.make_node("Reshape", ["a", "s"], ["y"]),
        ],
        [tensor("x", TensorProto.FLOAT, [2, 3]), tensor("s", TensorProto.INT64, [2])],
        [tensor("y", TensorProto.FLOAT, [3, 2])],
        [numpy_helper.from_array(np.array([3, 2], np.int64), "c")],
    )
    with pytest.raises(UnsupportedOperatorError) as info:
        import_onnx(model)
    assert (info.value.node_name, info.value.op_type) == ("y", "Reshape")
    assert "the unnamed ONNX node with output 'y' (op Reshape" in str(info.value)
    assert pickle.loads(pickle.dumps(info.value)).unnamed


def test_failure_outside_converter_names_node():
    # TVM rejects a shape value fed to Neg in its node loop, before any op converter runs.
    model = tiny_model(
        [helper.make_node("Shape", ["x"], ["s"], name="shape0"),
         helper.make_node("Neg", ["s"], ["y"], name="neg0")],
        [tensor("x", TensorProto.FLOAT, ["n", 3])],
        [tensor("y", TensorProto.INT64, [2])],
    )
    with pytest.raises(UnsupportedOperatorError) as info:
        import_onnx(model, keep_dynamic=True)
    assert (info.value.node_name, info.value.op_type) == ("neg0", "Neg")


def test_failure_before_node_loop_is_model_load_error():
    model = tiny_model(
        [helper.make_node("Relu", ["x"], ["y"], name="relu0")],
        [tensor("x", TensorProto.FLOAT, [2])],
        [tensor("y", TensorProto.FLOAT, [2])],
    )
    model.ir_version = 2  # TVM rejects models older than ONNX 1.1 before converting any node
    with pytest.raises(ModelLoadError, match="cannot import ONNX model: .*IR version") as info:
        import_onnx(model)
    assert not isinstance(info.value, UnsupportedOperatorError)


@pytest.mark.filterwarnings("ignore:Field 'shape' of 'type' is required")
def test_input_of_unknown_rank_needs_a_shape():
    model = tiny_model(
        [helper.make_node("Relu", ["x"], ["y"], name="relu0")],
        [tensor("x", TensorProto.FLOAT, None)],
        [tensor("y", TensorProto.FLOAT, None)],
    )
    with pytest.raises(ShapeSpecError, match=r"'x' has unknown rank; pass --shape x="):
        import_onnx(model)
    mod, info = import_onnx(model, {"x": (2, 3)})
    assert info.input_shapes == {"x": (2, 3)} and main_param_shapes(mod) == {"x": (2, 3)}


def test_reason_keeps_one_informative_line():
    error = RuntimeError(
        "Traceback (most recent call last):\n  File \"x.py\", line 1, in f\n"
        "  0: tvm::relax::Foo()\n"
        "Check failed: (a != nullptr) is false: Reshape expects a Tensor\nmore detail\n"
    )
    assert summarize_error(error) == "Reshape expects a Tensor"


def test_reason_of_an_op_error_names_the_op_and_the_shapes():
    """Regression: bert-tiny with --shape input_ids=1,200 printed TVM's whole
    op object and was cut before the cause (position table of 128 rows)."""
    error = RuntimeError(
        'In ir.Op(span=None, ty=ir.Type(span=None), name="relax.add", description="", '
        'arguments=(ir.ArgumentInfo(name="x1", type_info="Tensor", description="The first '
        'input tensor."),), attrs_type_key="", num_inputs=2, support_level=10), the first '
        'input shape at dim 1 is T.int64(200) and the second input shape at dim 1 is '
        'T.int64(128), which are not broadcastable.')
    assert summarize_error(error) == (
        "relax.add: the first input shape at dim 1 is 200 and the second input shape at dim 1 "
        "is 128, which are not broadcastable.")



def test_reason_of_a_failed_match_cast_is_short_and_whole():
    """Regression: ppocrv4-det at a height off its stride grid stopped in a
    match_cast; the line was cut mid-word inside the printed shape ("match_cast e...")."""
    shape = "(p2o_DynamicDimension_0, 96, (p2o_DynamicDimension_1 - 1) // 16 + 1, " * 3
    error = RuntimeError(
        "Check failed: input_shape[i] == heap_data[reg] (2 vs. 1) : ErrorContext(match_cast, "
        f"ty=R.Tensor({shape}), dtype=\"float32\")) match_cast error, shape[2] mismatch")
    assert summarize_error(error) == ("a shape cast of the model failed: an extent is 2 where "
                                      "the model's shape arithmetic expects 1")

# ----------------------------------------------------------------------------- import: shapes
@pytest.mark.parametrize(
    "shapes, match",
    [
        ({"y": (1, 3, 96, 96)}, r"unknown input name.*'y'.*inputs are: 'x'"),
        ({"x": (1, 3, 96)}, r"'x' has rank 3; the model's input has rank 4"),
        ({"x": (1, 3, 96, 97)}, r"input 'x' dim 3 is static 96 in the model, got 97"),
        ({"x": (0, 3, 96, 96)}, r"input 'x' dim 0 is 0"),
        ({"x": (1.5, 3, 96, 96)}, r"list of integers"),
        ({"x": "1,3,96,96"}, r"list of integers"),
    ],
)
def test_bad_shapes_raise_shape_spec_error(loaded_models, shapes, match):
    with pytest.raises(ShapeSpecError, match=match):
        import_onnx(loaded_models("mobilenetv2-tiny.onnx"), shapes)


def _shape_notes(info):
    """The notes of ``info`` other than those of the preparation steps (``"<step>: ..."``)."""
    return tuple(n for n in info.notes if n.split(":")[0] not in STEP_NAMES)


def test_mobilenet_batch_5_shape_used(loaded_models):
    mod, info = import_onnx(loaded_models("mobilenetv2-tiny.onnx"), {"x": [5, 3, 96, 96]})
    assert info.input_shapes == {"x": (5, 3, 96, 96)}
    assert main_param_shapes(mod) == {"x": (5, 3, 96, 96)}
    assert info.defaulted_dims == {} and _shape_notes(info) == ()


def test_defaulted_dims_recorded_with_note(loaded_models):
    mod, info = import_onnx(loaded_models("mobilenetv2-tiny.onnx"))
    assert info.input_shapes == {"x": (1, 3, 96, 96)}
    assert main_param_shapes(mod) == {"x": (1, 3, 96, 96)}
    assert info.defaulted_dims == {"x": ((0, "batch"),)}
    assert _shape_notes(info) == (
        "input 'x' dim 0 'batch' not fixed; using 1 (fix it with e.g. --shape x=1,3,96,96)",
    )


def test_keep_dynamic_leaves_batch_symbolic(loaded_models):
    mod, info = import_onnx(loaded_models("mobilenetv2-tiny.onnx"), keep_dynamic=True)
    batch = mod["main"].params[0].ty.shape[0]
    assert str(batch) == "batch" and not isinstance(batch, int)
    assert info.dynamic_dims_kept and info.input_shapes == {"x": (1, 3, 96, 96)}


# ----------------------------------------------------------------------------- import: successes
@pytest.mark.parametrize(
    "name, shapes, expected",
    [
        ("mnist-8/model.onnx", None, {"Input3": (1, 1, 28, 28)}),
        ("squeezenet1.0-randw.onnx", None, {"data_0": (1, 3, 224, 224)}),
        ("silero-vad-op18-ifless.onnx", SILERO_SHAPES,
         {"input": (1, 512), "sr": (), "state": (2, 1, 128)}),
    ],
)
def test_models_import(loaded_models, name, shapes, expected):
    mod, info = import_onnx(loaded_models(name), shapes)
    assert info.input_shapes == expected
    assert info.upgraded_from_opset is None and info.defaulted_dims == {}
    assert main_param_shapes(mod) == expected


def test_import_from_path_accepts_str():
    mod, info = import_onnx(str(model_path("mnist-8/model.onnx")))
    assert info.opset == 8 and info.input_dtypes == {"Input3": "float32"}


def test_ultraface_upgrade_recorded(loaded_models):
    model = loaded_models("ultraface-rfb-320-opset9.onnx")
    mod, info = import_onnx(model)
    assert (info.upgraded_from_opset, info.opset) == (9, 13)
    assert any("opset upgraded 9 -> 13" in note and "op Slice" in note for note in info.notes)
    assert main_param_shapes(mod) == {"input": (1, 3, 240, 320)}
    assert model.opset_import[0].version == 9  # the caller's model is left unchanged


# ----------------------------------------------------------------------------- reference runs
def test_random_inputs_silero(loaded_models):
    model = loaded_models("silero-vad-op18-ifless.onnx")
    _, info = import_onnx(model, SILERO_SHAPES)
    inputs = make_random_inputs(model, info, values={"state": np.zeros((2, 1, 128))})
    assert list(inputs) == ["input", "sr", "state"]
    assert inputs["sr"].dtype == np.int64 and inputs["sr"].shape == ()
    assert int(inputs["sr"]) == SAMPLE_RATE_DEFAULT_HZ == 16000
    assert inputs["input"].dtype == np.float32 and inputs["input"].shape == (1, 512)
    assert inputs["state"].dtype == np.float32 and not inputs["state"].any()
    again = make_random_inputs(model, info)
    np.testing.assert_array_equal(inputs["input"], again["input"])  # same default seed
    outputs = run_onnxruntime(model, inputs)
    assert [out.shape for out in outputs] == [(1, 1), (2, 1, 128)]


def test_random_integer_inputs_are_zero_or_one():
    model = tiny_model(
        [helper.make_node("Identity", ["ids"], ["y"])],
        [tensor("ids", TensorProto.INT64, ["batch", 8])],
        [tensor("y", TensorProto.INT64, ["batch", 8])],
    )
    _, info = import_onnx(model, {"ids": (4, 8)})
    ids = make_random_inputs(model, info, seed=3)["ids"]
    assert ids.dtype == np.int64 and ids.shape == (4, 8)
    assert set(np.unique(ids)) <= {0, 1}


def test_one_number_fills_an_input_of_any_shape():
    model = tiny_model(
        [helper.make_node("Identity", ["ids"], ["y"])],
        [tensor("ids", TensorProto.INT64, ["batch", 8])],
        [tensor("y", TensorProto.INT64, ["batch", 8])],
    )
    _, info = import_onnx(model, {"ids": (4, 8)})
    ids = make_random_inputs(model, info, values={"ids": np.array(7)})["ids"]
    assert ids.dtype == np.int64 and ids.shape == (4, 8) and np.all(ids == 7)


def test_random_inputs_reject_bad_values(loaded_models):
    model = loaded_models("mobilenetv2-tiny.onnx")
    _, info = import_onnx(model)
    with pytest.raises(ShapeSpecError, match="unknown input"):
        make_random_inputs(model, info, values={"y": np.zeros(1)})
    with pytest.raises(ShapeSpecError, match=r"'x' has shape \(2, 3, 96, 96\)"):
        make_random_inputs(model, info, values={"x": np.zeros((2, 3, 96, 96))})


def test_onnxruntime_matches_mnist_reference_output():
    data_dir = model_path("mnist-8/test_data_set_0")
    model = load_onnx(data_dir.parent / "model.onnx")
    input_0 = numpy_helper.to_array(onnx.load_tensor(str(data_dir / "input_0.pb")))
    expected = numpy_helper.to_array(onnx.load_tensor(str(data_dir / "output_0.pb")))
    (output,) = run_onnxruntime(model, {"Input3": input_0})
    np.testing.assert_allclose(output, expected, rtol=1e-4, atol=1e-3)


def test_a_named_dim_fixed_by_one_shape_applies_to_every_input_that_shares_it():
    """Regression: --shape input_ids=1,7 left attention_mask (same dims batch, seq) at 1x1."""
    from relax_memplan.errors import ShapeSpecError
    from tests.conftest import shared_model

    from relax_memplan.frontend.prepare import STEP_NAMES

    _, info = import_onnx(shared_model("bert-tiny-randw.onnx"), {"input_ids": (1, 7)},
                          prepare_steps=STEP_NAMES)
    assert info.input_shapes == {"input_ids": (1, 7), "attention_mask": (1, 7), "token_type_ids": (1, 7)}
    assert info.defaulted_dims == {}
    with pytest.raises(ShapeSpecError, match="dim 'seq' is 7 in --shape input_ids but 8"):
        import_onnx(shared_model("bert-tiny-randw.onnx"), {"input_ids": (1, 7), "attention_mask": (1, 8)},
                    prepare_steps=STEP_NAMES)


# ----------------------------------------------------------------------------- dim semantics
def _run_static(mod, feeds):
    """Compile ``mod`` for llvm and run it on ``feeds`` (dict, graph input order)."""
    import tvm
    from tvm import relax

    vm = relax.VirtualMachine(tvm.compile(mod, "llvm"), tvm.cpu())
    out = vm["main"](*[tvm.runtime.tensor(v) for v in feeds.values()])
    return [out] if hasattr(out, "numpy") else list(out)


def _assert_matches_onnxruntime(model, mod, feeds):
    got = _run_static(mod, feeds)
    expected = run_onnxruntime(model, feeds)
    assert len(got) == len(expected)
    for out, ref in zip(got, expected):
        np.testing.assert_allclose(out.numpy(), ref, rtol=1e-5, atol=1e-5)


def _classifier_like(unnamed):
    """ppocr-cls's kind of input: [N, 3, H, W] with N, H, W all unnamed (``?`` or empty)."""
    dims = [unnamed, 3, unnamed, unnamed]
    model = tiny_model(
        [helper.make_node("ReduceMean", ["x"], ["m"], axes=[3], keepdims=1),
         helper.make_node("Sub", ["x", "m"], ["y"])],
        [tensor("x", TensorProto.FLOAT, dims)], [tensor("y", TensorProto.FLOAT, dims)],
        opset=13,
    )
    onnx.checker.check_model(model)
    return model


@pytest.mark.parametrize("unnamed", ["?", None], ids=["question-mark", "empty"])
def test_unnamed_dims_are_independent_of_each_other(unnamed):
    """Regression: --shape x=2,3,48,192 was refused ('the model declares them equal')."""
    model = _classifier_like(unnamed)
    mod, info = import_onnx(model, {"x": (2, 3, 48, 192)})
    assert info.input_shapes == {"x": (2, 3, 48, 192)} and info.defaulted_dims == {}
    assert main_param_shapes(mod) == {"x": (2, 3, 48, 192)}
    feeds = {"x": np.random.default_rng(0).standard_normal((2, 3, 48, 192), dtype=np.float32)}
    _assert_matches_onnxruntime(model, mod, feeds)


@pytest.mark.parametrize("unnamed", ["?", None], ids=["question-mark", "empty"])
def test_keep_dynamic_gives_each_unnamed_dim_its_own_var(unnamed):
    """Regression: TVM named every empty dim '' and made them one var (H == W == N)."""
    from tests.frontend.prepare.helpers import compile_and_compare, param_dims

    model = _classifier_like(unnamed)
    rng = np.random.default_rng(0)
    feeds = [{"x": rng.standard_normal(s, dtype=np.float32)} for s in ((1, 3, 8, 24), (2, 3, 16, 5))]
    mod = compile_and_compare(model, feeds)
    assert param_dims(mod) == ["x_dim0", 3, "x_dim2", "x_dim3"]
    _, info = import_onnx(model, keep_dynamic=True)
    assert info.defaulted_dims == {"x": ((0, "x_dim0"), (2, "x_dim2"), (3, "x_dim3"))}


def test_generated_dim_names_avoid_the_model_names():
    model = tiny_model([helper.make_node("Add", ["x", "z"], ["y"])],
                       [tensor("x", TensorProto.FLOAT, [None, 4]),
                        tensor("z", TensorProto.FLOAT, ["x_dim0", 4])],
                       [tensor("y", TensorProto.FLOAT, [None, 4])])
    _, info = import_onnx(model, keep_dynamic=True)
    assert info.defaulted_dims == {"x": ((0, "x_dim0_1"),), "z": ((0, "x_dim0"),)}


def test_a_named_dim_still_ties_dims_within_one_shape():
    model = tiny_model([helper.make_node("Relu", ["x"], ["y"])],
                       [tensor("x", TensorProto.FLOAT, ["n", "n"])],
                       [tensor("y", TensorProto.FLOAT, ["n", "n"])])
    with pytest.raises(ShapeSpecError, match="dim 'n' is 2 in --shape x but 3 in --shape x"):
        import_onnx(model, {"x": (2, 3)})


def _shape_selected_reshape(t_dims):
    """Reshape(t, Where(Equal(Shape(t)[1], 3), [2, 3], [3, 2])): foldable only when t's
    dims are known before the preparation steps run."""
    return tiny_model(
        [helper.make_node("Shape", ["t"], ["s"]),
         helper.make_node("Gather", ["s", "one"], ["d1"], axis=0),
         helper.make_node("Equal", ["d1", "three"], ["c"]),
         helper.make_node("Where", ["c", "a", "b"], ["target"]),
         helper.make_node("Reshape", ["t", "target"], ["y"], name="reshape")],
        [tensor("t", TensorProto.FLOAT, t_dims)], [tensor("y", TensorProto.FLOAT, ["r0", "r1"])],
        [numpy_helper.from_array(np.asarray(v, np.int64), n)
         for n, v in (("one", 1), ("three", 3), ("a", [2, 3]), ("b", [3, 2]))],
    )


def test_shape_reaches_the_preparation_steps():
    """Regression: --shape t=2,3 failed ('Reshape requires the input new shape to be
    Shape') where the model with [2, 3] written in imported."""
    written, _ = import_onnx(_shape_selected_reshape([2, 3]), prepare_steps=STEP_NAMES)
    model = _shape_selected_reshape(["a", "b"])
    given, _ = import_onnx(model, {"t": (2, 3)}, prepare_steps=STEP_NAMES)
    import tvm

    tvm.ir.assert_structural_equal(given, written)
    feeds = {"t": np.arange(6, dtype=np.float32).reshape(2, 3)}
    _assert_matches_onnxruntime(model, given, feeds)


def test_unnamed_dims_are_ranged_by_their_generated_names():
    """ppocr-cls's [?, 3, ?, ?]: H and W take different values at each sampled shape."""
    from relax_memplan.compile import BuildOptions, CheckOptions, compile_model

    ranges = {"x_dim0": (1, 2), "x_dim2": (8, 8), "x_dim3": (4, 40, 4)}
    report = compile_model(_classifier_like("?"), None, ranges,
                           options=BuildOptions(compare_with_tvm=False),
                           check=CheckOptions(sample_shapes=2, verify=True)).report
    assert [s.dims for s in report.shapes][:2] == [{"x_dim0": 1, "x_dim2": 8, "x_dim3": 4},
                                                  {"x_dim0": 2, "x_dim2": 8, "x_dim3": 40}]
    assert all(s.max_abs_error < 1e-5 for s in report.shapes)


def _relu_model(dims):
    graph = helper.make_graph(
        [helper.make_node("Relu", ["x"], ["y"])], "g",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, dims)],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, dims)])
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])


def test_static_dim_zero_is_an_empty_dim_not_a_symbolic_one():
    """Regression: an input [0, 16] was taken as a symbolic dim x_dim0 (set to 1), and
    onnxruntime's refusal of it was cut mid-sentence."""
    from relax_memplan.frontend.input_shapes import graph_inputs, input_dim_symbols

    model = _relu_model([0, 16])
    assert input_dim_symbols(graph_inputs(model)) == {"x": [0, 16]}
    with pytest.raises(ShapeSpecError, match=r"input 'x' has size 0 at axis 0 in the model "
                                             r"\(\[0, 16\]\)"):
        import_onnx(model)
    unset = _relu_model([None, 16])  # no dim_value and no dim_param: unknown, not 0
    assert input_dim_symbols(graph_inputs(unset)) == {"x": ["x_dim0", 16]}


def test_onnxruntime_refusal_keeps_its_whole_message():
    from relax_memplan.errors import ReferenceRunError
    from relax_memplan.frontend.reference import run_onnxruntime

    with pytest.raises(ReferenceRunError) as info:
        run_onnxruntime(_relu_model([2, 16]), {"x": np.ones((1, 16), "float32")})
    text = str(info.value)
    assert "for the following indices; index: 0 Got: 1 Expected: 2" in text, text
    assert "\n" not in text
