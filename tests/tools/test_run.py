"""relax-memplan run: a library written by compile -o, run on .npy inputs in graph order."""

import numpy as np
import pytest
import tvm
from onnx import TensorProto, helper

from relax_memplan import get_pipeline, import_onnx
from relax_memplan.cli import EXIT_ERROR, main
from relax_memplan.compiler import export_library
from relax_memplan.tools.run import run_library


def _two_input_model():
    """y = relu(a) - b, a: [n, 4] with a symbolic n, b: [n, 4]; the inputs in that order."""
    node_relu = helper.make_node("Relu", ["a"], ["r"])
    node_sub = helper.make_node("Sub", ["r", "b"], ["y"])
    graph = helper.make_graph(
        [node_relu, node_sub], "g",
        [helper.make_tensor_value_info("a", TensorProto.FLOAT, ["n", 4]),
         helper.make_tensor_value_info("b", TensorProto.FLOAT, ["n", 4])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, ["n", 4])])
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])


@pytest.fixture(scope="module")
def library(tmp_path_factory):
    """The model built with n in [1, 8] (a run-time range check), written to a .so."""
    mod, _ = import_onnx(_two_input_model(), keep_dynamic=True)
    ex = tvm.compile(mod, "llvm", relax_pipeline=get_pipeline("llvm", dim_ranges={"n": (1, 8)}))
    path = tmp_path_factory.mktemp("run") / "lib.so"
    export_library(ex, path)
    return path


def test_run_library_takes_inputs_by_name_in_graph_order(library):
    a = np.array([[-1, 2, -3, 4]] * 3, "float32")
    b = np.ones((3, 4), "float32")
    result = run_library(library, {"b": b, "a": a})
    assert result.param_names == ["a", "b"]
    np.testing.assert_allclose(result.outputs[0], np.maximum(a, 0) - b)


def test_cli_run_prints_shapes_and_writes_npz(library, tmp_path, capsys):
    np.save(tmp_path / "a.npy", np.ones((2, 4), "float32"))
    np.save(tmp_path / "b.npy", np.ones((2, 4), "float32"))
    out = tmp_path / "out.npz"
    status = main(["run", str(library), "--input", f"a={tmp_path / 'a.npy'}",
                   "--input", f"b={tmp_path / 'b.npy'}", "--output", str(out)])
    assert status == 0
    assert "output0: float32 [2, 4]" in capsys.readouterr().out
    np.testing.assert_array_equal(np.load(out)["output0"], np.zeros((2, 4), "float32"))


def _one_line_error(capsys, argv) -> str:
    assert main(argv) == EXIT_ERROR
    err = capsys.readouterr().err.strip()
    assert "\n" not in err and err.startswith("relax-memplan: error: "), err
    return err


def test_cli_run_dim_outside_declared_range_is_one_line(library, tmp_path, capsys):
    np.save(tmp_path / "a.npy", np.ones((9, 4), "float32"))
    np.save(tmp_path / "b.npy", np.ones((9, 4), "float32"))
    err = _one_line_error(capsys, ["run", str(library), "--input", f"a={tmp_path / 'a.npy'}",
                                   "--input", f"b={tmp_path / 'b.npy'}"])
    assert "outside its declared range [1, 8]" in err


def test_cli_run_missing_input_and_missing_library_are_one_line(library, tmp_path, capsys):
    np.save(tmp_path / "a.npy", np.ones((2, 4), "float32"))
    err = _one_line_error(capsys, ["run", str(library), "--input", f"a={tmp_path / 'a.npy'}"])
    assert "missing input(s) b; main takes a, b" in err
    err = _one_line_error(capsys, ["run", str(tmp_path / "nope.so")])
    assert "no such library file" in err
