"""Live ranges and aliases found by analyze_liveness on small lowered Relax functions."""

import pytest
import tvm
from tvm.script import ir as I
from tvm.script import relax as R

from relax_memplan.analysis.liveness import analyze_liveness, dtype_size_bytes
from tests.conftest import lower_to_alloc_form


@I.ir_module
class BranchesAndViews:
    @R.function
    def main(x: R.Tensor((4, 16), "float32"), c: R.Tensor((), "bool")):
        a = R.exp(x)
        if c:
            t1 = R.exp(a)
            t2 = R.exp(t1)
            r = R.add(t2, t2)
        else:
            e1 = R.exp(x)
            r = R.add(e1, a)
        with R.dataflow():
            q = R.exp(r)
            v = R.reshape(q, (64,))
            m = R.match_cast(v, R.Tensor((64,), "float32"))
            w = R.exp(x)
            w2 = R.reshape(w, (64,))
            o = R.add(m, w2)
            R.output(o)
        return o


@pytest.fixture(scope="module")
def liveness():
    mod = lower_to_alloc_form(BranchesAndViews)
    return {t.aliases[0] if t.aliases else t.name: t for t in analyze_liveness(mod, "main").tensors}


def _overlap(a, b):
    return a.start < b.end and b.start < a.end


def test_sizes_are_bytes(liveness):
    assert liveness["a"].size_bytes == 4 * 16 * 4
    assert liveness["o"].size_bytes == 64 * 4
    assert dtype_size_bytes("bool", 3) == 3
    assert dtype_size_bytes("float16", 10) == 20


def test_output_is_left_to_tvm(liveness):
    assert liveness["o"].reason == "function output"
    assert all(t.plannable for k, t in liveness.items() if k != "o")


def test_reshape_view_and_match_cast_extend_live_range(liveness):
    # q is read through v = reshape(q) and m = match_cast(v) by the final add,
    # so q must stay live while w (allocated later) is live.
    q, w = liveness["q"], liveness["w"]
    assert {"v", "m"} <= set(q.aliases)
    assert _overlap(q, w)
    assert q.end == liveness["o"].start + 2  # last use: the add that writes o


def test_branch_tensors_never_overlap_other_branch(liveness):
    then_tensors = [liveness[k] for k in ("t1", "t2")]
    else_tensors = [liveness["e1"]]
    for t in then_tensors + else_tensors:
        assert t.in_branch
    for t in then_tensors:
        for e in else_tensors:
            assert not _overlap(t, e)


def test_value_from_outside_stays_live_across_the_if(liveness):
    a = liveness["a"]
    for k in ("t1", "t2", "e1"):
        assert _overlap(a, liveness[k])


def test_branch_results_live_until_used_after_the_if(liveness):
    then_r = liveness["r_then"]
    else_r = liveness["r_else"]
    assert then_r.end == else_r.end
    assert then_r.end > liveness["q"].start


def test_symbolic_shape_and_retaining_callee_are_left_to_tvm():
    @I.ir_module
    class Symbolic:
        @R.function
        def helper(y: R.Tensor((8,), "float32")) -> R.Tensor((8,), "float32"):
            return y

        @R.function
        def main(x: R.Tensor(("n",), "float32"), z: R.Tensor((8,), "float32")):
            a = R.exp(x)
            b = R.exp(z)
            c = Symbolic.helper(b)
            d = R.add(c, z)
            e = R.exp(a)
            return (d, e)

    mod = lower_to_alloc_form(Symbolic)
    tensors = {t.aliases[0] if t.aliases else t.name: t for t in analyze_liveness(mod, "main").tensors}
    assert tensors["a"].reason == "symbolic shape"
    assert tensors["b"].reason.startswith("passed to")
    assert tensors["d"].reason == "function output"


def test_unknown_function_is_an_error():
    mod = lower_to_alloc_form(BranchesAndViews)
    with pytest.raises(ValueError, match="nope"):
        analyze_liveness(mod, "nope")


def test_producer_is_the_kernel_that_writes_the_tensor(liveness):
    """The per-tensor report names the kernel writing each tensor: in destination-passing
    style, the first kernel taking it as an argument (not a later reader)."""
    assert liveness["r_then"].producer == "add"  # then read by the exp writing q
    assert liveness["q"].producer == liveness["w"].producer == "tir_exp"
    assert liveness["o"].producer == "add1"
