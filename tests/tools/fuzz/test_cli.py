"""The CLI: a seed range prints the summary table and writes the JSON summary."""

import json

from relax_memplan.tools.fuzz.__main__ import main, table
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
