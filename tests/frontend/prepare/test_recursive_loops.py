"""The recursive loop form (ONNX Loop/Scan with a run-time trip count or sequence length):
against onnxruntime at two lengths in one build, allocations per call independent of the
length once HoistLoopStorage ran, and clear errors."""

import json
import warnings

import numpy as np
import onnx
import pytest
import tvm

from relax_memplan.cli import main
from relax_memplan.errors import UnsupportedOperatorError
from relax_memplan.frontend import import_onnx, run_onnxruntime
from relax_memplan.frontend.prepare import recursive_loops
from relax_memplan.frontend.prepare.loop_facts import loops_of
from relax_memplan.frontend.prepare.recursive_loops import MAX_RECURSIVE_ITERATIONS
from relax_memplan.pipeline import get_pipeline
from relax_memplan.runtime import run_and_measure
from relax_memplan.transform.hoist_loop_storage import HoistLoopStorage

from .loop_models import (axis_scan_model, batch_scan_model, cumsum_loop_model, loop_model,
                          passthrough_scan_model, range_loop_model, scan_model,
                          two_scans_model, while_loop_model)
from .test_loops import assert_close

RNG = np.random.default_rng(1)


def build(model, planner="relax_memplan"):
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        mod, _ = import_onnx(model, keep_dynamic=True)
    hoist = HoistLoopStorage()
    ex = tvm.compile(mod, "llvm", relax_pipeline=get_pipeline("llvm", planner=planner,
                                                              hoist_pass=hoist))
    return mod, ex, hoist


def allocs_vs_onnxruntime(ex, model, feeds) -> int:
    """Run once; compare every output with onnxruntime; the number of VM allocations."""
    measured = run_and_measure(ex, list(feeds.values()))
    expected = run_onnxruntime(model, feeds)
    assert len(measured.outputs) == len(expected)
    for got, ref in zip(measured.outputs, expected):
        assert_close(got, ref)
    return measured.num_allocs


def scan_feeds(length, width=64):
    return {"s0": RNG.standard_normal(width).astype("float32"),
            "xs": RNG.standard_normal((length, width)).astype("float32")}


def loop_feeds(length, width=64):
    return {"x0": RNG.standard_normal((1, width)).astype("float32"),
            "M": np.array(length, "int64")}


@pytest.mark.parametrize("model, feeds, body", [
    (scan_model(seq="seq", width=64), scan_feeds, "scan0_body"),
    (loop_model(trip_as_input=True, width=64), loop_feeds, "loop0_body"),
])
def test_symbolic_length_matches_onnxruntime_without_allocations_per_iteration(model, feeds,
                                                                              body):
    mod, ex, hoist = build(model)
    assert [f.form for f in loops_of(mod)] == ["recursive"]
    assert set(hoist.hoisted) == {body} and not hoist.skipped
    # the body's arena once, its carried output in two 256-byte slots
    assert hoist.hoisted[body] >= 2 * 256
    assert allocs_vs_onnxruntime(ex, model, feeds(3)) == allocs_vs_onnxruntime(
        ex, model, feeds(40))


def test_tvm_planner_allocates_on_every_iteration():
    """The baseline: without HoistLoopStorage the count grows with the length (so the
    equality above is a real check)."""
    model = scan_model(seq="seq", width=64)
    _, ex, hoist = build(model, planner="tvm")
    assert not hoist.hoisted
    short, long = (allocs_vs_onnxruntime(ex, model, scan_feeds(n)) for n in (3, 40))
    assert long - short >= 37


def test_computed_trip_count_and_a_body_reading_the_outer_scope():
    model = cumsum_loop_model()
    mod, ex, hoist = build(model)
    assert loops_of(mod)[0].form == "recursive" and hoist.hoisted
    counts = [allocs_vs_onnxruntime(ex, model, {
        "xs": RNG.standard_normal((n, 3)).astype("float32"),
        "acc0": RNG.standard_normal(3).astype("float32")}) for n in (1, 3, 40)]
    assert len(set(counts)) == 1


