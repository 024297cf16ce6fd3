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


@pytest.mark.parametrize("form", ["pow_div", "mul_reciprocal", "tf_folded", "rms_reciprocal",
                                  "rms_div"])
def test_without_the_residual_add_the_norm_is_one_op(form):
    kind = FORMS[form][0]
    got, expected, records = _build(*norm_model(form, residual=False))
    _close(got, expected)
    assert _counts(records[kind]) == (1, 1)
    assert _counts(records["add_" + kind]) == (0, 0)


@pytest.mark.parametrize("form, gamma, beta", [("op", True, False), ("pow_div", False, False),
                                               ("pow_div", True, False),
                                               ("mul_reciprocal", False, True),
                                               ("tf_folded", False, False),
                                               ("tf_folded", True, False),
                                               ("rms_div", False, False)])
def test_gamma_and_beta_present_or_absent(form, gamma, beta):
    kind = FORMS[form][0]
    got, expected, records = _build(*norm_model(form, gamma=gamma, beta=beta))
    _close(got, expected)
    assert _counts(records[kind]) == ((1, 1) if form != "op" else (0, 0))
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


def _symbolic_layer_norm():
    from tvm.script import ir as I, relax as R

    @I.ir_module
    class Symbolic:
        @R.function
        def main(x: R.Tensor(("n", 16), "float32"), g: R.Tensor((16,), "float32")):
            with R.dataflow():
                m = R.mean(x, axis=[1], keepdims=True)
                d = R.subtract(x, m)
                v = R.mean(R.multiply(d, d), axis=[1], keepdims=True)
                r = R.rsqrt(R.add(R.const(1e-5, "float32"), v))
                y = R.multiply(g, R.multiply(r, d))
                R.output(y)
            return y
    return Symbolic


def test_a_symbolic_row_count_and_rsqrt():
    pass_ = FuseNormalization()
    after = pass_(_symbolic_layer_norm())
    assert pass_.fused == {"layer_norm": 1, "rms_norm": 0}
    assert "R.nn.layer_norm" in after["main"].script() and "R.rsqrt" not in after["main"].script()
    ex = tvm.compile(after, "llvm", relax_pipeline=get_pipeline("llvm", planner="tvm",
                                                                 fusion=False))
    vm = relax.VirtualMachine(ex, tvm.cpu())
    g = np.linspace(0.5, 2.0, 16).astype("float32")
    for n in (1, 7):
        x = np.random.default_rng(n).standard_normal((n, 16)).astype("float32")
        d = x - x.mean(1, keepdims=True)
        ref = d / np.sqrt((d * d).mean(1, keepdims=True) + 1e-5) * g
        got = vm["main"](tvm.runtime.tensor(x), tvm.runtime.tensor(g)).numpy()
        np.testing.assert_allclose(got, ref, rtol=1e-5, atol=1e-5)


def test_float16_with_casts_to_float32_around_the_norm():
    from tvm.script import ir as I, relax as R

    @I.ir_module
    class Half:
        @R.function
        def main(x: R.Tensor((3, 16), "float16"), w: R.Tensor((16,), "float16")):
            with R.dataflow():
                x32 = R.astype(x, "float32")
                ms = R.mean(R.power(x32, R.const(2.0, "float32")), axis=[-1], keepdims=True)
                n = R.multiply(x32, R.rsqrt(R.add(ms, R.const(1e-6, "float32"))))
                y = R.multiply(w, R.astype(n, "float16"))
                R.output(y)
            return y

    pass_ = FuseNormalization()
    after = pass_(Half)
    # the norm in float32 on the cast input; the cast back and the float16 weight stay after it
    assert pass_.fused == {"layer_norm": 0, "rms_norm": 1}
    ex = tvm.compile(after, "llvm", relax_pipeline=get_pipeline("llvm", planner="tvm",
                                                                 fusion=False))
    x = np.random.default_rng(0).standard_normal((3, 16)).astype("float16")
    w = np.linspace(0.5, 2.0, 16).astype("float16")
    got = relax.VirtualMachine(ex, tvm.cpu())["main"](tvm.runtime.tensor(x),
                                                     tvm.runtime.tensor(w)).numpy()
    x32 = x.astype("float32")
    ref = (x32 / np.sqrt((x32 * x32).mean(-1, keepdims=True) + 1e-6)).astype("float16") * w
    np.testing.assert_allclose(got.astype("float32"), ref.astype("float32"), rtol=2e-3,
                               atol=2e-3)
