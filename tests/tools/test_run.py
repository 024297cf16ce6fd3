"""relax-memplan run: a library written by compile -o, run on .npy inputs in graph order."""

import numpy as np
import pytest
import tvm
from onnx import TensorProto, helper

from relax_memplan import get_pipeline, import_onnx
from relax_memplan.cli import EXIT_ERROR, main
from relax_memplan.compile import export_library
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


@pytest.mark.parametrize("flag", ["--output", "-o"])  # -o as compile's
def test_cli_run_prints_shapes_and_writes_npz(library, tmp_path, capsys, flag):
    np.save(tmp_path / "a.npy", np.ones((2, 4), "float32"))
    np.save(tmp_path / "b.npy", np.ones((2, 4), "float32"))
    out = tmp_path / "out.npz"
    status = main(["run", str(library), "--input", f"a={tmp_path / 'a.npy'}",
                   "--input", f"b={tmp_path / 'b.npy'}", flag, str(out)])
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


def test_cli_run_names_a_wrong_library_path_before_reading_any_input(tmp_path, capsys):
    # a number for an input needs the manifest: the path's own error must come first
    err = _one_line_error(capsys, ["run", str(tmp_path), "--input", "x=0"])
    assert "is a folder, not a library file" in err
    err = _one_line_error(capsys, ["run", str(tmp_path / "nope.so"), "--input", "x=0"])
    assert "no such library file" in err
    model = tmp_path / "m.onnx"
    model.write_bytes(_two_input_model().SerializeToString())
    err = _one_line_error(capsys, ["run", str(model), "--input", "a=0"])
    assert "is an ONNX model, not a compiled library" in err and "compile" in err


def _static_gather_model():
    """y = table[ids], ids: int64 [5, 3] (a static batch of 5), table a [10, 4] initializer."""
    table = helper.make_tensor("t", TensorProto.FLOAT, [10, 4], np.arange(40, dtype="float32"))
    graph = helper.make_graph(
        [helper.make_node("Gather", ["t", "ids"], ["y"], axis=0)], "g",
        [helper.make_tensor_value_info("ids", TensorProto.INT64, [5, 3])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [5, 3, 4])], initializer=[table])
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])


@pytest.fixture(scope="module")
def static_library(tmp_path_factory):
    mod, _ = import_onnx(_static_gather_model())
    ex = tvm.compile(mod, "llvm", relax_pipeline=get_pipeline("llvm"))
    path = tmp_path_factory.mktemp("run_static") / "gather.so"
    export_library(ex, path)
    return path


def _run_error(capsys, library, tmp_path, **arrays) -> str:
    argv = ["run", str(library)]
    for name, value in arrays.items():
        np.save(tmp_path / f"{name}.npy", value)
        argv += ["--input", f"{name}={tmp_path / (name + '.npy')}"]
    return _one_line_error(capsys, argv)


def test_cli_run_wrong_static_shape_names_input_and_expected_shape(static_library, tmp_path,
                                                                   capsys):
    err = _run_error(capsys, static_library, tmp_path, ids=np.zeros((1, 3), "int64"))
    assert err.endswith("input ids has shape (1, 3); the library expects (5, 3)"), err
    err = _run_error(capsys, static_library, tmp_path, ids=np.zeros((5,), "int64"))
    assert err.endswith("input ids has shape (5,); the library expects (5, 3)"), err


def test_cli_run_wrong_dtype_names_input_and_expected_dtype(static_library, tmp_path, capsys):
    err = _run_error(capsys, static_library, tmp_path, ids=np.zeros((5, 3), "float32"))
    assert err.endswith("input ids has dtype float32; the library expects int64"), err


def test_cli_run_symbolic_dim_mismatch_names_bound_value(library, tmp_path, capsys):
    """Review: the message said 'dim 0 was bound to 3', naming the axis as if it were the dim;
    it names the symbolic dim (n), the input and its axis."""
    err = _run_error(capsys, library, tmp_path, a=np.ones((3, 4), "float32"),
                     b=np.ones((2, 4), "float32"))
    assert err.endswith("input b has shape (2, 4); the library expects (n, 4): axis 0 of b is "
                        "the symbolic dim n, which an earlier input set to 3"), err
    err = _run_error(capsys, library, tmp_path, a=np.ones((3, 5), "float32"),
                     b=np.ones((3, 4), "float32"))
    assert err.endswith("input a has shape (3, 5); the library expects (n, 4)"), err


def test_cli_run_onnx_model_says_compile_it_first(tmp_path, capsys):
    import onnx

    model = tmp_path / "model.onnx"
    onnx.save(_two_input_model(), model)
    err = _one_line_error(capsys, ["run", str(model)])
    assert err.endswith(f"{model} is an ONNX model, not a compiled library: compile it first "
                        f"with `relax-memplan compile {model} -o {tmp_path / 'model.so'}`"), err