@pytest.mark.parametrize("seq", ["seq", 5])
def test_scan_over_axis_1_reversed(seq):
    """Reversed: recursive even at a short constant length (the unrolled form has no
    reverse directions)."""
    model = axis_scan_model(seq=seq)
    mod, ex, _ = build(model)
    assert loops_of(mod)[0].form == "recursive"
    for n in ((2, 17) if seq == "seq" else (5,)):
        allocs_vs_onnxruntime(ex, model, {"s0": RNG.standard_normal(3).astype("float32"),
                                          "xs": RNG.standard_normal((3, n)).astype("float32")})


def test_carried_value_returned_unchanged_gets_its_own_slot():
    model = passthrough_scan_model()
    _, ex, hoist = build(model)
    assert hoist.hoisted and not hoist.skipped
    counts = [allocs_vs_onnxruntime(ex, model, {
        "a0": RNG.standard_normal(4).astype("float32"),
        "b0": RNG.standard_normal(4).astype("float32"),
        "xs": RNG.standard_normal((n, 4)).astype("float32")}) for n in (3, 40)]
    assert counts[0] == counts[1]


def test_hoisting_refuses_a_carried_value_that_is_a_body_input(monkeypatch):
    """Without the converter's copy, ``b' = b`` returns an input: two swapping slots would
    be unsafe, so the pass leaves the body to TVM (allocations per iteration), still exact."""
    monkeypatch.setattr(recursive_loops, "_fresh_copy", lambda bb, value, where, i: value)
    model = passthrough_scan_model()
    _, ex, hoist = build(model)
    assert not hoist.hoisted
    assert "input or a view of one" in hoist.skipped["scan_pass_body"]
    counts = [allocs_vs_onnxruntime(ex, model, {
        "a0": RNG.standard_normal(4).astype("float32"),
        "b0": RNG.standard_normal(4).astype("float32"),
        "xs": RNG.standard_normal((n, 4)).astype("float32")}) for n in (3, 40)]
    assert counts[1] > counts[0]


def test_constant_trip_count_above_the_unroll_limit_is_recursive():
    model = loop_model(trip=100, width=8)
    mod, ex, _ = build(model)
    assert [(f.form, int(f.iterations)) for f in loops_of(mod)] == [("recursive", 100)]
    allocs_vs_onnxruntime(ex, model, {"x0": RNG.standard_normal((1, 8)).astype("float32")})


def test_iterations_above_the_recursion_limit_raise_naming_the_node():
    model = loop_model(trip_as_input=True, width=4)
    _, ex, _ = build(model)
    with pytest.raises(Exception, match=f"'loop0'.*above the recursive loop limit "
                                        f"{MAX_RECURSIVE_ITERATIONS}"):
        run_and_measure(ex, [np.zeros((1, 4), "float32"),
                             np.array(MAX_RECURSIVE_ITERATIONS + 1, "int64")])


@pytest.mark.parametrize("model, message", [
    (while_loop_model(), "'while0'.*without a trip count"),
    (loop_model(trip_as_input=True, cond_from_iter=True),
     "'loop0'.*condition output is computed at run time"),
])
def test_unsupported_recursive_loops_name_the_node(model, message):
    with pytest.raises(UnsupportedOperatorError, match=message):
        import_onnx(model, keep_dynamic=True)


def test_cli_compile_with_a_dim_range_verifies_and_reports_the_body(tmp_path, capsys):
    """``compile model.onnx --dim seq=1..64 --verify``: verified against onnxruntime at the
    sampled lengths, the same allocations at each (TVM's build: more with the length), the
    body's arena at its lower bound, the loop in the report."""
    path, report = tmp_path / "scan.onnx", tmp_path / "r.json"
    onnx.save(scan_model(seq="seq", width=64), str(path))
    status = main(["compile", str(path), "--dim", "seq=1..64", "--verify", "--time-limit",
                   "0.5", "--report", str(report)])
    out = capsys.readouterr().out
    assert status == 0, out
    data = json.loads(report.read_text())
    assert data["verified"] is True
    ours = [s["runtime_num_allocs"] for s in data["shapes"]]
    theirs = [s["tvm_default_runtime_num_allocs"] for s in data["shapes"]]
    assert len(data["shapes"]) >= 2 and len(set(ours)) == 1
    assert max(theirs) > min(theirs) + 40
    [facts] = data["loops"]
    assert (facts["form"], facts["function"]) == ("recursive", "scan0_body")
    assert 0 < facts["body_arena_bytes"] <= 1.02 * facts["body_lower_bound_bytes"]
    assert [s["iterations"] for s in facts["at_shapes"]] == [s["dims"]["seq"]
                                                             for s in data["shapes"]]
    assert "body scan0_body: arena" in out
    assert "the bodies of recursive loops have their own static plans" in out


