"""relax-memplan compile --verify: never a silent wrong answer (issue 8, sections 1 and 3).

A corrupted reference fails (exit 3) with and without --dim; NaN/Inf are compared by
position; a reference that ignores the input is flagged; onnxruntime refusing the inputs,
a run-time failure and Ctrl-C are one line each.
"""

import json
import os
import signal
import subprocess
import sys
import textwrap
from pathlib import Path

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper

from relax_memplan import frontend
from relax_memplan.cli import EXIT_ERROR, EXIT_INTERRUPTED, EXIT_VERIFY_FAILED, main
from relax_memplan.compile import sample_dims as _sample_dims

REPO_ROOT = Path(__file__).resolve().parents[2]


def _save(tmp_path, name, nodes, inputs, outputs, initializers=()):
    graph = helper.make_graph(nodes, name, inputs, outputs, initializer=list(initializers))
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 13)])
    onnx.checker.check_model(model)
    path = tmp_path / f"{name}.onnx"
    onnx.save(model, path)
    return str(path)


def _matmul_model(tmp_path, dim="n"):
    """y[dim, 3] = tanh(x[dim, 4] @ w): depends on its input; ``dim`` symbolic."""
    w = helper.make_tensor("w", TensorProto.FLOAT, [4, 3],
                           np.random.default_rng(0).standard_normal(12).tolist())
    return _save(tmp_path, "mm", [helper.make_node("MatMul", ["x", "w"], ["h"]),
                                  helper.make_node("Tanh", ["h"], ["y"])],
                 [helper.make_tensor_value_info("x", TensorProto.FLOAT, [dim, 4])],
                 [helper.make_tensor_value_info("y", TensorProto.FLOAT, [dim, 3])], [w])


def _constant_model(tmp_path):
    """y = c + 0 * x: the output ignores the input."""
    zero = helper.make_tensor("zero", TensorProto.FLOAT, [], [0.0])
    c = helper.make_tensor("c", TensorProto.FLOAT, [4], [1.0, 2.0, 3.0, 4.0])
    return _save(tmp_path, "const", [helper.make_node("Mul", ["x", "zero"], ["h"]),
                                     helper.make_node("Add", ["h", "c"], ["y"])],
                 [helper.make_tensor_value_info("x", TensorProto.FLOAT, [2, 4])],
                 [helper.make_tensor_value_info("y", TensorProto.FLOAT, [2, 4])], [zero, c])


def _sqrt_model(tmp_path):
    """sqrt of a random normal input: NaN where the input is negative, on both sides."""
    return _save(tmp_path, "sqrt", [helper.make_node("Sqrt", ["x"], ["y"])],
                 [helper.make_tensor_value_info("x", TensorProto.FLOAT, [4, 8])],
                 [helper.make_tensor_value_info("y", TensorProto.FLOAT, [4, 8])])


def _gather_model(tmp_path):
    """rows of a (10, 4) table picked by int64 ids: an id >= 10 is beyond the table."""
    table = helper.make_tensor("table", TensorProto.FLOAT, [10, 4], np.arange(40.0).tolist())
    return _save(tmp_path, "gather", [helper.make_node("Gather", ["table", "ids"], ["y"], axis=0)],
                 [helper.make_tensor_value_info("ids", TensorProto.INT64, [2])],
                 [helper.make_tensor_value_info("y", TensorProto.FLOAT, [2, 4])], [table])


def _shifted_reference(monkeypatch, shift=0.0, nan=False):
    real = frontend.run_onnxruntime

    def corrupted(model, inputs):
        outs = [np.array(o, dtype=o.dtype) for o in real(model, inputs)]
        outs[0] = outs[0] + np.asarray(shift, outs[0].dtype)
        if nan:
            outs[0].flat[0] = np.nan
        return outs

    monkeypatch.setattr(frontend, "run_onnxruntime", corrupted)


