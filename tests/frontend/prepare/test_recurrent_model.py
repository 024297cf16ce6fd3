"""The VAD-shaped recurrent model (conv/linear front, LSTM, If, sigmoid): compiled by our
CLI and pipeline with a symbolic sequence length, checked against onnxruntime, with the
same number of VM allocations at two sequence lengths."""

import json
import warnings

import numpy as np
import onnx
import pytest
import tvm

from relax_memplan.cli import main
from relax_memplan.frontend import import_onnx, run_onnxruntime
from relax_memplan.pipeline import get_pipeline
from relax_memplan.frontend.recurrent_example import vad_lstm_model
from relax_memplan.runtime import run_and_measure
from relax_memplan.transform.plan_dynamic_memory import PlanDynamicMemory

SEQ_RANGE = (8, 256)


@pytest.fixture(scope="module")
def vad_path(tmp_path_factory):
    path = tmp_path_factory.mktemp("vad") / "vad_lstm.onnx"
    onnx.save(vad_lstm_model(), str(path))
    return path


def feeds(seq, sr=16000, seed=0):
    rng = np.random.default_rng(seed + seq)
    return {
        "feats": rng.standard_normal((1, 40, seq)).astype("float32"),
        "h0": rng.standard_normal((1, 1, 64)).astype("float32") * 0.5,
        "c0": rng.standard_normal((1, 1, 64)).astype("float32") * 0.5,
        "sr": np.array(sr, dtype=np.int64),
    }


def test_cli_compiles_with_symbolic_seq_and_verifies(vad_path, capsys, tmp_path):
    report = tmp_path / "r.json"
    lo, hi = SEQ_RANGE
    status = main(["compile", str(vad_path), "--dim", f"seq={lo}..{hi}", "--verify",
                   "--input", "sr=16000", "--time-limit", "0.5", "--report", str(report)])
    assert status == 0, capsys.readouterr().out
    data = json.loads(report.read_text())
    assert data["verified"] is True
    assert [s["dims"]["seq"] for s in data["shapes"]][:2] == [lo, hi]
    for s in data["shapes"]:
        assert s["arena_bytes"] <= 1.02 * s["lower_bound_bytes"]
    # the report's loop section: the LSTM at every sampled length
    [lstm] = data["loops"]
    assert (lstm["node"], lstm["op"], lstm["form"], lstm["iterations"]) == (
        "lstm", "LSTM", "kernel", "seq")
    for row, s in zip(lstm["at_shapes"], data["shapes"]):
        assert row["iterations"] == s["dims"]["seq"]
        assert row["carried_state_bytes"] == 2 * 64 * 4  # h and c, [1, 1, 64] float32
    text = capsys.readouterr().out
    assert "LSTM 'lstm': time loop inside one kernel" in text
    assert f"at seq={hi}: {hi} iterations, carried state 512 B" in text


@pytest.fixture(scope="module")
def exact_build(vad_path):
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        mod, _ = import_onnx(vad_path, keep_dynamic=True)
    dyn = PlanDynamicMemory(strategy="exact")
    pipeline = get_pipeline("llvm", dynamic_pass=dyn, dim_ranges={"seq": SEQ_RANGE})
    return tvm.compile(mod, "llvm", relax_pipeline=pipeline), dyn.plans["main"]


@pytest.mark.parametrize("sr", [16000, 8000])
def test_allocations_per_call_do_not_grow_with_the_sequence(vad_path, exact_build, sr):
    ex, fplan = exact_build
    assert fplan.planned, fplan.fallback_reason
    counts = []
    for seq in (9, 200):
        inputs = feeds(seq, sr)
        got = run_and_measure(ex, list(inputs.values()))
        for out, ref in zip(got.outputs, run_onnxruntime(vad_path, inputs)):
            err = float(np.abs(out - ref).max()) / float(np.abs(ref).max())
            assert err <= 1e-4, (seq, sr, err)
        arena, lower_bound, _ = fplan.bytes_at({"seq": seq})
        assert got.alloc_sizes_bytes[0] == arena <= 1.02 * lower_bound
        counts.append(got.num_allocs)
    # the arena and the three outputs (prob, hn, cn): the LSTM's Y is in the arena too
    assert counts == [4, 4], counts
