"""In-place reuse with symbolic sizes: liveness (sizes equal as expressions), PlanDynamicMemory's
exact strategy (one arena buffer per sharing group, validated per shape), numerics."""

import copy
import json

import numpy as np
import pytest
import tvm
from tvm.script import ir as I
from tvm.script import relax as R
from tvm.script import tirx as T

from relax_memplan.analysis.inplace import kernel_table
from relax_memplan.analysis.liveness import analyze_liveness
from relax_memplan.cli import main
from relax_memplan.pipeline import get_pipeline
from relax_memplan.planner import OverlapError
from relax_memplan.runtime import run_and_measure
from relax_memplan.transform.plan_dynamic_memory import PlanDynamicMemory
from tests.conftest import shared_model
from tests.cli.test_cli import _check_dynamic_tensors


@I.ir_module
class Residual:
    """``c = matmul(b, y) + a`` fuses into one kernel reading ``a`` at the output's indices:
    ``c`` (n x 8) may be written over ``a`` (n x 8), which dies there; ``b`` is live across."""

    @R.function
    def main(x: R.Tensor(("n", 8), "float32"), y: R.Tensor((8, 8), "float32"),
             w: R.Tensor((8, 8), "float32")):
        with R.dataflow():
            a = R.matmul(x, y)
            b = R.matmul(x, w)
            c = R.add(R.matmul(b, y), a)
            d = R.add(R.matmul(c, y), b)
            R.output(d)
        return d


def _alloc_form(out_dim):
    """A module after CallTIRRewrite: ``b = a + 1`` by an elementwise kernel whose two buffers
    have one shape var ``k``; ``a`` has ``n`` elements, ``b`` has ``out_dim`` (``"n"`` or ``"m"``)."""

    @I.ir_module
    class Mod:
        @T.prim_func(private=True, s_tir=True)
        def add_one(a: T.handle, b: T.handle):
            k = T.int64()
            A = T.match_buffer(a, (k,), "float32")
            B = T.match_buffer(b, (k,), "float32")
            for i in range(k):
                with T.sblock("B"):
                    vi = T.axis.spatial(k, i)
                    B[vi] = A[vi] + T.float32(1)

        @R.function
        def main(x: R.Tensor(("n",), "float32"), y: R.Tensor(("m",), "float32")):
            n = T.int64()
            m = T.int64()
            R.func_attr({"relax.force_pure": True, "tir_var_lower_bound": {"n": 1, "m": 1},
                         "tir_var_upper_bound": {"n": 64, "m": 64}})
            cls = Mod
            a = R.builtin.alloc_tensor(R.shape([n]), R.dtype("float32"), 0, R.str("global"))
            _1 = cls.add_one(x, a)
            b = R.builtin.alloc_tensor(R.shape([n if out_dim == "n" else m]), R.dtype("float32"),
                                       0, R.str("global"))
            _2 = cls.add_one(a, b)
            c = R.builtin.alloc_tensor(R.shape([n if out_dim == "n" else m]), R.dtype("float32"),
                                       0, R.str("global"))
            _3 = cls.add_one(b, c)
            return c

    return Mod


def test_symbolic_sizes_equal_as_expressions_share():
    mod = _alloc_form("n")
    live = analyze_liveness(mod, "main", kernel_table(mod))
    assert [(u.in_uid, u.out_uid) for u in live.inplace] == [("a", "b")]


def test_symbolic_sizes_not_provably_equal_are_refused():
    """4 * n and 4 * m bytes are equal whenever n == m, but not as expressions: refused."""
    mod = _alloc_form("m")
    live = analyze_liveness(mod, "main", kernel_table(mod))
    assert live.inplace == []
    dyn = PlanDynamicMemory(strategy="exact", inplace=True, time_limit_s=0.1)
    dyn(mod)
    fplan = dyn.plans["main"]
    assert fplan.planned and fplan.shared == {} and fplan.inplace == []


def _build(inplace, strategy="exact"):
    dyn = PlanDynamicMemory(strategy=strategy, time_limit_s=0.1, inplace=inplace)
    ex = tvm.compile(Residual, "llvm", relax_pipeline=get_pipeline(
        "llvm", dynamic_pass=dyn, dim_ranges={"n": (1, 64)}))
    return dyn.plans["main"], ex


@pytest.fixture(scope="module")
def residual():
    return _build(False), _build(True)


