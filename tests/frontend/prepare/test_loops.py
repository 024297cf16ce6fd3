"""The ``unroll_loops`` converter step: ONNX Loop and Scan against onnxruntime, their
memory (every iteration in one arena, no allocation per iteration), and clear errors."""

import json
import warnings

import numpy as np
import onnx
import pytest
import tvm
from tvm import relax

from relax_memplan.cli import main
from relax_memplan.errors import UnsupportedOperatorError
from relax_memplan.frontend import import_onnx, run_onnxruntime

from .loop_models import loop_model, scan_model

RNG = np.random.default_rng(0)


def run_both(model, feeds, **import_kwargs):
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        mod, _ = import_onnx(model, **import_kwargs)
    vm = relax.VirtualMachine(tvm.compile(mod, "llvm"), tvm.cpu())
    out = vm["main"](*[tvm.runtime.tensor(v) for v in feeds.values()])
    return [v.numpy() for v in out], run_onnxruntime(model, feeds)


def assert_close(got, ref):
    err = float(np.max(np.abs(got - ref)) / max(float(np.max(np.abs(ref))), 1e-30))
    assert got.shape == ref.shape and err <= 1e-4, f"rel. err {err:.2e}"


@pytest.mark.parametrize("trip", [1, 5])
def test_loop_with_constant_trip_count_matches_onnxruntime(trip):
    feeds = {"x0": RNG.standard_normal((1, 4)).astype("float32")}
    got, expected = run_both(loop_model(trip=trip), feeds)
    assert len(got) == 2 and got[1].shape == (trip, 1, 4)
    for out, ref in zip(got, expected):
        assert_close(out, ref)


@pytest.mark.parametrize("length", [3, 7])
def test_scan_matches_onnxruntime(length):
    feeds = {"s0": RNG.standard_normal(4).astype("float32"),
             "xs": RNG.standard_normal((length, 4)).astype("float32")}
    got, expected = run_both(scan_model(length=length), feeds)
    for out, ref in zip(got, expected):
        assert_close(out, ref)


def test_the_tolerance_check_rejects_a_wrong_value():
    ref = np.ones((3, 4), "float32")
    with pytest.raises(AssertionError, match="rel. err"):
        assert_close(ref + 1e-3, ref)


@pytest.mark.parametrize("model, message", [
    (loop_model(cond_from_iter=True), "'loop0'.*condition output is computed at run time"),
])
def test_unsupported_loops_name_the_node(model, message):
    with pytest.raises(UnsupportedOperatorError, match=message):
        import_onnx(model, keep_dynamic=True)


def test_without_the_step_tvm_cannot_import_scan():
    with pytest.raises(UnsupportedOperatorError, match="scan0"):
        import_onnx(scan_model(), disable_steps=["unroll_loops"])


@pytest.mark.parametrize("name, model", [("loop", loop_model(trip=8, width=64)),
                                         ("scan", scan_model(length=16, width=64))])
def test_unrolled_iterations_share_one_arena(name, model, tmp_path, capsys):
    """Our CLI build: verified, arena at the lower bound, and at run time one arena plus
    the two outputs (TVM's planner: one allocation per iteration tensor)."""
    path, report = tmp_path / f"{name}.onnx", tmp_path / "r.json"
    onnx.save(model, str(path))
    status = main(["compile", str(path), "--verify", "-q", "--time-limit", "0.5",
                   "--report", str(report)])
    assert status == 0, capsys.readouterr().out
    data = json.loads(report.read_text())
    assert data["verified"] is True
    assert data["arena_bytes"] <= 1.02 * data["lower_bound_bytes"]
    assert data["runtime_num_allocs"] == 3
    assert data["tvm_default_runtime_num_allocs"] > 3
    [facts] = data["loops"]
    assert (facts["form"], facts["iterations"]) == ("unrolled", 8 if name == "loop" else 16)
    assert facts["carried_state_bytes"] == 256  # one [64] or [1, 64] float32 state
