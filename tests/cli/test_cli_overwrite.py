"""Regression: an output path naming the input model (or another output) overwrote it.

Every case is refused before any work with one line naming both paths; the file is unchanged.
"""

import os

import pytest
from onnx import TensorProto, helper

from relax_memplan.cli import EXIT_ERROR, main


def _model_bytes() -> bytes:
    node = helper.make_node("Relu", ["x"], ["y"])
    graph = helper.make_graph([node], "g",
                              [helper.make_tensor_value_info("x", TensorProto.FLOAT, [2, 4])],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, [2, 4])])
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)]).SerializeToString()


def _refused(capsys, argv):
    status = main(argv)
    err = capsys.readouterr().err.strip()
    assert status == EXIT_ERROR, err
    assert len(err.splitlines()) == 1, err
    return err


@pytest.mark.parametrize("name, argv, words", [
    ("m.onnx", ["compile", "{m}", "--report", "{m}"], "--report {m} is the model {m}"),
    ("m.png", ["compile", "{m}", "--plot", "{m}"], "--plot {m} is the model {m}"),
    ("x.so", ["compile", "{m}", "-o", "{m}"], "-o {m} is the model {m}"),
    ("m.onnx", ["compile", "{m}", "-o", "{d}/a.so", "--report", "{d}/./a.so"],
     "--report {d}/./a.so and -o {d}/a.so are the same file"),
    ("m.onnx", ["compile", "{m}", "--dump-ir", "{m}"], "--dump-ir {m} is the model {m}"),
    ("m.onnx", ["bench", "{m}", "--json", "{m}"], "--json {m} is the model {m}"),
    ("m.npz", ["run", "{m}", "--output", "{m}"], "--output {m} is the library {m}"),
])
def test_an_output_naming_the_input_or_another_output_is_refused(capsys, tmp_path, name, argv,
                                                                   words):
    model = tmp_path / name
    model.write_bytes(_model_bytes())
    argv = [a.format(m=model, d=tmp_path) for a in argv] + ["-q"] * (argv[0] != "run")
    err = _refused(capsys, argv)
    assert err == (f"relax-memplan: error: {words.format(m=model, d=tmp_path)}: "
                   + ("it would be overwritten; choose another output name" if " is the " in words
                      else "give each output its own name")), err
    assert model.read_bytes() == _model_bytes()
    assert sorted(p.name for p in tmp_path.iterdir()) == [name]


def test_a_link_to_the_model_and_a_config_or_npy_input_are_inputs_too(capsys, tmp_path):
    model = tmp_path / "m.onnx"
    model.write_bytes(_model_bytes())
    os.symlink(model, tmp_path / "link.json")
    err = _refused(capsys, ["compile", str(model), "-q", "--report", str(tmp_path / "link.json")])
    assert f"--report {tmp_path / 'link.json'} is the model {model}" in err
    config = tmp_path / "c.yaml"
    config.write_text("target: llvm\n")
    err = _refused(capsys, ["bench", str(model), "-q", "--config", str(config),
                            "--json", str(config)])
    assert f"--json {config} is the config {config}" in err
    assert config.read_text() == "target: llvm\n"
    err = _refused(capsys, ["compile", str(model), "-q", "--input", f"x={tmp_path}/x.npy",
                            "--report", f"{tmp_path}/x.npy"])
    assert f"--report {tmp_path}/x.npy is the --input x {tmp_path}/x.npy" in err


def test_run_hint_for_an_onnx_model_named_so_suggests_another_name(capsys, tmp_path):
    model = tmp_path / "x.so"
    model.write_bytes(_model_bytes())
    err = _refused(capsys, ["run", str(model)])
    assert err.endswith(f"compile it first with `relax-memplan compile {model} -o "
                        f"{tmp_path / 'x_lib.so'}`"), err
