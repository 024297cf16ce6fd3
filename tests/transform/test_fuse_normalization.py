"""FuseNormalization (+ FuseAddLayerNorm after it) on each form exporters write: the norm and
its residual add fused, counted per pattern, outputs as onnxruntime's."""

import numpy as np
import pytest
import tvm
from tvm import relax

from relax_memplan.frontend import import_onnx, run_onnxruntime
from relax_memplan.pipeline import get_pipeline
from relax_memplan.transform.fuse_add_layer_norm import FuseAddLayerNorm
from relax_memplan.transform.fuse_normalization import FuseNormalization
from tests.transform.norm_models import FORMS, norm_model


def _build(model, feeds):
    """(outputs, onnxruntime's outputs, pattern name -> record) of ``model`` built with
    FuseNormalization and FuseAddLayerNorm."""
    mod, _ = import_onnx(model, {n: v.shape for n, v in feeds.items()})
    passes = [FuseNormalization(), FuseAddLayerNorm()]
    ex = tvm.compile(mod, "llvm", relax_pipeline=get_pipeline(
        "llvm", planner="tvm", fusion=True, fusion_pass_list=passes))
    vm = relax.VirtualMachine(ex, tvm.cpu())
    got = vm["main"](*[tvm.runtime.tensor(v) for v in feeds.values()])
    got = [o.numpy() for o in got] if isinstance(got, tvm.ir.Array) else [got.numpy()]
    records = {r.name: r for p in passes for r in p.records}
    return got, run_onnxruntime(model, feeds), records


def _close(got, expected):
    assert len(got) == len(expected)
    for g, e in zip(got, expected):
        np.testing.assert_allclose(g, e, rtol=1e-4, atol=1e-4)


def _counts(record):
    return record.candidates, record.fused


@pytest.mark.parametrize("form", list(FORMS))
def test_residual_add_and_norm_become_one_kernel(form):
    kind = FORMS[form][0]
    got, expected, records = _build(*norm_model(form))
    _close(got, expected)
    found_by_structure = (1, 1) if form != "op" else (0, 0)
    assert _counts(records[kind]) == found_by_structure, records[kind].refused
    assert _counts(records["add_" + kind]) == (1, 1), records["add_" + kind].refused


@pytest.mark.parametrize("form", ["pow_div", "mul_reciprocal", "rms_reciprocal", "rms_div"])
def test_without_the_residual_add_the_norm_is_one_op(form):
    kind = FORMS[form][0]
    got, expected, records = _build(*norm_model(form, residual=False))
    _close(got, expected)
    assert _counts(records[kind]) == (1, 1)
    assert _counts(records["add_" + kind]) == (0, 0)


@pytest.mark.parametrize("form, gamma, beta", [("pow_div", False, False),
                                               ("pow_div", True, False),
                                               ("mul_reciprocal", False, True),
                                               ("rms_div", False, False)])
def test_gamma_and_beta_present_or_absent(form, gamma, beta):
    kind = FORMS[form][0]
    got, expected, records = _build(*norm_model(form, gamma=gamma, beta=beta))
    _close(got, expected)
    assert _counts(records[kind]) == (1, 1)
    assert _counts(records["add_" + kind]) == (1, 1)


@pytest.mark.parametrize("form", ["pow_div", "rms_reciprocal"])
def test_operands_in_the_other_order(form):
    kind = FORMS[form][0]
    got, expected, records = _build(*norm_model(form, swap=True, eps_first=True))
    _close(got, expected)
    assert _counts(records[kind]) == (1, 1) and _counts(records["add_" + kind]) == (1, 1)


@pytest.mark.parametrize("form", ["op", "pow_div", "rms_reciprocal"])
def test_a_residual_sum_that_is_also_an_output_is_written_by_the_kernel(form):
    kind = FORMS[form][0]
    got, expected, records = _build(*norm_model(form, sum_output=True))
    _close(got, expected)
    assert _counts(records["add_" + kind]) == (1, 1)


def test_the_pipeline_runs_it_and_counts_each_pattern():
    from relax_memplan.pipeline import fusion_counts, fusion_passes
    model, feeds = norm_model("rms_reciprocal")
    mod, _ = import_onnx(model, {n: v.shape for n, v in feeds.items()})
    passes = fusion_passes(tvm.target.Target("llvm"))
    tvm.compile(mod, "llvm", relax_pipeline=get_pipeline("llvm", fusion_pass_list=passes))
    counts = fusion_counts(passes)
    assert (counts["rms_norm"], counts["add_rms_norm"], counts["layer_norm"]) == (1, 1, 0)