def test_static_build_counts_the_loop_storage_in_the_plan(tmp_path, capsys):
    """A constant trip count above the unroll limit: the static report's plan includes the
    storage main allocates for the loop body, so the run-time bytes match it."""
    path, report = tmp_path / "loop.onnx", tmp_path / "r.json"
    onnx.save(loop_model(trip=100, width=64), str(path))
    assert main(["compile", str(path), "--verify", "--report", str(report)]) == 0
    out = capsys.readouterr().out
    data = json.loads(report.read_text())
    fmain = data["functions"]["main"]
    assert fmain["loop_storage_bytes"] == 512 + 2 * 256  # body arena, two carried slots
    assert fmain["runtime_matches_plan"] is True
    assert fmain["runtime_num_allocs"] < 10 < 100 < fmain["tvm_default_runtime_num_allocs"]
    assert "loop bodies' storage, per call" in out


def test_long_sequences_run_in_chunks_with_the_same_allocations():
    """Past one chunk (64 iterations), an odd last chunk, and 5,001 iterations (a plain
    recursion of 3,000 crashed the VM's C++ stack)."""
    model = scan_model(seq="seq", width=8)
    _, ex, hoist = build(model)
    assert hoist.hoisted
    counts = [allocs_vs_onnxruntime(ex, model, scan_feeds(n, width=8)) for n in (64, 129, 5001)]
    assert len(set(counts)) == 1


def test_kernel_profile_skips_relax_function_calls():
    """Regression: the VM instrument hook also sees calls between Relax functions; a
    recursive driver calling itself made ``kernel_profile`` fail (KeyError), and a driver is
    not a kernel.  Kernels per call grow by the body's kernels per iteration."""
    from relax_memplan.runtime import kernel_profile, kernels_per_call

    _, ex, _ = build(scan_model(seq="seq", width=4))
    vm = tvm.relax.VirtualMachine(ex, tvm.cpu())

    def args(n):
        return [tvm.runtime.tensor(np.zeros(4, "float32")),
                tvm.runtime.tensor(np.zeros((n, 4), "float32"))]
    profile = kernel_profile(vm, args(5))
    assert not any(name.endswith(("_loop", "_chunks", "_body")) for name in profile)
    assert profile["take_row"][1] == 5 and profile["write_row"][1] == 5
    per_iteration = kernels_per_call(vm, args(4)) - kernels_per_call(vm, args(3))
    assert per_iteration >= 3  # take_row, the cell, copy, write_row (some fused)
    assert kernels_per_call(vm, args(6)) - kernels_per_call(vm, args(3)) == 3 * per_iteration


def test_two_loops_and_a_loop_inside_a_body():
    model = two_scans_model()
    mod, ex, hoist = build(model)
    assert sorted(f.node for f in loops_of(mod) if f.form == "recursive") == ["scan_a", "scan_b"]
    assert set(hoist.hoisted) == {"scan_a_body", "scan_b_body"}
    counts = [allocs_vs_onnxruntime(ex, model, {
        "s0": RNG.standard_normal(4).astype("float32") * 0.1,
        "xs": RNG.standard_normal((n, 4)).astype("float32") * 0.1}) for n in (3, 40)]
    assert counts[0] == counts[1]


def test_body_storage_sized_by_a_symbolic_batch_is_hoisted():
    """The body's storage depends on the batch ``B``: sized in main's dims, allocated once;
    the count does not change with the length nor with the batch."""
    model = batch_scan_model()
    _, ex, hoist = build(model)
    assert set(hoist.hoisted) == {"scan_batch_body"} and not hoist.skipped
    counts = [allocs_vs_onnxruntime(ex, model, {
        "s0": RNG.standard_normal((b, 8)).astype("float32"),
        "xs": RNG.standard_normal((n, b, 8)).astype("float32")}) for n, b in ((3, 2), (40, 2),
                                                                             (5, 3))]
    assert len(set(counts)) == 1


