"""PlanDynamicMemory, AnnotateDimRanges and InsertDimRangeCheck on symbolic shapes."""

import numpy as np
import pytest
import tvm
from tvm.script import ir as I
from tvm.script import relax as R
from tvm.script import tirx as T

from relax_memplan.frontend import import_onnx, run_onnxruntime
from relax_memplan.pipeline import get_pipeline
from relax_memplan.runtime import run_and_measure
from relax_memplan.transform.annotate_dim_ranges import AnnotateDimRanges
from relax_memplan.transform.plan_dynamic_memory import PlanDynamicMemory
from tests.conftest import shared_model


@I.ir_module
class Chain:
    @R.function
    def main(x: R.Tensor(("n", 8), "float32"), y: R.Tensor((8, 8), "float32")):
        n = T.int64()
        with R.dataflow():
            a = R.exp(x)
            b = R.exp(y)
            c = R.matmul(a, b)
            d = R.exp(c)
            e = R.add(d, R.sum(b, axis=0))
            f = R.multiply(e, a)
            R.output(f)
        return f


def _reference(x, y):
    a, b = np.exp(x), np.exp(y)
    return (np.exp(a @ b) + b.sum(axis=0)) * a


def _build(strategy, ranges):
    dyn = PlanDynamicMemory(strategy=strategy, time_limit_s=0.1)
    ex = tvm.compile(Chain, "llvm", relax_pipeline=get_pipeline("llvm", dynamic_pass=dyn, dim_ranges=ranges))
    return dyn, ex


@pytest.fixture(scope="module", params=["exact", "upper_bound"])
def bounded(request):
    return request.param, *_build(request.param, {"n": (1, 64)})


@pytest.mark.parametrize("n", [1, 17, 64])
def test_numerics_and_bytes_at_several_sizes(bounded, n):
    strategy, dyn, ex = bounded
    rng = np.random.default_rng(n)
    x = rng.uniform(-1, 0, (n, 8)).astype("float32")
    y = rng.uniform(-1, 0, (8, 8)).astype("float32") * 0.1
    got = run_and_measure(ex, [x, y])
    np.testing.assert_allclose(got.outputs[0], _reference(x, y), rtol=1e-5)
    fplan = dyn.plans["main"]
    arena, lower_bound, _ = fplan.bytes_at({"n": n})
    output_bytes = n * 8 * 4
    assert got.alloc_sizes_bytes == [arena, output_bytes]  # one arena, then the output
    assert arena >= lower_bound
    if strategy == "upper_bound":
        assert arena == fplan.static_arena_bytes
    else:
        assert arena <= fplan.bytes_at({"n": 64})[0]


def test_exact_arena_grows_with_the_shape(bounded):
    strategy, dyn, _ = bounded
    sizes = [dyn.plans["main"].bytes_at({"n": n})[0] for n in (1, 16, 64)]
    if strategy == "exact":
        assert sizes[0] < sizes[1] < sizes[2]
    else:
        assert sizes[0] == sizes[1] == sizes[2]


def test_every_sample_validated_including_range_ends(bounded):
    _, dyn, _ = bounded
    samples = [s["dims"]["n"] for s in dyn.plans["main"].samples]
    assert 1 in samples and 64 in samples
    for s in dyn.plans["main"].samples:
        assert s["arena_bytes"] >= s["lower_bound_bytes"]


@pytest.mark.parametrize("n", [0, 65, 1000])
def test_shape_outside_declared_range_is_a_clear_error(bounded, n):
    _, _, ex = bounded
    x = np.zeros((n, 8), "float32")
    with pytest.raises(ValueError, match=r"dim 'n' is outside its declared range \[1, 64\]"):
        run_and_measure(ex, [x, np.zeros((8, 8), "float32")])


def test_output_is_never_placed_in_the_arena(bounded):
    _, dyn, _ = bounded
    fplan = dyn.plans["main"]
    assert "function output" in fplan.left_to_tvm.values()
    outputs = [uid for uid, why in fplan.left_to_tvm.items() if why == "function output"]
    assert not set(outputs) & set(fplan.planned)


