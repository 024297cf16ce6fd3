"""FastBoundedMath: tanh / erf / softmax become TVM's fast approximations; exp stays exact."""

import math

import numpy as np
import pytest
import tvm
from tvm import relax

from relax_memplan.pipeline import backend_phases, get_pipeline
from relax_memplan.schedules import host_target
from relax_memplan.transform import FastBoundedMath

ATOL = 2e-6
"""Largest difference allowed from the exact function (float32 rounding level)."""


def _module():
    x = relax.Var("x", relax.TensorType([4, 64], "float32"))
    bb = relax.BlockBuilder()
    with bb.function("main", [x]):
        with bb.dataflow():
            outs = [bb.emit(op(x)) for op in (relax.op.tanh, relax.op.erf, relax.op.nn.softmax,
                                               relax.op.exp)]
            out = bb.emit_output(relax.Tuple(outs))
        bb.emit_func_output(out)
    return bb.get()


def _ops(mod):
    return [c.op.name for c in _calls(mod["main"].body)]


def _calls(expr):
    found = []
    relax.analysis.post_order_visit(expr, lambda e: found.append(e) if isinstance(
        e, relax.Call) and isinstance(e.op, tvm.ir.Op) else None)
    return found


def test_bounded_functions_rewritten_exp_kept():
    pass_ = FastBoundedMath()
    ops = _ops(pass_(_module()))
    assert pass_.rewritten == 3
    for gone in ("relax.tanh", "relax.erf", "relax.nn.softmax"):
        assert gone not in ops
    assert "relax.exp" in ops


def _reference(x):
    e = np.exp(x - x.max(-1, keepdims=True))
    erf = np.vectorize(math.erf)(x.astype("float64"))
    return [np.tanh(x), erf, e / e.sum(-1, keepdims=True), np.exp(x.astype("float64"))]


def test_scheduled_build_matches_exact_functions_and_exp_overflows_to_inf():
    target = host_target()
    ex = tvm.compile(_module(), target, relax_pipeline=get_pipeline(target, schedule=True))
    vm = relax.VirtualMachine(ex, tvm.cpu())
    x = np.linspace(-12, 12, 256, dtype="float32").reshape(4, 64)
    x[3, -1] = 100.0  # exp(100) overflows float32: inf, as the exact legalization gives
    outs = [o.numpy() for o in vm["main"](tvm.runtime.tensor(x))]
    for name, got, want in zip(("tanh", "erf", "softmax"), outs, _reference(x)):
        np.testing.assert_allclose(got, want, rtol=0, atol=ATOL, err_msg=name)
    assert np.isinf(outs[3][3, -1])
    finite = np.isfinite(outs[3])
    np.testing.assert_allclose(outs[3][finite], _reference(x)[3][finite], rtol=1e-6)


def test_tolerance_catches_an_approximation_off_by_1e_5():
    x = np.linspace(-3, 3, 64, dtype="float32")
    with pytest.raises(AssertionError):
        np.testing.assert_allclose(np.tanh(x) + 1e-5, np.tanh(x), rtol=0, atol=ATOL)


def test_pipeline_runs_it_after_fusion_before_legalize_only_with_cpu_schedules():
    def names(**kwargs):
        return [p.info.name for p in dict(backend_phases(host_target(), **kwargs))["legalize"]]

    scheduled = names(schedule=True)
    assert scheduled.index("FuseAttention") < scheduled.index("FastBoundedMath") \
        < scheduled.index("LegalizeOps")
    assert "FastBoundedMath" not in names(schedule=False)
    assert "FastBoundedMath" not in [p.info.name for p in dict(backend_phases(
        tvm.target.Target({"kind": "cuda", "arch": "sm_80"}), schedule=True))["legalize"]]
