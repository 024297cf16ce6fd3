"""cpu_schedule_pass: each kernel gets the first rule that applies, and the rule's name is
recorded on the function (``relax_memplan.schedule_rule``) for profiles."""

import tvm
from tvm import te
from tvm.s_tir import dlight

from relax_memplan.schedules import (
    IS_SCHEDULED_ATTR,
    REDUCTION_RULES,
    SCHEDULE_RULE_ATTR,
    CodegenGuard,
    DotProductGEMV,
    GuardedRule,
    SpatialFallback,
    cpu_schedule_pass,
    cpu_schedule_rules,
    rule_name,
)
from relax_memplan.schedules import _apply_first, _has_reduction

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


def _sum_rows(n):
    a = te.placeholder((n, n), name="a")
    k = te.reduce_axis((0, n), name="k")
    return te.create_prim_func([a, te.compute((n,), lambda i: te.sum(a[i, k], axis=k))])


def _spatial_kernels():
    a, b = te.placeholder((64, 128), name="a"), te.placeholder((128,), name="b")
    transpose = te.create_prim_func([a, te.compute((128, 64), lambda i, j: a[j, i])])
    bias_relu = te.create_prim_func([a, b, te.compute(
        (64, 128), lambda i, j: te.max(a[i, j] + b[j], tvm.tirx.const(0.0, "float32")))])
    return [_elementwise((256, 256)), _elementwise((1, 64)), transpose, bias_relu]


def test_has_reduction_finds_reduction_blocks_only():
    assert _has_reduction(_matmul(16)) and _has_reduction(_sum_rows(16))
    assert not any(_has_reduction(f) for f in _spatial_kernels())


def test_rules_skipped_on_spatial_kernels_decline_them():
    """The schedule pass does not try REDUCTION_RULES on a kernel without a reduction block:
    each of them must return None on one, or the skip would change a schedule."""
    rules = [r for r in cpu_schedule_rules() if rule_name(r) in REDUCTION_RULES]
    assert {rule_name(r) for r in rules} == set(REDUCTION_RULES)  # no stale name
    with TARGET:
        for func in _spatial_kernels():
            assert all(r.apply(func, TARGET, False) is None for r in rules)
        # a reduction kernel is taken by one of them: the skip is not vacuous
        assert any(r.apply(_matmul(64), TARGET, False) is not None for r in rules)


def test_skipping_reduction_rules_gives_the_same_schedules():
    funcs = {f"k{i}": f for i, f in enumerate(_spatial_kernels() + [_sum_rows(256)])}
    out = cpu_schedule_pass(TARGET)(tvm.IRModule(funcs))
    with TARGET:
        for name, func in funcs.items():
            every_rule = _apply_first(cpu_schedule_rules(), func, TARGET)
            tvm.ir.assert_structural_equal(out[name], func if every_rule is None else every_rule)
