"""FastBoundedMath: tanh / sigmoid / erf / softmax become TVM's fast approximations; exp stays
exact; NaN and infinities behave as the exact functions."""

import math
import re

import numpy as np
import pytest
import tvm
from tvm import relax, s_tir, te, tirx, topi

from relax_memplan.pipeline import backend_phases, get_pipeline
from relax_memplan.schedules import host_target
from relax_memplan.transform import FastBoundedMath
from relax_memplan.transform.fast_bounded_math import fast_sigmoid

fast_tanh = topi.fast_tanh

ATOL = 2e-6
"""Largest difference allowed from the exact function in a whole build (float32 rounding level)."""
KERNEL_ATOL = 5e-7
"""Largest absolute error of the sigmoid / tanh kernels against float64 (measured 1.2e-7 for
sigmoid, 2.3e-7 for tanh on znver4, over [-100, 100] and near 0)."""
TANH_REL_TOL = 5e-7
"""Largest relative error of tanh near 0 (measured 2.3e-7 on [1e-4, 1e-3])."""


def _module(dtype="float32"):
    x = relax.Var("x", relax.TensorType([4, 64], dtype))
    bb = relax.BlockBuilder()
    with bb.function("main", [x]):
        with bb.dataflow():
            outs = [bb.emit(op(x)) for op in (relax.op.tanh, relax.op.erf, relax.op.nn.softmax,
                                               relax.op.exp, relax.op.sigmoid)]
            out = bb.emit_output(relax.Tuple(outs))
        bb.emit_func_output(out)
    return bb.get()


def _ops(mod):
    found = []
    relax.analysis.post_order_visit(mod["main"].body, lambda e: found.append(e.op.name) if (
        isinstance(e, relax.Call) and isinstance(e.op, tvm.ir.Op)) else None)
    return found


def test_bounded_functions_rewritten_exp_kept_kernels_named():
    pass_ = FastBoundedMath()
    mod = pass_(_module())
    ops = _ops(mod)
    assert pass_.rewritten == 4
    for gone in ("relax.tanh", "relax.erf", "relax.nn.softmax", "relax.sigmoid"):
        assert gone not in ops
    assert "relax.exp" in ops
    names = sorted(gv.name_hint for gv, f in mod.functions_items() if isinstance(f, tirx.PrimFunc))
    # sigmoid keeps TVM's kernel name, so fused kernels are named as in TVM's build
    assert names == ["fast_erf", "fast_softmax", "fast_tanh", "tir_sigmoid"]


def test_other_dtypes_are_left_to_tvm():
    pass_ = FastBoundedMath()
    mod = pass_(_module("float16"))
    assert pass_.rewritten == 0 and "relax.sigmoid" in _ops(mod) and "relax.tanh" in _ops(mod)


def _symbolic_module(dim):
    x = relax.Var("x", relax.TensorType([dim, 64], "float32"))
    bb = relax.BlockBuilder()
    with bb.function("main", [x]):
        with bb.dataflow():
            out = bb.emit_output(relax.op.tanh(x))
        bb.emit_func_output(out)
    return bb.get()


def test_symbolic_var_dims_rewritten_dim_expressions_left_to_tvm():
    """A dim spelled as an expression (after a slice: ``min(2147483647, n) - ...``) keeps TVM's
    op: call_te would simplify it in the new kernel and FuseTIR then refuses the fused function
    (magika at a symbolic batch failed to build)."""
    n = tirx.Var("n", "int64")
    plain, compound = FastBoundedMath(), FastBoundedMath()
    plain(_symbolic_module(n))
    mod = compound(_symbolic_module(tirx.min(tirx.IntImm("int64", 1000), n) - tirx.min(
        tirx.IntImm("int64", 0), n)))
    assert plain.rewritten == 1
    assert compound.rewritten == 0 and "relax.tanh" in _ops(mod)


def _reference(x):
    x64 = x.astype("float64")
    e = np.exp(x64 - x64.max(-1, keepdims=True))
    with np.errstate(over="ignore"):
        return [np.tanh(x64), np.vectorize(math.erf)(x64), e / e.sum(-1, keepdims=True),
                np.exp(x64), 1 / (1 + np.exp(-x64))]


def test_scheduled_build_matches_exact_functions_nan_and_infinities():
    target = host_target()
    ex = tvm.compile(_module(), target, relax_pipeline=get_pipeline(target, schedule=True))
    vm = relax.VirtualMachine(ex, tvm.cpu())
    x = np.linspace(-12, 12, 256, dtype="float32").reshape(4, 64)
    x[3, -1] = 100.0  # exp(100) overflows float32: inf, as the exact legalization gives
    outs = [o.numpy() for o in vm["main"](tvm.runtime.tensor(x))]
    for name, got, want in zip(("tanh", "erf", "softmax", "exp", "sigmoid"), outs, _reference(x)):
        if name == "exp":
            assert np.isinf(got[3, -1])
            finite = np.isfinite(got)
            np.testing.assert_allclose(got[finite], want[finite], rtol=1e-6)
        else:
            np.testing.assert_allclose(got, want, rtol=0, atol=ATOL, err_msg=name)
    special = np.zeros((4, 64), "float32")
    special[0, :3] = [np.nan, np.inf, -np.inf]
    tanh, _erf, _softmax, _exp, sigmoid = [o.numpy() for o in vm["main"](
        tvm.runtime.tensor(special))]  # NaN: fast_tanh's clamp is selects that pass NaN on
    assert np.isnan(tanh[0, 0]) and np.isnan(sigmoid[0, 0])
    np.testing.assert_array_equal(tanh[0, 1:3], [1.0, -1.0])
    np.testing.assert_array_equal(sigmoid[0, 1:3], [1.0, 0.0])


