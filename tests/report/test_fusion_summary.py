"""The fusion summary describes the build it reports: bert-tiny 1x128 with and without
--schedule (regression: under --schedule the fusion line's "-> 393,216 B" was the
unscheduled build's bound while the report's bound was 458,752 B, and the scheduled kernels
had lost 4 of the 5 in-place calls)."""

import pytest

from relax_memplan.compile import BuildOptions, CheckOptions, compile_model
from relax_memplan.transform import PlanStaticMemory, ReorderForMemory
from tests.conftest import shared_model

pytest.importorskip("onnxruntime")

# both builds: the 2 residual adds of each of bert-tiny's 2 layers sit in a matmul's epilogue
# (4 calls written over the residual) plus the embeddings' add of three: 5 kernels, 5 calls;
# the bound worked out by hand (a 1x128x128 float32 tensor is 65,536 B)
EXPECTED = {"lower_bound_bytes": 393_216, "inplace_capable_kernels": 5, "inplace_calls": 5}


@pytest.fixture(scope="module")
def bert_reports():
    """schedule -> (JSON report, text) of a verified build at input_ids 1x128 with the CLI's
    planner settings (in-place, concat in place, reordering); TVM's comparison build left out
    (seconds saved, not what is checked)."""
    out = {}
    for schedule in (False, True):
        options = BuildOptions(plan_pass=PlanStaticMemory(time_limit_s=0.2, inplace=True,
                                                          concat_inplace=True),
                               reorder_pass=ReorderForMemory(), schedule=schedule,
                               compare_with_tvm=False)
        result = compile_model(str(shared_model("bert-tiny-randw.onnx")),
                               {"input_ids": (1, 128)}, options=options,
                               check=CheckOptions(verify=True))
        out[schedule] = (result.report.to_dict(), result.report.format_text())
    return out


@pytest.mark.parametrize("schedule", [False, True], ids=["unscheduled", "schedule"])
def test_fusion_bound_is_the_reported_build_bound_and_in_place_survives_schedule(
        bert_reports, schedule):
    report, text = bert_reports[schedule]
    assert report["verified"] is True
    assert {k: report[k] for k in EXPECTED} == EXPECTED
    fusion = report["fusion"]
    assert fusion["lower_bound_bytes_ours"] == report["lower_bound_bytes"]
    assert fusion["lower_bound_bytes_build"] == report["lower_bound_bytes"]
    assert fusion["lower_bound_bytes_tvm"] == 458_752
    assert "in-place: 5 kernels capable, 5 calls write over an input that dies there" in text
    assert ("lower bound 458,752 B (448.00 KiB) without our fusion -> 393,216 B (384.00 KiB) "
            "(both with this build's planner: in-place, concat in place, reordering)\n") in text


def test_the_fused_side_is_read_from_the_build_not_run_again(monkeypatch):
    """The report reruns the Relax phases without our fusion only; the fused column comes from
    the build's own module, plan and passes (a second fused run cost about 30 s on GPT-2) and
    equals what a second run gives."""
    from relax_memplan.report import fusion_summary

    calls = []
    original = fusion_summary._relax_phases

    def spy(mod, target, fusion, *args, **kwargs):
        calls.append((mod, target, fusion, kwargs))
        return original(mod, target, fusion, *args, **kwargs)

    monkeypatch.setattr(fusion_summary, "_relax_phases", spy)
    options = BuildOptions(plan_pass=PlanStaticMemory(time_limit_s=0.2, inplace=True,
                                                      concat_inplace=True),
                           reorder_pass=ReorderForMemory(), schedule=False,
                           compare_with_tvm=False)
    result = compile_model(str(shared_model("bert-tiny-randw.onnx")), {"input_ids": (1, 128)},
                           options=options, check=CheckOptions(verify=False, measure=False))
    assert [fusion for _, _, fusion, _ in calls] == [False]
    mod, target, _, kwargs = calls[0]
    again = original(mod, target, True, options.fusion_conv_chain, False, kwargs["planner"])
    fusion = result.report.to_dict()["fusion"]
    read = (fusion["kernels_ours"], fusion["intermediate_bytes_ours"],
            fusion["lower_bound_bytes_ours"], fusion["conv_chain_scratch_bytes"])
    assert read == again
    assert fusion["kernels_ours"] < fusion["kernels_tvm"]
