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


def _build(strategy, ranges, mod=Chain, **kwargs):
    if strategy == "buckets":
        kwargs.setdefault("buckets", {"n": [16, 32]})
    dyn = PlanDynamicMemory(strategy=strategy, time_limit_s=0.1, **kwargs)
    ex = tvm.compile(mod, "llvm", relax_pipeline=get_pipeline("llvm", dynamic_pass=dyn, dim_ranges=ranges))
    return dyn, ex


@pytest.fixture(scope="module", params=["exact", "upper_bound", "buckets"])
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
    if strategy != "upper_bound":
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
    assert not fplan.notes and fplan.checked["max_ratio"] <= 1.02
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


def test_exact_is_within_the_ratio_target_at_every_shape_of_the_range(bounded):
    strategy, dyn, _ = bounded
    fplan = dyn.plans["main"]
    if strategy == "upper_bound":
        assert fplan.checked == {}
        return
    assert fplan.checked["enumerated"] and fplan.checked["shapes"] == 64
    assert fplan.checked["max_ratio"] <= 1.02
    for n in range(1, 65):
        arena, lower_bound, _ = fplan.bytes_at({"n": n})
        assert lower_bound <= arena <= 1.02 * lower_bound


def test_buckets_use_the_plan_made_at_the_bucket_value(bounded):
    strategy, dyn, ex = bounded
    if strategy != "buckets":
        return
    fplan = dyn.plans["main"]
    assert [(p.kind, p.when) for p in fplan.pieces if p.kind == "bucket"] == [
        ("bucket", {"n": 16}), ("bucket", {"n": 32})]
    assert fplan.piece_for({"n": 16}).when == {"n": 16}
    assert fplan.piece_for({"n": 17}).kind == "generic"
    for n in (16, 32, 17):
        x = np.full((n, 8), -0.5, "float32")
        y = np.full((8, 8), -0.25, "float32")
        got = run_and_measure(ex, [x, y])
        np.testing.assert_allclose(got.outputs[0], _reference(x, y), rtol=1e-5)
        assert got.alloc_sizes_bytes[0] == fplan.bytes_at({"n": n})[0]


def test_shapes_above_the_ratio_target_are_pinned_and_run_at_their_own_plan():
    """One stacking kept (num_references=1) and a ratio target of 1.0: the shapes where
    that stacking is above the lower bound get their own constant plan, chosen per call."""
    dyn, ex = _build("exact", {"n": (1, 12), "m": (1, 12)}, mod=TwoDims, num_references=1,
                     max_ratio=1.0)
    fplan = dyn.plans["main"]
    pinned = [p.when for p in fplan.pieces if p.kind == "pinned"]
    assert pinned and fplan.checked["pinned"] == len(pinned)
    assert fplan.checked["max_ratio"] < 1.02
    for dims in pinned[:3] + [{"n": 12, "m": 12}]:
        n, m = dims["n"], dims["m"]
        x = np.full((n, 16), -0.5, "float32")
        y = np.full((m, 16), -0.25, "float32")
        got = run_and_measure(ex, [x, y])
        arena, lower_bound, _ = fplan.bytes_at(dims)
        assert got.alloc_sizes_bytes[0] == arena
        if dims in pinned:
            assert arena == lower_bound


def test_size_classes_keep_few_distinct_allocation_sizes():
    """Bounded pool policy: arena and output storage sizes are those of the dims' class cell."""
    dyn, ex = _build("exact", {"n": (1, 64)}, size_classes=True, size_class_growth=2.0)
    fplan = dyn.plans["main"]
    assert fplan.class_values == {"n": [1, 2, 4, 8, 16, 32, 64]}
    seen = set()
    y = np.full((8, 8), -0.25, "float32")
    for n in range(1, 65):
        x = np.full((n, 8), -0.5, "float32")
        got = run_and_measure(ex, [x, y])
        np.testing.assert_allclose(got.outputs[0], _reference(x, y), rtol=1e-5)
        arena, lower_bound, _ = fplan.bytes_at({"n": n})
        cell = fplan.cell_of({"n": n})
        assert got.alloc_sizes_bytes[0] == arena == fplan.class_arena_bytes[cell] >= lower_bound
        (out_uid, table), = fplan.output_class_bytes.items()
        assert got.alloc_sizes_bytes[1] == table[cell] == cell[0] * 8 * 4
        seen.add(tuple(got.alloc_sizes_bytes))
    assert len(seen) == 7  # one (arena, output) pair per class


@pytest.mark.parametrize("kwargs, match", [
    ({"strategy": "buckets"}, "needs buckets"),
    ({"strategy": "buckets", "buckets": {"n": [0, 16]}}, "value < 1"),
    ({"strategy": "buckets", "buckets": {"n": 16}}, "list of ints"),
    ({"max_ratio": 0.9}, "max_ratio"),
    ({"size_class_growth": 1.0}, "size_class_growth"),
])
def test_bad_dynamic_arguments_are_rejected(kwargs, match):
    with pytest.raises((ValueError, TypeError), match=match):
        PlanDynamicMemory(**kwargs)


