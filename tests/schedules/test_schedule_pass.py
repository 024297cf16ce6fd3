"""cpu_schedule_pass: each kernel gets the first rule that applies, and the rule's name is
recorded on the function (``relax_memplan.schedule_rule``) for profiles."""

import tvm
from tvm import te
from tvm.s_tir import dlight

from relax_memplan.schedules import (
    IS_SCHEDULED_ATTR,
    SCHEDULE_RULE_ATTR,
    CodegenGuard,
    DotProductGEMV,
    GuardedRule,
    SpatialFallback,
    cpu_schedule_pass,
    rule_name,
)

TARGET = tvm.target.Target("llvm")


def _matmul(n):
    a, b = te.placeholder((n, n), name="a"), te.placeholder((n, n), name="b")
    k = te.reduce_axis((0, n), name="k")
    return te.create_prim_func([a, b, te.compute((n, n), lambda i, j: te.sum(a[i, k] * b[k, j],
                                                                                axis=k))])


def _elementwise(shape):
    a = te.placeholder(shape, name="a")
    return te.create_prim_func([a, te.compute(shape, lambda *i: a(*i) * 2.0)])


def test_each_kernel_records_the_rule_that_scheduled_it():
    mod = tvm.IRModule({"mm": _matmul(64), "ew": _elementwise((256, 256)),
                        "tiny": _elementwise((3,))})
    out = cpu_schedule_pass(TARGET)(mod)
    assert str(out["mm"].attrs[SCHEDULE_RULE_ATTR]) == "StaticMatmul"
    assert str(out["ew"].attrs[SCHEDULE_RULE_ATTR]) == "SpatialFallback"
    assert out["mm"].attrs[IS_SCHEDULED_ATTR] and out["ew"].attrs[IS_SCHEDULED_ATTR]
    # 3 elements, no vector width divides it: no rule applies, the function is unchanged
    assert out["tiny"].same_as(mod["tiny"])


def test_scheduled_kernel_is_not_rescheduled():
    func = _elementwise((256, 256)).with_attr(IS_SCHEDULED_ATTR, True)
    out = cpu_schedule_pass(TARGET)(tvm.IRModule({"ew": func}))
    assert out["ew"].same_as(func)
    assert SCHEDULE_RULE_ATTR not in out["ew"].attrs


def test_rule_name_unwraps_guards():
    guarded = GuardedRule(CodegenGuard(DotProductGEMV(dlight.cpu.GEMV())))
    assert rule_name(guarded) == "DotProductGEMV"
    assert rule_name(GuardedRule(SpatialFallback())) == "SpatialFallback"
    assert rule_name(SpatialFallback()) == "SpatialFallback"
