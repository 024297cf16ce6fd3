"""PlanStaticMemory: arena placement, fallback to TVM, and numerics through the VM."""

import numpy as np
import pytest
import tvm
from tvm import relax
from tvm.script import ir as I
from tvm.script import relax as R
from tvm.script import tirx as T

from relax_memplan.pipeline import get_pipeline
from relax_memplan.planner import Buffer, validate
from relax_memplan.runtime import run_and_measure
from relax_memplan.transform.plan_static_memory import PlanStaticMemory
from relax_memplan.transform.record_storage import RecordStorage
from tests.analysis.test_liveness import BranchesAndViews


def _reference(x, c):
    a = np.exp(x)
    r = np.exp(np.exp(a)) * 2 if c else np.exp(x) + a
    return (np.exp(r).reshape(64) + np.exp(x).reshape(64)).astype("float32")


@pytest.fixture(scope="module")
def builds():
    plan_pass, ours_rec = PlanStaticMemory(), RecordStorage()
    ours = tvm.compile(BranchesAndViews, "llvm", relax_pipeline=get_pipeline(
        "llvm", plan_pass=plan_pass, record_pass=ours_rec))
    return plan_pass, ours, ours_rec


@pytest.mark.parametrize("cond", [True, False])
def test_both_branches_match_numpy(builds, cond):
    _, ours, ours_rec = builds
    x = np.random.default_rng(1).uniform(-1, 0, (4, 16)).astype("float32")
    got = run_and_measure(ours, [x, np.array(cond)])
    np.testing.assert_allclose(got.outputs[0], _reference(x, cond), rtol=1e-5)
    # one arena + the output
    assert got.num_allocs == 2
    assert got.alloc_bytes == ours_rec.summaries["main"].static_total_bytes


def _storage_vars_defined_in_branches(func):
    """Names of alloc_storage results bound inside an If branch and used outside it."""
    text = func.script()
    return [line.split(":")[0].strip() for line in text.splitlines()
            if "R.memory.alloc_storage" in line and line.startswith("        ")]


def test_tvm_planner_leaks_branch_storage_and_ours_does_not():
    """Regression for TVM's known fault: StaticPlanBlockMemory binds a storage inside the
    then-branch and reuses it in the else-branch and after the If (the VM then crashes on
    either path). Our arena is bound once at the top of the function."""
    from tests.conftest import lower_to_alloc_form

    lowered = lower_to_alloc_form(BranchesAndViews)
    theirs = relax.transform.StaticPlanBlockMemory()(lowered)["main"]
    assert _storage_vars_defined_in_branches(theirs), "TVM's planner no longer leaks; update note"
    ours = relax.transform.StaticPlanBlockMemory()(PlanStaticMemory()(lowered))["main"]
    assert _storage_vars_defined_in_branches(ours) == []


def test_plan_is_valid_for_every_aliased_live_range(builds):
    plan_pass = builds[0]
    fplan = plan_pass.plans["main"]
    (arena,) = fplan.arenas
    tensors = {t.uid: t for t in fplan.liveness.tensors}
    buffers = [Buffer(uid, tensors[uid].start, tensors[uid].end, tensors[uid].size_bytes, 64)
               for uid in arena.offsets]
    validate(buffers, arena.offsets)
    assert all(off % 64 == 0 for off in arena.offsets.values())
    assert fplan.lower_bound_bytes <= arena.arena_bytes


def test_branch_local_tensors_share_the_arena(builds):
    plan_pass = builds[0]
    fplan = plan_pass.plans["main"]
    # The then-branch needs 3 live (4,16) tensors at most plus `a`; the arena is far
    # smaller than the sum of all tensors.
    total = sum(t.size_bytes for t in fplan.liveness.plannable)
    assert fplan.arena_bytes < total
    assert fplan.arena_bytes == fplan.lower_bound_bytes


def test_arena_attrs_and_ir_shape():
    mod = BranchesAndViews
    from tests.conftest import lower_to_alloc_form

    lowered = lower_to_alloc_form(mod)
    planned = PlanStaticMemory()(lowered)
    func = planned["main"]
    assert int(func.attrs["relax_memplan.arena_bytes"]) > 0
    text = func.script()
    assert text.count("R.memory.alloc_storage") == 1
    assert 'R.dtype("uint8")' in text
    assert "R.memory.ensure_zero_offset" in text
    # only the output is left as builtin.alloc_tensor for TVM
    assert text.count("R.builtin.alloc_tensor") == 1


