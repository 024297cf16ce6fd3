"""In-place reuse in liveness, the validator and PlanStaticMemory (numerics through the VM)."""

import numpy as np
import pytest
import tvm
from tvm.script import ir as I
from tvm.script import relax as R

from relax_memplan.analysis.inplace import kernel_table
from relax_memplan.analysis.liveness import analyze_liveness
from relax_memplan.pipeline import get_pipeline
from relax_memplan.planner import Buffer, OverlapError, find_violations, validate
from relax_memplan.runtime import run_and_measure
from relax_memplan.transform.plan_static_memory import PlanStaticMemory
from tests.conftest import lower_to_alloc_form


@I.ir_module
class Chain:
    @R.function
    def main(x: R.Tensor((64, 64), "float32")):
        with R.dataflow():
            a = R.exp(x)
            b = R.add(a, R.const(1.0, "float32"))
            c = R.multiply(b, R.const(2.0, "float32"))
            d = R.sum(c, axis=[1])
            R.output(d)
        return d


@I.ir_module
class Residual:
    """The default pipeline fuses ``matmul + a`` into one kernel reading ``a`` at the output's
    indices: its output may be written over ``a``, which dies there."""

    @R.function
    def main(x: R.Tensor((64, 64), "float32")):
        with R.dataflow():
            a = R.matmul(x, x)
            c = R.add(R.matmul(x, x), a)
            d = R.sum(c, axis=[1])
            R.output(d)
        return d


@I.ir_module
class TwoViews:
    """v1 and v2 view a; b = v1 + 1 could be written over a, but v2 is read afterwards."""

    @R.function
    def main(x: R.Tensor((64, 64), "float32")):
        with R.dataflow():
            a = R.exp(x)
            v1 = R.reshape(a, (4096,))
            v2 = R.reshape(a, (64, 64))
            b = R.add(v1, R.const(1.0, "float32"))
            c = R.add(v2, R.const(1.0, "float32"))
            s = R.sum(b) + R.sum(c)
            R.output(s)
        return s


def _liveness(mod):
    lowered = lower_to_alloc_form(mod)
    return analyze_liveness(lowered, "main", kernel_table(lowered))


def test_elementwise_chain_is_written_in_place():
    live = _liveness(Chain)
    assert [(u.in_uid, u.out_uid) for u in live.inplace] == [("alloc", "alloc1"),
                                                              ("alloc1", "alloc2")]
    assert live.sharing_groups() == [["alloc", "alloc1", "alloc2"]]


def test_two_views_trap_no_inplace_while_the_other_view_is_read():
    live = _liveness(TwoViews)
    a_uid = live.tensors[0].uid
    over_a = [u.kernel for u in live.inplace if u.in_uid == a_uid]
    # the add through v1 runs while v2 is still to be read: refused; the add through v2 is
    # the last reader of a and may write over it
    assert over_a == ["add1"]


def test_reduction_input_and_function_param_are_never_overwritten():
    live = _liveness(Chain)
    # exp reads the parameter x: not a planned tensor; sum is a reduction
    assert all(u.kernel.startswith(("add", "multiply")) for u in live.inplace)


def test_validator_accepts_declared_sharing_only():
    a, b, c = Buffer("a", 0, 3, 64), Buffer("b", 1, 4, 64), Buffer("c", 2, 5, 64)
    validate([a, b], {"a": 0, "b": 0}, shared=[["a", "b"]])
    with pytest.raises(OverlapError):  # not declared
        validate([a, b], {"a": 0, "b": 0})
    with pytest.raises(OverlapError):  # declared, but c is not in the group
        validate([a, b, c], {"a": 0, "b": 0, "c": 0}, shared=[["a", "b"]])
    # declared but placed at different, overlapping offsets: a wrong sharing
    errors = find_violations([a, Buffer("b", 1, 4, 128)], {"a": 0, "b": 0}, shared=[["a", "b"]])
    assert errors and isinstance(errors[0], OverlapError)


def _build(mod, inplace):
    plan = PlanStaticMemory(inplace=inplace)
    ex = tvm.compile(mod, "llvm", relax_pipeline=get_pipeline("llvm", plan_pass=plan))
    return plan, ex


@pytest.mark.parametrize("mod,ref", [
    (Residual, lambda x: (2 * (x @ x)).sum(axis=1)),
    (TwoViews, lambda x: (np.exp(x) + 1).sum() * 2),
], ids=["residual", "two_views"])
def test_inplace_numerics_match_numpy_and_bound_never_rises(mod, ref):
    x = np.random.default_rng(0).uniform(-1, 1, (64, 64)).astype("float32")
    plan_off, ex_off = _build(mod, False)
    plan_on, ex_on = _build(mod, True)
    got = run_and_measure(ex_on, [x]).outputs[0]
    np.testing.assert_allclose(got, ref(x), rtol=1e-4)
    off, on = plan_off.plans["main"], plan_on.plans["main"]
    assert on.lower_bound_bytes <= off.lower_bound_bytes
    assert on.lower_bound_without_inplace_bytes == off.lower_bound_bytes
    if mod is Residual:
        assert len(on.liveness.inplace) == 1
        assert on.lower_bound_bytes < off.lower_bound_bytes