def test_pooled_vm_keeps_working_after_its_cache_is_released():
    from tvm import relax

    from relax_memplan.runtime import release_pooled_memory

    _, ex = _build("exact", {"n": (1, 64)}, size_classes=True)
    vm = relax.VirtualMachine(ex, tvm.cpu(), memory_cfg="pooled")
    y = np.full((8, 8), -0.25, "float32")
    for n in (3, 64, 5):
        x = np.full((n, 8), -0.5, "float32")
        out = vm["main"](tvm.runtime.tensor(x), tvm.runtime.tensor(y)).numpy()
        np.testing.assert_allclose(out, _reference(x, y), rtol=1e-5)
        release_pooled_memory()


@pytest.mark.parametrize("lower, upper, growth, values", [
    (1, 128, 4.0, [1, 2, 8, 32, 128]),
    (1, 100, 2.0, [1, 3, 6, 12, 25, 50, 100]),
    (256, 1024, 4.0, [256, 1024]),
    (5, 5, 2.0, [5]),
    (1, 3, 10.0, [1, 3]),
])
def test_size_classes_are_anchored_at_the_upper_bound(lower, upper, growth, values):
    from relax_memplan.analysis.dims import DimRange
    from relax_memplan.transform._dynamic_plan import size_class_values

    assert size_class_values(DimRange(lower, upper), growth) == values


def test_dim_declared_with_a_step_is_checked_on_its_grid_and_enumerated():
    """n in {4, 8, ..., 64}: the plan is checked at those 16 shapes only and a shape off the
    grid (which a model like a stride-32 CNN could not handle) is refused before any kernel."""
    dyn, ex = _build("exact", {"n": (4, 64, 4)})
    fplan = dyn.plans["main"]
    assert fplan.ranges["n"].step == 4
    assert fplan.checked["enumerated"] and fplan.checked["shapes"] == 16
    y = np.full((8, 8), -0.25, "float32")
    for n in (4, 36, 64):
        x = np.full((n, 8), -0.5, "float32")
        np.testing.assert_allclose(run_and_measure(ex, [x, y]).outputs[0], _reference(x, y), rtol=1e-5)
    with pytest.raises(ValueError, match=r"dim 'n' is outside its declared range \[4, 64\] in steps of 4"):
        run_and_measure(ex, [np.zeros((37, 8), "float32"), y])


@I.ir_module
class AliasedAcrossAllocs:
    @R.function
    def main(x: R.Tensor(("n", 8), "float32")):
        n = T.int64()
        with R.dataflow():
            q = R.exp(x)
            v = R.reshape(q, R.shape([n * 8]))  # a view of q's storage
            m = R.match_cast(v, R.Tensor((n * 8,), "float32"))  # another alias
            w = R.exp(x)  # allocated after q's last direct use ...
            w2 = R.exp(w)
            w3 = R.reshape(w2, R.shape([n * 8]))
            o = R.add(m, w3)  # ... while q is still read through m
            R.output(o)
        return o


@pytest.mark.parametrize("strategy", ["exact", "upper_bound"])
def test_storage_is_not_reused_while_a_reshape_or_match_cast_alias_is_live(strategy):
    """Regression for the TVM planner fault of reusing a storage while an alias of it is still
    live: q is read through its reshape view v after w/w2 (fused by then) are allocated, so they
    must not share bytes at any shape. (A match_cast to the same shape is normalised away here;
    tests/analysis/test_liveness.py checks a surviving match_cast alias.)"""
    dyn, ex = _build(strategy, {"n": (1, 32)}, mod=AliasedAcrossAllocs)
    fplan = dyn.plans["main"]
    tensors = {t.uid: t for t in fplan.liveness.tensors}
    q = next(t for t in tensors.values() if "v" in t.aliases)
    assert any(t.uid != q.uid and t.start < q.end for t in tensors.values() if t.uid in fplan.planned)
    for n in (1, 13, 32):
        _, _, offsets = fplan.bytes_at({"n": n})
        sizes = fplan.sizes_at({"n": n})
        for other in fplan.planned:
            t = tensors[other]
            if other != q.uid and t.start < q.end and q.start < t.end:  # live together
                assert (offsets[other] >= offsets[q.uid] + sizes[q.uid]
                        or offsets[q.uid] >= offsets[other] + sizes[other])
        x = np.random.default_rng(n).uniform(-1, 1, (n, 8)).astype("float32")
        expected = np.exp(x).reshape(-1) + np.exp(np.exp(x)).reshape(-1)
        np.testing.assert_allclose(run_and_measure(ex, [x]).outputs[0], expected, rtol=1e-5)


def test_bytes_at_refuses_a_shape_outside_the_declared_range_naming_the_dim(bounded):
    """Regression: bytes_at returned bytes above the range and at 0, and a missing dim
    raised a raw KeyError."""
    fplan = bounded[1].plans["main"]
    assert fplan.bytes_at({"n": 64})[0] > 0  # the upper bound itself is in range
    for n in (65, 0):
        with pytest.raises(ValueError, match=rf"function main: dim n={n} is outside its "
                                             r"declared range \[1, 64\]$"):
            fplan.bytes_at({"n": n})
    with pytest.raises(ValueError, match=r"function main: no value for dim 'n' \(the arena "
                                         r"depends on n; given: m\)"):
        fplan.bytes_at({"m": 3})
    with pytest.raises(ValueError, match="dim n='2' is not an integer"):
        fplan.bytes_at({"n": "2"})