@I.ir_module
class SymbolicAndStatic:
    @R.function
    def main(x: R.Tensor(("n", 8), "float32"), y: R.Tensor((8, 8), "float32")):
        n = T.int64()
        with R.dataflow():
            a = R.exp(x)
            b = R.exp(y)
            c = R.matmul(a, b)
            d = R.exp(c)
            e = R.add(d, R.sum(b, axis=0))
            R.output(e)
        return e


def test_symbolic_tensors_fall_back_to_tvm_and_run_at_several_sizes():
    plan_pass = PlanStaticMemory()
    ex = tvm.compile(SymbolicAndStatic, "llvm", relax_pipeline=get_pipeline("llvm", plan_pass=plan_pass))
    live = plan_pass.plans["main"].liveness
    assert {t.reason for t in live.left_to_tvm} >= {"symbolic shape"}
    assert any(t.plannable for t in live.tensors)  # the (8, 8) ones
    y = np.random.default_rng(0).standard_normal((8, 8)).astype("float32") * 0.1
    for n in (1, 3, 17):
        x = np.random.default_rng(n).standard_normal((n, 8)).astype("float32") * 0.1
        out = run_and_measure(ex, [x, y]).outputs[0]
        b = np.exp(y)
        ref = np.exp(np.exp(x) @ b) + b.sum(axis=0)
        np.testing.assert_allclose(out, ref, rtol=1e-5)


@pytest.mark.parametrize("alignment", [0, 32, 96])
def test_bad_alignment_is_rejected(alignment):
    with pytest.raises(ValueError, match="alignment_bytes"):
        PlanStaticMemory(alignment_bytes=alignment)


def test_pipeline_is_registered_by_name():
    assert isinstance(relax.get_pipeline("relax_memplan", target="llvm"), tvm.transform.Pass)
    with pytest.raises(ValueError, match="planner"):
        get_pipeline("llvm", planner="nope")


@I.ir_module
class TinyMatmuls:
    """Two live (6, 6) float32 intermediates: 144 B each, 192 B at a 64-byte-aligned offset,
    so our arena (384 B) is larger than TVM's two exact-size tokens (288 B)."""

    @R.function
    def main(x: R.Tensor((6, 6), "float32")):
        with R.dataflow():
            a = R.matmul(x, x)
            b = R.matmul(a, a)
            c = R.matmul(b, b)
            R.output(c)
        return c


def test_tiny_tensors_keep_tvms_plan():
    from tests.conftest import lower_to_alloc_form

    lowered = lower_to_alloc_form(TinyMatmuls)
    plan_pass = PlanStaticMemory()
    planned = plan_pass(lowered)
    fplan = plan_pass.plans["main"]
    assert fplan.fallback_reason == "TVM's plan is smaller (432 B vs our 528 B per call)"
    assert (fplan.tvm_bytes_per_call, fplan.bytes_per_call) == (432, 528)
    assert fplan.arenas == [] and fplan.rejected_arenas[0].arena_bytes == 384
    tvm.ir.assert_structural_equal(planned["main"], lowered["main"])


def test_our_plan_is_kept_when_it_is_not_larger(builds):
    fplan = builds[0].plans["main"]
    assert fplan.fallback_reason is None and fplan.arenas
    assert fplan.bytes_per_call <= fplan.tvm_bytes_per_call


def test_fallback_is_taken_whenever_tvms_figure_is_smaller(monkeypatch):
    """The guarantee can fail: with TVM's figure forced below ours, our plan is dropped."""
    from relax_memplan.transform import plan_static_memory
    from tests.conftest import lower_to_alloc_form

    monkeypatch.setattr(plan_static_memory, "_tvm_bytes_per_call", lambda mod: {"main": 1})
    lowered = lower_to_alloc_form(BranchesAndViews)
    plan_pass = PlanStaticMemory()
    planned = plan_pass(lowered)
    fplan = plan_pass.plans["main"]
    assert fplan.fallback_reason.startswith("TVM's plan is smaller (1 B vs our ")
    assert fplan.arenas == [] and fplan.rejected_arenas
    tvm.ir.assert_structural_equal(planned["main"], lowered["main"])