def test_cli_run_onnx_model_in_a_read_only_folder_suggests_a_library_here(tmp_path, capsys,
                                                                          monkeypatch):
    """Regression: for ../shared/models/x.onnx (read-only) the hint wrote -o there."""
    import os

    import onnx

    model = tmp_path / "model.onnx"
    onnx.save(_two_input_model(), model)
    real_access = os.access
    monkeypatch.setattr(os, "access", lambda p, mode: False if os.fspath(p) == str(tmp_path)
                        and mode == os.W_OK else real_access(p, mode))
    err = _one_line_error(capsys, ["run", str(model)])
    assert err.endswith(f"compile it first with `relax-memplan compile {model} -o model.so`"), err


@pytest.mark.skipif(tvm.cuda(0).exist, reason="the message is for a machine without a CUDA GPU")
def test_cli_run_cuda_library_without_gpu_says_it_needs_cuda(tmp_path, capsys):
    import onnx

    lib, model = tmp_path / "x.so", tmp_path / "m.onnx"
    onnx.save(_two_input_model(), model)  # incidental: a small model, not the example CNN
    assert main(["compile", str(model), "--shape", "a=2,4", "--shape", "b=2,4", "-q",
                 "--target", "cuda", "--cuda-arch", "sm_80", "-o", str(lib)]) == 0
    capsys.readouterr()
    err = _one_line_error(capsys, ["run", str(lib)])
    assert err.endswith(f"{lib}: the library was built for CUDA and needs a CUDA GPU; no CUDA "
                        "GPU is available here (tvm.cuda(0).exist is false)"), err


def test_cli_run_decides_by_content_not_extension(library, tmp_path, capsys):
    """Regression: `run` decided by the file name: an ONNX model renamed .so reached TVM's
    loader, a library renamed .onnx was called an ONNX model."""
    import onnx

    renamed_model = tmp_path / "model.so"
    onnx.save(_two_input_model(), renamed_model)
    err = _one_line_error(capsys, ["run", str(renamed_model)])
    assert f"{renamed_model} is an ONNX model, not a compiled library" in err, err
    renamed_lib = tmp_path / "lib.onnx"
    renamed_lib.write_bytes(library.read_bytes())
    err = _one_line_error(capsys, ["run", str(renamed_lib)])
    assert err.endswith(f"{renamed_lib} is a compiled library (ELF) without a library "
                        "extension: tvm.runtime.load_module picks its loader by the extension; "
                        "rename it to end in .so"), err
    garbage = tmp_path / "junk.so"  # neither: TVM's loader error, as before
    garbage.write_bytes(b"not a library")
    assert "is an ONNX model" not in _one_line_error(capsys, ["run", str(garbage)])


@pytest.mark.parametrize("command", ["compile", "inspect", "bench"])
def test_a_compiled_library_given_as_a_model_says_use_run(library, capsys, command):
    """Regression: compile lib.so / inspect lib.so said "Wire format was corrupt"."""
    err = _one_line_error(capsys, [command, str(library)])
    assert err == (f"relax-memplan: error: {library} is a compiled library (ELF), not an ONNX "
                   f"model: {command} reads an .onnx file; use `relax-memplan run {library}` to "
                   "run a library"), err


def test_cli_run_output_into_a_missing_folder_says_it_created_it(library, tmp_path, capsys):
    """Regression: run --output into a missing folder created it without a word; compile's
    outputs say so (the same helper, cli_args.check_output_path)."""
    a, b = tmp_path / "a.npy", tmp_path / "b.npy"
    np.save(a, np.ones((2, 4), "float32"))
    np.save(b, np.ones((2, 4), "float32"))
    out = tmp_path / "new" / "deep" / "out.npz"
    assert main(["run", str(library), "--input", f"a={a}", "--input", f"b={b}",
                 "--output", str(out)]) == 0
    assert capsys.readouterr().err == (f"relax-memplan: --output {out}: created missing folder "
                                       f"{tmp_path / 'new'}\n")
    assert np.load(out)["output0"].shape == (2, 4)



@pytest.mark.parametrize("keep", [5000, "quarter", "half", "all_but_one"])
def test_cli_run_truncated_library_is_one_line_not_a_bus_error(library, tmp_path, capsys, keep):
    """Regression: ``head -c N lib.so > tr.so; run tr.so`` died of SIGBUS (exit 135)."""
    data = library.read_bytes()
    n = {"quarter": len(data) // 4, "half": len(data) // 2, "all_but_one": len(data) - 1}.get(keep, keep)
    truncated = tmp_path / "tr.so"
    truncated.write_bytes(data[:n])
    err = _one_line_error(capsys, ["run", str(truncated)])
    assert "truncated or corrupt library" in err and f"file is {n} bytes" in err


def test_elf_check_passes_a_whole_library_and_refuses_a_cut_loadable_segment(library, tmp_path):
    import struct

    from relax_memplan.errors import ModelLoadError
    from relax_memplan.library.elf import check_elf_complete

    check_elf_complete(library)  # the whole file: no error
    data = bytearray(library.read_bytes())
    struct.pack_into("<H", data, 60, 0)  # e_shnum = 0: only the program headers remain
    phoff = struct.unpack_from("<Q", data, 32)[0]
    cut = phoff + 56 * struct.unpack_from("<H", data, 56)[0] + 1
    path = tmp_path / "cut.so"
    path.write_bytes(bytes(data[:cut]))
    with pytest.raises(ModelLoadError, match="loadable segment"):
        check_elf_complete(path)
