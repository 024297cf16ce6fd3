"""relax-memplan inspect: inputs with symbolic dims, op counts, unsupported ops, --dim flags."""

import json

import numpy as np

from onnx import TensorProto, helper

from relax_memplan.cli import main
from relax_memplan.tools.inspect import inspect_onnx
from tests.frontend.test_suggested_ranges import _fpn_model


def _model(tmp_path):
    """Relu, Det (TVM has no converter) and Relu; inputs x [batch, seq, ?] and ids [batch, 7]."""
    graph = helper.make_graph(
        [helper.make_node("Relu", ["x"], ["r"]), helper.make_node("Det", ["r"], ["y"]),
         helper.make_node("Relu", ["r"], ["z"])], "g",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["batch", "seq", None]),
         helper.make_tensor_value_info("ids", TensorProto.INT64, ["batch", 7])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, ["batch"]),
         helper.make_tensor_value_info("z", TensorProto.FLOAT, ["batch", "seq", None])])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    path = tmp_path / "m.onnx"
    path.write_bytes(model.SerializeToString())
    return path


def test_summary_names_dims_ops_and_unsupported_ops(tmp_path):
    summary = inspect_onnx(_model(tmp_path))
    assert [(i.name, i.dtype, i.dims) for i in summary.inputs] == [
        ("x", "float32", ["batch", "seq", "x_dim2"]), ("ids", "int64", ["batch", 7])]
    assert summary.opsets == {"": 17}
    assert summary.op_counts == {"Relu": 2, "Det": 1}
    assert summary.unsupported_ops == {"Det": 1}
    assert summary.symbolic_dims == ["batch", "seq", "x_dim2"]
    assert summary.dim_flags() == "--dim batch=1..8 --dim seq=1..128 --dim x_dim2=1..64"


def test_cli_inspect_text_and_json(tmp_path, capsys):
    path = _model(tmp_path)
    assert main(["inspect", str(path)]) == 0
    text = capsys.readouterr().out
    assert "ops TVM cannot import: Det (1 node)" in text
    assert "placeholder" in text and "--dim batch=1..8" in text
    assert main(["inspect", str(path), "--json"]) == 0
    data = json.loads(capsys.readouterr().out)
    assert data["unsupported_ops"] == {"Det": 1}
    assert data["suggested_dims"]["seq"] == "1..128"


def test_cli_inspect_takes_quiet_and_verbose_as_the_other_commands(tmp_path, capsys):
    path = _model(tmp_path)
    assert main(["inspect", str(path)]) == 0
    full = capsys.readouterr()
    for flag in ("-q", "-v"):
        assert main(["inspect", str(path), flag]) == 0
        out = capsys.readouterr()
        assert out.out == full.out  # the summary is the output: never dropped
        if flag == "-q":
            assert out.err == ""


def _recurrent_model(tmp_path):
    """LSTM (our step recurrent converts it), RNN (nothing converts it) and Relu."""
    hidden, features = 4, 3
    weight = lambda name, *shape: helper.make_tensor(name, TensorProto.FLOAT, shape,
                                                     [0.1] * int(np.prod(shape)))
    graph = helper.make_graph(
        [helper.make_node("LSTM", ["x", "W", "R"], ["y", "h"], hidden_size=hidden),
         helper.make_node("RNN", ["x", "Wr", "Rr"], ["yr", "hr"], hidden_size=hidden),
         helper.make_node("Relu", ["h"], ["z"])], "g",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["time", 1, features])],
        [helper.make_tensor_value_info("z", TensorProto.FLOAT, [1, 1, hidden]),
         helper.make_tensor_value_info("hr", TensorProto.FLOAT, [1, 1, hidden])],
        [weight("W", 1, 4 * hidden, features), weight("R", 1, 4 * hidden, hidden),
         weight("Wr", 1, hidden, features), weight("Rr", 1, hidden, hidden)])
    path = tmp_path / "rnn.onnx"
    path.write_bytes(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
                     .SerializeToString())
    return path


def test_ops_our_converter_steps_import_are_not_unsupported(tmp_path, capsys):
    path = _recurrent_model(tmp_path)
    summary = inspect_onnx(path)
    assert summary.converted_ops == {"LSTM": {"step": "recurrent", "nodes": 1}}
    assert summary.unsupported_ops == {"RNN": 1}
    assert main(["inspect", str(path)]) == 0
    text = capsys.readouterr().out
    assert "ops imported through relax_memplan's converters: LSTM (1 node, step recurrent)" in text
    assert "ops TVM cannot import: RNN (1 node)" in text


def test_loops_name_the_form_they_take_not_only_the_step():
    """Regression: inspect said "Loop (1 node, step unroll_loops)" for a loop whose trip
    count is an input, which takes the recursive form (a body function per iteration)."""
    from relax_memplan.tools.inspect import inspect_onnx, loop_forms
    from tests.frontend.prepare.loop_models import loop_model, scan_model

    assert loop_forms(loop_model(trip=5)) == {"Loop": {"unrolled": 1}}
    assert loop_forms(loop_model(trip=65)) == {"Loop": {"recursive": 1}}  # above 64
    assert loop_forms(loop_model(trip_as_input=True)) == {"Loop": {"recursive": 1}}
    assert loop_forms(scan_model(length=6)) == {"Scan": {"unrolled": 1}}
    assert loop_forms(scan_model(seq="seq")) == {"Scan": {"recursive": 1}}
    text = inspect_onnx(loop_model(trip_as_input=True)).format_text()
    assert ("Loop (1 node, step unroll_loops: 1 recursive: a body function per iteration)"
            in text), text
    assert "step unroll_loops: 1 unrolled)" in inspect_onnx(loop_model(trip=5)).format_text()


def test_image_dims_are_suggested_on_the_downsampling_grid_whatever_their_names():
    """Regression: ppocrv4-det's dims (p2o.DynamicDimension.1) got 1..64, which the model
    cannot take; the compile failed after 85 s of builds."""
    summary = inspect_onnx(_fpn_model((2, 4), 4.0))
    assert summary.suggested_dims == {"n": "1..8", "rows": "8..80:8", "cols": "8..80:8"}
    from tests.conftest import shared_model

    ppocr = inspect_onnx(shared_model("ppocrv4-det.onnx"))
    assert ppocr.dim_flags() == ("--dim p2o.DynamicDimension.0=1..8 "
                                 "--dim p2o.DynamicDimension.1=32..320:32 "
                                 "--dim p2o.DynamicDimension.2=32..320:32")
