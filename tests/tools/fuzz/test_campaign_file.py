"""benchmarks/fuzz_campaign.py: runs of several seed ranges add up, an overlapping range is
refused."""

import importlib.util
import json
import sys
from pathlib import Path

import pytest

_PATH = Path(__file__).resolve().parents[3] / "benchmarks" / "fuzz_campaign.py"
_spec = importlib.util.spec_from_file_location("fuzz_campaign", _PATH)
fuzz_campaign = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(fuzz_campaign)


def _run(seeds, graphs, ok, wrong=0, ops=None, shapes=1.0):
    return {"seeds": seeds, "graphs": graphs, "outcomes": {"ok": ok, "wrong": wrong},
            "ops": ops or {"Add": graphs}, "shapes_per_graph": shapes, "seconds": 2.0 * graphs,
            "failures": [{"seed": 1, "outcome": "wrong"}] if wrong else []}


def test_the_total_is_the_sum_of_the_runs():
    total = fuzz_campaign.merge([_run("0:10", 10, 10, shapes=1.0),
                                 _run("10:40", 30, 29, wrong=1, ops={"Relu": 5}, shapes=2.0)])
    assert total["graphs"] == 40 and total["outcomes"] == {"ok": 39, "wrong": 1}
    assert total["ops"] == {"Add": 10, "Relu": 5} and len(total["failures"]) == 1
    assert total["shapes_per_graph"] == pytest.approx((10 * 1.0 + 30 * 2.0) / 40)
    assert total["seconds"] == 80.0 and total["seeds"] == "0:10, 10:40"


def test_an_overlapping_seed_range_is_refused(tmp_path, monkeypatch):
    result = tmp_path / "fuzz_campaign.json"
    result.write_text(json.dumps({"runs": [_run("0:100", 100, 100)]}))
    monkeypatch.setattr(fuzz_campaign, "RESULT", result)
    monkeypatch.setattr(sys, "argv", ["fuzz_campaign.py", "--seeds", "50:60", "--append"])
    with pytest.raises(SystemExit, match="overlap the run of seeds 0:100"):
        fuzz_campaign.main()


def test_the_committed_result_adds_up():
    data = json.loads((_PATH.parent / "results" / "fuzz_campaign.json").read_text())
    total = fuzz_campaign.merge(data["runs"])
    assert data["total"] == total
    assert total["graphs"] == sum(total["outcomes"].values())


def test_repro_paths_in_the_committed_result_name_files_of_the_checkout():
    """The campaign ran in other checkouts: its repro paths must still lead to the files."""
    root = _PATH.parents[1]
    data = json.loads((_PATH.parent / "results" / "fuzz_campaign.json").read_text())
    for failure in data["total"]["failures"]:
        assert not Path(failure["repro"]).is_absolute(), failure
        assert (root / failure["repro"]).is_file(), failure


def test_a_repro_path_inside_the_checkout_is_written_relative():
    inside = _PATH.parent / "results" / "fuzz_repros" / "x.onnx"
    assert fuzz_campaign._in_checkout(str(inside)) == "benchmarks/results/fuzz_repros/x.onnx"
    assert fuzz_campaign._in_checkout("/elsewhere/x.onnx") == "/elsewhere/x.onnx"