def test_dim_with_only_a_lower_bound_is_never_planned_as_static():
    """Regression for TVM's fault of treating a dim with only a lower bound as static."""
    dyn, ex = _build("upper_bound", {"n": (4, None)})
    reasons = set(dyn.plans["main"].left_to_tvm.values())
    assert "dim n has no upper bound" in reasons
    dyn_exact, ex_exact = _build("exact", {"n": (4, None)})
    assert dyn_exact.plans["main"].planned
    y = np.full((8, 8), -0.5, "float32")
    for n in (4, 300):
        x = np.full((n, 8), -0.25, "float32")
        for build in (ex, ex_exact):
            np.testing.assert_allclose(run_and_measure(build, [x, y]).outputs[0], _reference(x, y),
                                       rtol=1e-5)
    with pytest.raises(ValueError, match=r"dim 'n' is outside its declared range \[4, inf\]"):
        run_and_measure(ex_exact, [np.zeros((3, 8), "float32"), y])


def test_unknown_dim_is_rejected_naming_the_dims_there_are():
    with pytest.raises(ValueError, match=r"'seq'.*symbolic dims there: n"):
        AnnotateDimRanges({"seq": (1, 128)})(Chain)


def test_bad_strategy_is_rejected():
    with pytest.raises(ValueError, match="strategy"):
        PlanDynamicMemory(strategy="buckets_of_joy")


def test_mobilenet_dynamic_batch_exact_matches_onnxruntime_at_lower_bound():
    path = shared_model("mobilenetv2-tiny.onnx")
    mod, _ = import_onnx(path, keep_dynamic=True)
    dyn = PlanDynamicMemory(strategy="exact", time_limit_s=0.2)
    ex = tvm.compile(mod, "llvm", relax_pipeline=get_pipeline(
        "llvm", dynamic_pass=dyn, dim_ranges={"batch": (1, 8)}))
    fplan = dyn.plans["main"]
    for batch in (1, 3, 8):
        x = np.random.default_rng(batch).standard_normal((batch, 3, 96, 96)).astype("float32")
        got = run_and_measure(ex, [x])
        ref = run_onnxruntime(path, {"x": x})
        np.testing.assert_allclose(got.outputs[0], ref[0], rtol=1e-4, atol=1e-4 * np.abs(ref[0]).max())
        arena, lower_bound, _ = fplan.bytes_at({"batch": batch})
        assert got.alloc_sizes_bytes[0] == arena
        assert arena <= 1.02 * lower_bound


@I.ir_module
class TwoDims:
    @R.function
    def main(x: R.Tensor(("n", 16), "float32"), y: R.Tensor(("m", 16), "float32")):
        n = T.int64()
        m = T.int64()
        with R.dataflow():
            a = R.exp(x)
            b = R.exp(y)
            c = R.exp(a)
            d = R.exp(b)
            e = R.sum(c, axis=0)
            f = R.sum(d, axis=0)
            h = R.multiply(c, R.sum(a, axis=0))
            k = R.multiply(d, R.sum(b, axis=0))
            g = R.add(R.add(e, f), R.add(R.sum(h, axis=0), R.sum(k, axis=0)))
            R.output(g)
        return g


def test_exact_chooses_among_stackings_per_call():
    """Two dims: the VM picks a stacking per call; its arena equals the plan at every shape."""
    dyn = PlanDynamicMemory(strategy="exact", time_limit_s=0.2, num_references=6)
    ex = tvm.compile(TwoDims, "llvm", relax_pipeline=get_pipeline(
        "llvm", dynamic_pass=dyn, dim_ranges={"n": (1, 64), "m": (1, 64)}))
    fplan = dyn.plans["main"]
    assert len(fplan.orders) >= 2 and not fplan.notes
    for n, m in [(1, 64), (64, 1), (30, 40), (64, 64), (1, 1)]:
        x = np.random.default_rng(n).uniform(-1, 0, (n, 16)).astype("float32")
        y = np.random.default_rng(m + 100).uniform(-1, 0, (m, 16)).astype("float32")
        got = run_and_measure(ex, [x, y])
        a, b = np.exp(x), np.exp(y)
        c, d = np.exp(a), np.exp(b)
        ref = c.sum(0) + d.sum(0) + (c * a.sum(0)).sum(0) + (d * b.sum(0)).sum(0)
        np.testing.assert_allclose(got.outputs[0], ref, rtol=1e-5)
        arena, lower_bound, _ = fplan.bytes_at({"n": n, "m": m})
        assert got.alloc_sizes_bytes[0] == arena
        assert arena <= 1.02 * lower_bound