def _one_line(capsys, status, expected_status, prefix="relax-memplan: error: "):
    err = capsys.readouterr().err.strip()
    assert status == expected_status, err
    assert "Traceback" not in err
    lines = [line for line in err.splitlines() if not line.startswith("[relax-memplan]")]
    assert len(lines) == 1, err
    assert lines[0].startswith(prefix)
    return lines[0]


# --- a corrupted reference fails, static and dynamic ------------------------------------------
@pytest.mark.parametrize("shift, nan", [(1e-2, False), (0.0, True)])
def test_corrupted_reference_fails_static(monkeypatch, capsys, tmp_path, shift, nan):
    _shifted_reference(monkeypatch, shift, nan)
    report = tmp_path / "r.json"
    # the model is incidental (the verdict is checked): a small matmul, not the example CNN
    status = main(["compile", _matmul_model(tmp_path, dim=2), "--verify", "-q", "--time-limit",
                   "0.2", "--report", str(report)])
    assert status == EXIT_VERIFY_FAILED
    captured = capsys.readouterr()
    assert "FAILED" in captured.out
    # with -q and stdout redirected the failure must still be seen: one line on stderr
    assert captured.err.count("\n") == 1 and captured.err.startswith(
        "relax-memplan: error: verification against onnxruntime failed"), captured.err
    data = json.loads(report.read_text())
    assert data["verified"] is False
    assert data["nonfinite_mismatches"] == (1 if nan else 0)


@pytest.mark.parametrize("shift, nan", [(1e-2, False), (0.0, True)])
def test_corrupted_reference_fails_dynamic(monkeypatch, capsys, tmp_path, shift, nan):
    """Regression: --verify with --dim applied no tolerance and always exited 0."""
    _shifted_reference(monkeypatch, shift, nan)
    report = tmp_path / "d.json"
    status = main(["compile", _matmul_model(tmp_path), "--dim", "n=1..8", "--sample-shapes", "2",
                   "--verify", "-q", "--time-limit", "0.2", "--report", str(report)])
    assert status == EXIT_VERIFY_FAILED
    out = capsys.readouterr().out
    rows = [line for line in out.splitlines() if line.strip().startswith("n=")]
    assert len(rows) == 2 and all(row.endswith("  FAILED") for row in rows), out
    if nan:
        assert "at n=1: max abs error" in out and "NaN/Inf on one side only" in out
    data = json.loads(report.read_text())
    assert data["verified"] is False
    assert [s["verified"] for s in data["shapes"]] == [False, False]


def _two_scale_model(tmp_path):
    """y = tanh(x) (values in [-1, 1]) and z = x * 1e6: two outputs of very different scales."""
    big = helper.make_tensor("big", TensorProto.FLOAT, [], [1e6])
    return _save(tmp_path, "two_scale", [helper.make_node("Tanh", ["x"], ["y"]),
                                         helper.make_node("Mul", ["x", "big"], ["z"])],
                 [helper.make_tensor_value_info("x", TensorProto.FLOAT, [2, 4])],
                 [helper.make_tensor_value_info("y", TensorProto.FLOAT, [2, 4]),
                  helper.make_tensor_value_info("z", TensorProto.FLOAT, [2, 4])], [big])


def test_a_large_output_does_not_hide_an_error_in_a_small_one(monkeypatch, capsys, tmp_path):
    """Regression: one tolerance over all outputs came from the largest one
    (1e6 scale here), so a 0.05 error in tanh's output passed as OK."""
    _shifted_reference(monkeypatch, 0.05)
    report = tmp_path / "r.json"
    status = main(["compile", _two_scale_model(tmp_path), "--verify", "-q", "--report", str(report)])
    assert status == EXIT_VERIFY_FAILED
    assert "FAILED" in capsys.readouterr().out
    assert json.loads(report.read_text())["verified"] is False