@pytest.mark.parametrize("n", [1, 37, 64])
def test_residual_numerics_and_arena_with_inplace(residual, n):
    (off, _), (on, ex) = residual
    assert len(on.inplace) == 1 and len(on.planned) == len(off.planned) - 1
    rng = np.random.default_rng(n)
    x = rng.uniform(-1, 1, (n, 8)).astype("float32")
    y, w = rng.uniform(-1, 1, (2, 8, 8)).astype("float32")
    got = run_and_measure(ex, [x, y, w])
    b = x @ w
    np.testing.assert_allclose(got.outputs[0], (b @ y + x @ y) @ y + b, rtol=1e-4, atol=1e-5)
    arena_on, lb_on, offsets = on.bytes_at({"n": n})
    arena_off, lb_off, _ = off.bytes_at({"n": n})
    use = on.inplace[0]
    assert offsets[use.in_uid] == offsets[use.out_uid]
    assert on.lower_bound_without_inplace_at({"n": n}) == lb_off
    # a, b and c live together without in-place; c over a: one n x 8 tensor fewer at the peak
    assert lb_on == lb_off - -(-32 * n // 64) * 64
    assert arena_on == lb_on and arena_off == lb_off
    assert got.alloc_sizes_bytes[0] == arena_on


def test_validator_accepts_exactly_the_declared_sharing(residual):
    _, (on, _) = residual
    dims = {"n": 64}
    on.bytes_at(dims)  # valid as planned: c at a's offset, declared
    (a, c), = on.sharing
    undeclared = copy.copy(on)
    undeclared.sharing = []  # the same offsets without the declaration: an overlap
    with pytest.raises(OverlapError):
        undeclared.bytes_at(dims)
    wrong = copy.copy(on)  # c placed at b's offset (b is live with c), sharing still [a, c]
    b = next(u for u in on.planned if u != a)
    wrong.shared = {c: b}
    with pytest.raises(OverlapError, match=f"'{c}'|'{b}'"):
        wrong.bytes_at(dims)


def test_upper_bound_strategy_ignores_inplace():
    fplan, _ = _build(True, "upper_bound")
    assert fplan.inplace == [] and fplan.shared == {}


def test_bert_tiny_dynamic_inplace_matches_onnxruntime_at_range_ends(tmp_path, capsys):
    """bert-tiny, seq 1..128 (batch 1): numerics at both ends of the range with in-place on,
    the residual adds written over their inputs, the bound below the one without in-place."""
    cfg = tmp_path / "inplace.yaml"
    cfg.write_text("planner:\n  inplace: true\n")
    report = tmp_path / "bert.json"
    status = main(["compile", str(shared_model("bert-tiny-randw.onnx")), "--config", str(cfg),
                   "--dim", "batch=1..1", "--dim", "seq=1..128", "--sample-shapes", "2",
                   "--verify", "-q", "--report", str(report), "--time-limit", "0.2"])
    assert status == 0
    text = capsys.readouterr().out
    data = json.loads(report.read_text())
    assert [s["dims"]["seq"] for s in data["shapes"]] == [1, 128]
    assert data["inplace_calls"] >= 4
    sharing = [t for t in data["tensors"] if t["shares_storage_with"]]
    assert len(sharing) == data["inplace_calls"]
    for s in data["shapes"]:
        assert s["verified"] and s["max_abs_error"] < 1e-4
        assert s["lower_bound_bytes"] < s["lower_bound_without_inplace_bytes"]
        assert s["arena_bytes"] <= 1.02 * s["lower_bound_bytes"]
    _check_dynamic_tensors(data)  # tensors live at the peak: a group's bytes count once
    first, last = data["shapes"]
    assert (f"in-place: {data['inplace_calls']} calls write over an input that dies there; "
            f"lower bound without -> with in-place: "
            f"batch=1, seq=1: {first['lower_bound_without_inplace_bytes']:,} -> "
            f"{first['lower_bound_bytes']:,} B; batch=1, seq=128: "
            f"{last['lower_bound_without_inplace_bytes']:,} -> {last['lower_bound_bytes']:,} B"
            in text)
    for k in range(len(data["shapes"])):  # a sharing tensor sits at its group's offset
        offsets = {t["name"]: t["offset_bytes_at_shapes"][k] for t in data["tensors"]}
        assert all(offsets[t["name"]] == offsets[t["shares_storage_with"]] for t in sharing)


def test_buckets_strategy_shares_in_the_bucket_piece_and_elsewhere():
    """``buckets`` plans a piece at n=16 and the generic piece: the group is one buffer in both,
    numerics right at the bucket value and off it."""
    dyn = PlanDynamicMemory(strategy="buckets", buckets={"n": [16]}, time_limit_s=0.1,
                            inplace=True)
    ex = tvm.compile(Residual, "llvm", relax_pipeline=get_pipeline(
        "llvm", dynamic_pass=dyn, dim_ranges={"n": (1, 64)}))
    fplan = dyn.plans["main"]
    assert [p.kind for p in fplan.pieces] == ["bucket", "generic"] and len(fplan.inplace) == 1
    for n in (16, 40):
        rng = np.random.default_rng(n)
        x = rng.uniform(-1, 1, (n, 8)).astype("float32")
        y, w = rng.uniform(-1, 1, (2, 8, 8)).astype("float32")
        got = run_and_measure(ex, [x, y, w])
        b = x @ w
        np.testing.assert_allclose(got.outputs[0], (b @ y + x @ y) @ y + b, rtol=1e-4, atol=1e-5)
        arena, lower_bound, _ = fplan.bytes_at({"n": n})
        assert got.alloc_sizes_bytes[0] == arena == lower_bound
        assert lower_bound < fplan.lower_bound_without_inplace_at({"n": n})
