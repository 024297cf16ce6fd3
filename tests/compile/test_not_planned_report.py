"""A dynamic plan that places nothing (every tensor left to TVM) says so in each row of the
report and in its JSON, instead of an arena and lower bound of 0 B and a ratio of 1.000.

The ppocrv4-det case (offset expressions over PlanDynamicMemory's ``max_expr_chars`` of 20000)
is reproduced on bert-tiny with a limit of 200 characters: same code path, seconds not minutes.
"""

import json

import pytest

from relax_memplan.compile import BuildOptions, CheckOptions, compile_model
from relax_memplan.transform import PlanDynamicMemory
from tests.conftest import shared_model

DIMS = {"batch": (1, 4), "seq": (1, 32)}


def _bert_report(max_expr_chars, check=CheckOptions(measure=False)):
    options = BuildOptions(dynamic_pass=PlanDynamicMemory(max_expr_chars=max_expr_chars))
    return compile_model(shared_model("bert-tiny-randw.onnx"), None, DIMS, options=options,
                         check=check).report


@pytest.fixture(scope="module")
def not_planned():
    """bert-tiny with a 200-character offset limit (nothing planned), run and verified: one
    build for the text, JSON and run checks (suite time)."""
    return _bert_report(200, CheckOptions(verify=True))


def test_nothing_planned_rows_say_not_planned_with_the_reason_up_front(not_planned):
    report = not_planned
    text = report.format_text().splitlines()
    assert text[1] == ("  NOT PLANNED: every tensor left to TVM's planner (offset expression of "
                       "alloc16 exceeds 200 characters); no arena, no ratio to the lower bound")
    rows = [line for line in text if line.startswith("  batch=")]
    assert len(rows) == 3 and all("not planned (left to TVM)" in r for r in rows), rows
    assert not any("1.000" in r for r in rows), rows
    data = json.loads(json.dumps(report.to_dict()))
    assert data["planned"] is False
    assert data["not_planned_reason"] == "offset expression of alloc16 exceeds 200 characters"
    for row in data["shapes"]:
        assert row["planned"] is False
        assert row["arena_over_lower_bound"] is None
        assert row["arena_bytes"] is None and row["lower_bound_bytes"] is None


def test_planned_build_keeps_numbers_and_ratio():
    """The default limit plans bert-tiny: the same fields carry numbers (the check can fail)."""
    report = _bert_report(20000)
    assert report.not_planned_reason is None and "NOT PLANNED" not in report.format_text()
    data = report.to_dict()
    assert data["planned"] is True
    for row in data["shapes"]:
        assert row["planned"] is True and row["lower_bound_bytes"] > 0
        assert row["arena_over_lower_bound"] >= 1.0


def test_nothing_planned_build_runs_as_tvm_and_matches_onnxruntime(not_planned):
    """Left to TVM means TVM's plan: same run-time bytes as TVM's build, outputs verified."""
    for row in not_planned.shapes:
        assert row.runtime_alloc_bytes == row.tvm_default_runtime_alloc_bytes > 0
        assert row.verified is True