def test_dynamic_verify_passes_per_shape_with_tolerance(capsys, tmp_path):
    report = tmp_path / "d.json"
    status = main(["compile", _matmul_model(tmp_path), "--dim", "n=1..8", "--sample-shapes", "3",
                   "--verify", "-q", "--time-limit", "0.2", "--report", str(report)])
    assert status == 0
    rows = [line for line in capsys.readouterr().out.splitlines() if line.strip().startswith("n=")]
    assert len(rows) == 3 and all(row.endswith("  OK") for row in rows)
    data = json.loads(report.read_text())
    assert data["verified"] is True
    for s in data["shapes"]:
        assert s["verified"] is True and s["max_abs_error"] <= s["error_tolerance"]
        assert s["input_sensitivity"]["weak"] is False


def test_sampled_shapes_are_distinct():
    """Regression: --dim n=3..3 --sample-shapes 4 ran n=3 twice."""
    assert _sample_dims({"n": (3, 3)}, 4, seed=0) == [{"n": 3}]
    assert _sample_dims({"n": (1, 3)}, 4, seed=0) == [{"n": 1}, {"n": 3}, {"n": 2}]
    many = _sample_dims({"n": (1, 100), "m": (2, 2)}, 6, seed=0)
    assert len(many) == 6 and len({tuple(p.values()) for p in many}) == 6
    assert many[:2] == [{"n": 1, "m": 2}, {"n": 100, "m": 2}]


# --- NaN / Inf ---------------------------------------------------------------------------------
def test_matching_nan_positions_pass_with_a_note(capsys, tmp_path):
    """Regression: NaN on both sides printed 'tolerance nan FAILED'."""
    report = tmp_path / "r.json"
    status = main(["compile", _sqrt_model(tmp_path), "--verify", "-q", "--report", str(report)])
    out = capsys.readouterr().out
    assert status == 0, out
    assert "the inputs produced non-finite values" in out and "tolerance nan" not in out
    data = json.loads(report.read_text())
    assert data["verified"] is True and data["nonfinite_matched"] > 0
    assert data["nonfinite_mismatches"] == 0


# --- input sensitivity -------------------------------------------------------------------------
def test_output_that_ignores_its_input_is_flagged(capsys, tmp_path):
    report = tmp_path / "r.json"
    status = main(["compile", _constant_model(tmp_path), "--verify", "-q", "--report", str(report)])
    out = capsys.readouterr().out
    assert status == 0
    assert "WARNING: the output barely depends on the input: verification is weak" in out
    data = json.loads(report.read_text())
    assert data["input_sensitivity"] == {"max_abs_change": 0.0, "nonfinite_changes": 0, "weak": True}


def test_output_that_depends_on_its_input_is_not_flagged(capsys, tmp_path):
    report = tmp_path / "r.json"
    status = main(["compile", _matmul_model(tmp_path, dim=2), "--verify", "-q",
                   "--report", str(report)])
    assert status == 0
    assert "WARNING" not in capsys.readouterr().out
    data = json.loads(report.read_text())
    assert data["input_sensitivity"]["weak"] is False
    assert data["input_sensitivity"]["max_abs_change"] > data["error_tolerance"]


# --- one-line failures -------------------------------------------------------------------------
def test_onnxruntime_refusing_the_inputs_is_one_line(capsys, tmp_path):
    ids = tmp_path / "ids.npy"
    np.save(ids, np.array([1, 999999], np.int64))
    line = _one_line(capsys, main(["compile", _gather_model(tmp_path), "--verify", "-q",
                                   "--input", f"ids={ids}"]), EXIT_ERROR)
    assert "onnxruntime (the reference) refused the inputs (ids(2,))" in line
    assert "999999" in line