def test_storage_sized_by_the_iteration_stays_in_the_body():
    """A body tensor of ``iter + 1`` elements has no size before the loop: its storage stays
    in the body (one allocation per iteration, said in ``kept``), the rest is hoisted;
    results stay exact.  TVM's planner: more allocations per iteration."""
    model = range_loop_model()
    _, ex, hoist = build(model)
    assert "range_loop_body" in hoist.hoisted and not hoist.skipped
    assert "depends on the iteration" in hoist.kept["range_loop_body"]
    feeds = [{"acc0": np.array(0.5, "float32"), "M": np.array(n, "int64")} for n in (3, 40)]
    ours = [allocs_vs_onnxruntime(ex, model, f) for f in feeds]
    _, tvm_ex, _ = build(model, planner="tvm")
    theirs = [allocs_vs_onnxruntime(tvm_ex, model, f) for f in feeds]
    assert ours[1] - ours[0] == 37  # one per iteration
    assert theirs[1] - theirs[0] > ours[1] - ours[0]


@pytest.mark.parametrize("trip", [0, -2])
def test_zero_or_negative_trip_count_returns_the_initial_state(trip):
    model = loop_model(trip_as_input=True, width=4)
    _, ex, _ = build(model)
    feeds = {"x0": RNG.standard_normal((1, 4)).astype("float32"), "M": np.array(trip, "int64")}
    got = run_and_measure(ex, list(feeds.values())).outputs
    expected = run_onnxruntime(model, feeds)
    assert got[1].shape == expected[1].shape == (0, 1, 4)
    np.testing.assert_array_equal(got[0], expected[0])


def test_report_gives_the_run_time_trip_count_given_with_input(tmp_path, capsys):
    """Regression: a Loop whose trip count is the graph input M said "-1 iterations"
    even with ``--input M=7``; now the count that run used, verified against onnxruntime."""
    path, report = tmp_path / "loop.onnx", tmp_path / "r.json"
    onnx.save(loop_model(trip_as_input=True, width=4), str(path))
    assert main(["compile", str(path), "--input", "M=7", "--verify", "--time-limit", "0.2",
                 "--report", str(report)]) == 0
    out = capsys.readouterr().out
    assert "      7 iterations, carried state" in out and "-1 iterations" not in out
    assert "was random" not in out  # given, not drawn
    data = json.loads(report.read_text())
    assert data["verified"] is True
    [facts] = data["loops"]
    assert facts["trip_input"] == "M"
    assert [(s["iterations"], s["trip_count_given"]) for s in facts["at_shapes"]] == [(7, True)]


def test_unknown_or_random_trip_count_is_said_never_minus_one():
    """Without a run the count is "run-time trip count"; a random M gets one note naming the
    value used (0: the loop did not run) and ``--input M=...``."""
    from tvm import tirx

    from relax_memplan.frontend.prepare.loop_facts import LoopFacts, record_trip_counts
    from relax_memplan.report import CompileReport

    loop = LoopFacts(node="loop0", op="Loop", form="recursive",
                     iterations=tirx.Var("trip_count", "int64"), carried_state_bytes=16,
                     body_bytes=32, trip_input="M")
    report = CompileReport(model="m", loops=[loop])
    assert loop.at({})["iterations"] == -1
    text = report.format_text()
    assert "run-time trip count, carried state 16 B" in text and "-1 iterations" not in text
    loops = [loop]
    notes = record_trip_counts(loops, {"M": np.array(0, "int64"), "x0": np.zeros(4)}, {})
    assert notes == ["Loop 'loop0': trip count input M was random, M=0 (0 iterations); "
                     "--input M=N sets it"]
    assert loops[0].at({}, 0)["iterations"] == 0
    assert record_trip_counts(loops, {"M": np.array(-3, "int64")}, {"M": -3}) == []
    assert loops[0].at({}, 1)["iterations"] == 0 and loops[0].trip_counts[1] == (-3, True)
