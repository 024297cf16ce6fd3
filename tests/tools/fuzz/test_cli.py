"""The CLI: a seed range prints the summary table and writes the JSON summary."""

import json

from relax_memplan.tools.fuzz.__main__ import campaign, main, table
from relax_memplan.tools.fuzz.runner import OUTCOMES


def test_a_seed_range_prints_the_table_and_writes_json(tmp_path, capsys):
    out = tmp_path / "json"
    assert main(["--seeds", "0:2", "--out", str(tmp_path), "--json", str(out)]) == 0
    summary = json.loads(out.read_text())
    assert summary["graphs"] == 2 and set(summary["outcomes"]) == set(OUTCOMES)
    assert sum(summary["outcomes"].values()) == 2 and summary["ops"]
    printed = capsys.readouterr().out
    assert "graphs run        2" in printed and "ops covered" in printed


def test_the_table_lists_each_failure_with_its_repro():
    summary = {"graphs": 1, "seconds": 1.0, "ops": {"Relu": 1}, "shapes_per_graph": 1.0,
               "outcomes": {"wrong": 1}, "failures": [{
                   "seed": 7, "outcome": "wrong", "variant": "inplace",
                   "repro": "out/wrong_seed7.onnx", "detail": "output 0: max abs error 1"}]}
    text = table(summary)
    assert "seed 7 wrong (inplace): out/wrong_seed7.onnx" in text and "ops covered       1" in text


def test_two_jobs_give_the_summary_of_one_job(tmp_path):
    one = campaign(range(3, 5), tmp_path / "one", jobs=1)
    two = campaign(range(3, 5), tmp_path / "two", jobs=2)
    for key in ("graphs", "outcomes", "ops", "shapes_per_graph", "failures", "seeds"):
        assert one[key] == two[key], key
    assert two["jobs"] == 2 and two["seeds"] == "3:5"


def test_a_spent_budget_runs_nothing_and_says_which_seeds_ran(tmp_path):
    summary = campaign(range(10, 20), tmp_path, budget_s=-1.0)
    assert summary["graphs"] == 0 and summary["seeds"] == "10:10"
    assert "not_run" not in summary  # no gap: nothing ran at all