def _kernel(te_fn, n=1 << 16):
    """A vectorised element-wise kernel of ``te_fn`` over ``n`` float32 values (intermediate
    stages inlined, as FuseTIR and our schedules do)."""
    a = te.placeholder((n,), "float32", name="a")
    sch = s_tir.Schedule(te.create_prim_func([a, te_fn(a)]))
    *inner, last = sch.get_child_blocks(sch.get_sblock("root"))
    for block in inner:
        sch.compute_inline(block)
    (loop,) = sch.get_loops(last)
    sch.vectorize(sch.split(loop, factors=[None, 16])[1])
    return tvm.compile(sch.mod, target=host_target())


def _inputs():
    rng = np.random.default_rng(0)
    return np.concatenate([rng.uniform(-100, 100, 1 << 14), rng.uniform(-4, 4, 1 << 14),
                           np.linspace(-0.3, 0.3, (1 << 15) - 16),
                           [0.0, -0.0, 1e-30, -1e-30, 9.0, -9.0, 17.0, -17.0, 88.0, -88.0,
                            89.0, -89.0, 1e4, -1e4, 1e-3, -1e-3]]).astype("float32")


def _max_abs_error(te_fn, exact) -> float:
    x = _inputs()
    out = tvm.runtime.tensor(np.zeros_like(x))
    _kernel(te_fn, x.size)(tvm.runtime.tensor(x), out)
    with np.errstate(over="ignore"):
        want = exact(x.astype("float64"))
    return float(np.max(np.abs(out.numpy().astype("float64") - want)))


def _sigmoid64(x):
    return 1 / (1 + np.exp(-x))


def _tanh_rel_error_near_0(te_fn) -> float:
    x = np.linspace(1e-4, 1e-3, 4096, dtype="float32")
    out = tvm.runtime.tensor(np.zeros_like(x))
    _kernel(te_fn, x.size)(tvm.runtime.tensor(x), out)
    return float(np.max(np.abs(out.numpy().astype("float64") - np.tanh(x.astype("float64")))
                        / x))


def test_sigmoid_and_tanh_kernels_within_tolerance_of_float64():
    assert _max_abs_error(fast_sigmoid, _sigmoid64) < KERNEL_ATOL
    assert _max_abs_error(fast_tanh, np.tanh) < KERNEL_ATOL
    assert _tanh_rel_error_near_0(fast_tanh) < TANH_REL_TOL


def test_tolerance_rejects_a_wrong_approximation():
    """The tolerances can fail: tanh by its Taylor polynomial to degree 3 (clamped to [-1, 1]),
    sigmoid without halving the argument of tanh, and tanh as (1 - e) / (1 + e), e = exp(-2x),
    which cancels near 0 (relative error)."""
    def taylor_tanh(x):
        return te.compute(x.shape, lambda i: tirx.max(tirx.min(
            x[i] - x[i] * x[i] * x[i] / 3, tirx.const(1.0, "float32")), tirx.const(-1.0, "float32")))

    def unhalved_sigmoid(x):
        t = topi.fast_tanh(x)
        return te.compute(x.shape, lambda i: 0.5 + 0.5 * t[i])

    assert _max_abs_error(taylor_tanh, np.tanh) > KERNEL_ATOL
    assert _max_abs_error(unhalved_sigmoid, _sigmoid64) > KERNEL_ATOL
    cancelling = lambda x: te.compute(x.shape, lambda i: (1 - tirx.exp(-2 * x[i]))  # noqa: E731
                                      / (1 + tirx.exp(-2 * x[i])))
    assert _tanh_rel_error_near_0(cancelling) > TANH_REL_TOL


def _asm(lib):
    return "".join(m.inspect_source("asm") for m in [lib.mod] + list(lib.mod.imports)
                   if m.kind == "llvm")


@pytest.mark.parametrize("te_fn, exact_fn", [(fast_sigmoid, topi.sigmoid),
                                             (fast_tanh, topi.tanh)])
def test_kernels_call_no_libm_exp(te_fn, exact_fn):
    """The point of the pass: no ``expf`` call left in the vectorised kernel (TVM's exact
    legalization has one per lane: the check can fail)."""
    assert not re.search(r"call\w*\s+\S*expf", _asm(_kernel(te_fn, 64)))
    assert re.search(r"call\w*\s+\S*expf", _asm(_kernel(exact_fn, 64)))


def test_pipeline_runs_it_after_fusion_before_legalize_only_with_cpu_schedules():
    def names(**kwargs):
        return [p.info.name for p in dict(backend_phases(host_target(), **kwargs))["legalize"]]

    scheduled = names(schedule=True)
    assert scheduled.index("FuseAttention") < scheduled.index("FastBoundedMath") \
        < scheduled.index("LegalizeOps")
    assert "FastBoundedMath" not in names(schedule=False)
    assert "FastBoundedMath" not in [p.info.name for p in dict(backend_phases(
        tvm.target.Target({"kind": "cuda", "arch": "sm_80"}), schedule=True))["legalize"]]