def test_onnxruntime_refusing_the_inputs_is_one_line_with_dim(capsys, tmp_path, monkeypatch):
    """With --dim the reference runs before our build at each shape."""
    import relax_memplan.compile.measure as measure

    def never(*_args, **_kw):
        raise AssertionError("our build ran before the reference")

    monkeypatch.setattr(measure, "run_checked", never)
    w = helper.make_tensor("table", TensorProto.FLOAT, [10, 4], np.arange(40.0).tolist())
    model = _save(tmp_path, "gdyn", [helper.make_node("Gather", ["table", "ids"], ["y"], axis=0)],
                  [helper.make_tensor_value_info("ids", TensorProto.INT64, ["n"])],
                  [helper.make_tensor_value_info("y", TensorProto.FLOAT, ["n", 4])], [w])
    real = frontend.make_random_inputs
    monkeypatch.setattr(frontend, "make_random_inputs", lambda *a, **k: {
        n: v + 999999 for n, v in real(*a, **k).items()})
    line = _one_line(capsys, main(["compile", model, "--dim", "n=1..2", "--verify", "-q",
                                   "--no-prepare", "--time-limit", "0.2"]), EXIT_ERROR)
    assert "onnxruntime (the reference) refused the inputs" in line


def test_runtime_failure_is_one_line_naming_function_and_shapes(capsys, tmp_path, monkeypatch):
    import tvm
    import relax_memplan.runtime.vm as runtime

    def fails(*_args, **_kw):
        raise tvm.error.InternalError("Check failed: (x) is false: boom\n  0: some frame\n")

    monkeypatch.setattr(runtime, "run_and_measure", fails)
    line = _one_line(capsys, main(["compile", _matmul_model(tmp_path, dim=2), "-q"]), EXIT_ERROR)
    assert line == ("relax-memplan: error: running main of relax_memplan's build at inputs (2, 4) "
                    "failed: boom")


# --- Ctrl-C -----------------------------------------------------------------------------------
def test_interrupt_in_the_run_step_is_one_line(capsys, monkeypatch, tmp_path):
    import relax_memplan.compile.measure as measure

    def interrupted(*_args, **_kw):
        raise KeyboardInterrupt

    monkeypatch.setattr(measure, "run_checked", interrupted)
    _one_line(capsys, main(["compile", _matmul_model(tmp_path, dim=2), "-q", "--time-limit",
                            "0.2"]), EXIT_INTERRUPTED, prefix="relax-memplan: interrupted")


def test_interrupt_inside_the_vm_call_is_one_line(capsys, monkeypatch, tmp_path):
    """Regression: a KeyboardInterrupt raised in the VM's instrument hook reaches us as a bare
    RuntimeError from TVM's FFI, and printed a traceback."""
    import relax_memplan.runtime.vm as runtime

    def interrupted(_args):
        raise KeyboardInterrupt

    monkeypatch.setattr(runtime, "_storage_bytes", interrupted)
    _one_line(capsys, main(["compile", _matmul_model(tmp_path, dim=2), "-q", "--time-limit",
                            "0.2"]), EXIT_INTERRUPTED, prefix="relax-memplan: interrupted")


def test_interrupt_swallowed_inside_the_build_still_stops(capsys, monkeypatch, tmp_path):
    """Regression: a Ctrl-C during the build that TVM's FFI turned into
    another error and a fallback swallowed let the compile finish, write -o and exit 0."""
    import signal

    import contextlib

    import relax_memplan.cli.entry as cli
    import relax_memplan.compile.model as compile_model

    real = compile_model.build

    def build_with_swallowed_interrupt(*args, **kw):
        try:
            os.kill(os.getpid(), signal.SIGINT)
        except BaseException:  # noqa: BLE001 - what an `except Exception` behind the FFI does
            pass
        return real(*args, **kw)

    monkeypatch.setattr(compile_model, "build", build_with_swallowed_interrupt)
    # the path under test is the main thread's; exit_on_interrupt's helper would end this
    # (pytest's) process when the build runs past its grace (tests/cli/test_interrupt.py)
    monkeypatch.setattr(cli, "exit_on_interrupt", lambda _guard: contextlib.nullcontext())
    lib = tmp_path / "lib.so"
    status = main(["compile", _matmul_model(tmp_path, dim=2), "-q", "--time-limit", "0.2",
                   "-o", str(lib)])
    _one_line(capsys, status, EXIT_INTERRUPTED, prefix="relax-memplan: interrupted")
    assert not lib.exists()


