"""benchmarks/peer_bench.py: outputs compared with onnxruntime's (a wrong value fails), and one
model through the whole harness (fresh runner processes, ratios, resident memory)."""

import importlib.util
import sys
from pathlib import Path

import numpy as np
import onnx
import pytest

pytest.importorskip("onnxruntime")

_DIR = Path(__file__).resolve().parents[1] / "benchmarks"
sys.path.insert(0, str(_DIR))
_spec = importlib.util.spec_from_file_location("peer_bench", _DIR / "peer_bench.py")
peer_bench = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(peer_bench)


def _save(path, *arrays):
    np.savez(path, **{f"output{i}": a for i, a in enumerate(arrays)})
    return path


def test_compare_accepts_equal_outputs_and_refuses_a_wrong_value(tmp_path):
    ref = np.linspace(-2, 2, 100, dtype="float32").reshape(10, 10)
    want = _save(tmp_path / "ref.npz", ref)
    assert peer_bench.compare(_save(tmp_path / "a.npz", ref.copy()), want, 1e-3, 1e-4)["ok"]
    near = ref.copy()
    near[3, 3] += 1e-3  # inside 1e-3 * 2 + 1e-4
    assert peer_bench.compare(_save(tmp_path / "b.npz", near), want, 1e-3, 1e-4)["ok"]
    wrong = ref.copy()
    wrong[3, 3] += 3e-3
    result = peer_bench.compare(_save(tmp_path / "c.npz", wrong), want, 1e-3, 1e-4)
    assert not result["ok"] and result["max_abs_error"] == pytest.approx(3e-3, rel=1e-3)


def test_compare_refuses_another_shape_or_count(tmp_path):
    want = _save(tmp_path / "ref.npz", np.zeros((2, 3), "float32"))
    assert "shape" in peer_bench.compare(_save(tmp_path / "a.npz", np.zeros((3, 2), "float32")),
                                         want, 1e-3, 1e-4)["why"]
    two = _save(tmp_path / "b.npz", np.zeros((2, 3), "float32"), np.zeros(1, "float32"))
    assert "2 outputs" in peer_bench.compare(two, want, 1e-3, 1e-4)["why"]


@pytest.mark.slow
def test_one_model_through_the_harness(tmp_path):
    from tests.library.conftest import dense_model

    path = tmp_path / "dense.onnx"
    onnx.save(dense_model(0), str(path))
    model = peer_bench.SHARED_MODELS[0].__class__("dense", path, {"x": (4, 64)})
    args = peer_bench.main.__globals__["argparse"].Namespace(
        build=["default"], flags={}, loaders=["ours", "tvm"], runtimes=["onnxruntime"],
        threads=1, rounds=2, warmup=1, calls=3, min_calls=2, max_seconds=5.0, rtol=1e-3,
        atol=1e-4, reuse=False)
    entry = peer_bench.bench_model(model, args, tmp_path)
    stats = entry["stats"]
    assert set(stats) == {"default", "tvm:default", "onnxruntime"}
    for name in ("default", "tvm:default"):
        assert stats[name]["check"]["ok"], stats[name]
        assert len(stats[name]["round_medians_ms"]) == 2 and stats[name]["added"] > 0
    assert entry["ratios"]["default"]["ours_over_ort"] > 0
    assert "dense" in peer_bench.format_table([entry], ["default"])


def test_a_long_text_row_takes_the_model_s_inputs_at_the_long_sequence(tmp_path, monkeypatch):
    import _peer_models

    path = tmp_path / "bert_base.onnx"
    path.write_bytes(b"")
    np.savez(tmp_path / "bert_base.inputs.npz", input_ids=np.zeros((1, 128), np.int64),
             attention_mask=np.ones((1, 128), np.int64))
    monkeypatch.setattr(_peer_models, "FULL_SIZE", tmp_path)
    rows = {m.name: m for m in _peer_models.full_size_models()}
    assert rows["bert_base"].shapes == {"input_ids": (1, 128), "attention_mask": (1, 128)}
    long = rows["bert_base@512"]
    assert long.shapes == {"input_ids": (1, 512), "attention_mask": (1, 512)}
    assert long.inputs_file is None and long.path == path