def test_report_states_inplace_counts_and_bound_without_it():
    from relax_memplan.report.summary import static_functions
    from relax_memplan.report.text import _format_function
    from relax_memplan.transform.record_storage import RecordStorage

    plan = PlanStaticMemory(inplace=True)
    tvm.compile(Residual, "llvm", relax_pipeline=get_pipeline("llvm", plan_pass=plan))
    functions, _ = static_functions(plan, RecordStorage(), RecordStorage())
    f = functions["main"]
    assert (f.inplace_capable_kernels, f.inplace_calls) == (1, 1)
    assert f.lower_bound_without_inplace_bytes > f.lower_bound_bytes
    text = "\n".join(_format_function(f))
    assert "without in-place reuse" in text and "1 calls write over an input" in text


def test_inplace_chain_members_live_together_pass_the_validator():
    """Regression (mobilenetv2, silero-vad): b is written over a, c over b; b and c are live
    together at c's call. The chain's placements must make every pair ancestor/descendant."""
    from relax_memplan.transform._inplace_plan import nesting_from_groups, place_with_sharing

    bufs = [Buffer("a", 0, 2, 64), Buffer("b", 1, 3, 64), Buffer("c", 2, 4, 64),
            Buffer("z", 0, 4, 64)]
    nested = nesting_from_groups([["a", "b", "c"]])
    assert nested == {"b": ("a", 0), "c": ("b", 0)}
    _, offsets = place_with_sharing(bufs, nested, None, 0.5)
    assert offsets["a"] == offsets["b"] == offsets["c"] != offsets["z"]
    # a star (every member under the first) would reject the b/c overlap
    with pytest.raises(OverlapError):
        validate(bufs, offsets, nested={"b": ("a", 0), "c": ("a", 0)})


@I.ir_module
class ReorderAndInplace:
    """Importer's order: both matmuls before their consumers (reordering lowers the peak);
    ``c = a@a + b`` fuses into one kernel that may write over ``b`` (in-place lowers it)."""

    @R.function
    def main(x: R.Tensor((64, 64), "float32")):
        with R.dataflow():
            a = R.matmul(x, x)
            b = R.matmul(x, R.permute_dims(x))
            sa = R.sum(a, axis=[1])
            c = R.add(R.matmul(x, x), b)
            sc = R.sum(c, axis=[1])
            out = R.add(sa, sc)
            R.output(out)
        return out


def test_report_gives_the_bound_in_importer_order_after_reorder_and_after_inplace():
    from relax_memplan.report.summary import static_functions
    from relax_memplan.report.text import _format_function
    from relax_memplan.transform.record_storage import RecordStorage
    from relax_memplan.transform.reorder_for_memory import ReorderForMemory

    today = PlanStaticMemory()  # the importer's order, no in-place: today's number
    tvm.compile(ReorderAndInplace, "llvm", relax_pipeline=get_pipeline("llvm", plan_pass=today))
    plan, reorder = PlanStaticMemory(inplace=True), ReorderForMemory()
    ex = tvm.compile(ReorderAndInplace, "llvm", relax_pipeline=get_pipeline(
        "llvm", plan_pass=plan, reorder_pass=reorder))
    functions, _ = static_functions(plan, RecordStorage(), RecordStorage(),
                                    reorder_pass=reorder)
    f = functions["main"]
    assert any(b.applied for b in reorder.blocks)
    assert f.lower_bound_importer_order_bytes == today.plans["main"].lower_bound_bytes
    assert (f.lower_bound_importer_order_bytes > f.lower_bound_reordered_bytes
            >= f.lower_bound_bytes)
    assert f.lower_bound_reordered_bytes == plan.plans["main"].lower_bound_without_inplace_bytes
    without_reorder, _ = static_functions(plan, RecordStorage(), RecordStorage())
    # not told about the reordering, the importer's bound would be the reordered one: wrong
    assert without_reorder["main"].lower_bound_importer_order_bytes != \
        f.lower_bound_importer_order_bytes
    line = [s for s in _format_function(f) if s.strip().startswith("lower bound: ")]
    assert line == [f"  lower bound: importer's order {f.lower_bound_importer_order_bytes:,} B "
                    f"-> reordered {f.lower_bound_reordered_bytes:,} B -> in-place "
                    f"{f.lower_bound_bytes:,} B; our arena {f.arena_bytes:,} B; TVM default "
                    f"0 B per call"]
    x = np.random.default_rng(0).uniform(-1, 1, (64, 64)).astype("float32")
    got = run_and_measure(ex, [x]).outputs[0]
    np.testing.assert_allclose(got, 2 * (x @ x).sum(1) + (x @ x.T).sum(1), rtol=1e-4, atol=1e-3)