def test_interrupt_during_import_leaves_no_tvm_log_line(capfd, monkeypatch, tmp_path):
    """Regression: after a Ctrl-C in the import the importer's BlockBuilder, still open,
    was freed after main returned and its C++ warning reached the terminal."""
    import gc

    import relax_memplan.frontend as frontend
    from tvm import relax

    def interrupted_import(*_args, **_kw):
        builder = relax.BlockBuilder()
        builder._begin_dataflow_block()
        raise KeyboardInterrupt  # the traceback keeps the builder alive

    monkeypatch.setattr(frontend, "import_onnx", interrupted_import)
    status = main(["compile", _matmul_model(tmp_path, dim=2), "-q"])
    gc.collect()
    err = capfd.readouterr().err
    assert status == EXIT_INTERRUPTED and "relax-memplan: interrupted" in err
    assert "BlockBuilder destroyed" not in err


def test_real_sigint_during_the_run_is_one_line(tmp_path):
    """A SIGINT to the process while the VM runs (in the instrument hook, slowed down)."""
    script = textwrap.dedent("""
        import sys, time
        import relax_memplan.runtime.vm as runtime
        from relax_memplan.cli import main
        real = runtime._storage_bytes
        def slow(args):
            print("RUNNING", flush=True)  # stdout: -q mutes fd 2 while TVM works
            time.sleep(30)
            return real(args)
        runtime._storage_bytes = slow
        sys.exit(main(["compile", sys.argv[1], "-q", "--time-limit", "0.2"]))
    """)
    model = _matmul_model(tmp_path, dim=2)  # incidental: a small model, not the example CNN
    proc = subprocess.Popen([sys.executable, "-c", script, model], cwd=REPO_ROOT,
                            stderr=subprocess.PIPE,
                            stdout=subprocess.PIPE, text=True)
    try:
        for line in proc.stdout:
            if line.startswith("RUNNING"):
                break
        os.kill(proc.pid, signal.SIGINT)
        rest = proc.stderr.read()
        status = proc.wait(timeout=60)
    finally:
        if proc.poll() is None:
            proc.kill()
    assert status == EXIT_INTERRUPTED, rest
    assert rest.strip() == "relax-memplan: interrupted"


# --- zero-size tensors -------------------------------------------------------------------------
def test_empty_slice_with_runtime_bounds_works_end_to_end(capsys, tmp_path):
    """Regression: Slice with starts=[5], ends=[2] as graph inputs (valid ONNX, result (0, 8))
    ended in a traceback 'std::bad_alloc' (TVM's dynamic_strided_slice gave extent -3)."""
    model = _save(tmp_path, "slice", [helper.make_node("Slice", ["data", "starts", "ends", "axes"],
                                                       ["out"])],
                  [helper.make_tensor_value_info("data", TensorProto.FLOAT, [10, 8]),
                   helper.make_tensor_value_info("starts", TensorProto.INT64, [1]),
                   helper.make_tensor_value_info("ends", TensorProto.INT64, [1])],
                  [helper.make_tensor_value_info("out", TensorProto.FLOAT, ["r", 8])],
                  [helper.make_tensor("axes", TensorProto.INT64, [1], [0])])
    np.save(tmp_path / "starts.npy", np.array([5], np.int64))
    np.save(tmp_path / "ends.npy", np.array([2], np.int64))
    report = tmp_path / "r.json"
    status = main(["compile", model, "--verify", "-q", "--report", str(report),
                   "--input", f"starts={tmp_path / 'starts.npy'}",
                   "--input", f"ends={tmp_path / 'ends.npy'}"])
    assert status == 0, capsys.readouterr().err
    data = json.loads(report.read_text())
    assert data["verified"] is True  # the shapes were compared: ours is (0, 8) like onnxruntime's
