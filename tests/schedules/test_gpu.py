"""GPU schedule rules made robust (a failing dlight rule falls through), and host_target."""

import pytest
import tvm
from tvm.s_tir import dlight
from tvm.script import tirx as T

from relax_memplan.pipeline import backend_phases
from relax_memplan.schedules import (
    GuardedRule,
    gpu_schedule_rules,
    host_target,
    schedule_gpu_prim_func,
)
from relax_memplan.transform.specialize_kernels import backend_schedule

CUDA = tvm.target.Target({"kind": "cuda", "arch": "sm_80"})


@T.prim_func(s_tir=True)
def _add_one(a: T.Buffer((64,), "float32"), b: T.Buffer((64,), "float32")):
    for i in range(64):
        with T.sblock("b"):
            vi = T.axis.remap("S", [i])
            b[vi] = a[vi] + T.float32(1)


class _Exploding(dlight.ScheduleRule):
    def apply(self, func, target, tunable):
        raise AssertionError  # like dlight's GEMV on a length-1 reduction: a bare AssertionError


def test_guarded_rule_failure_means_not_applicable_and_is_recorded():
    rule = GuardedRule(_Exploding())
    assert rule.apply(_add_one, CUDA, False) is None
    assert rule.failures == ["_Exploding: AssertionError: "]
    with CUDA:
        mod = dlight.ApplyDefaultSchedule(rule, dlight.gpu.Fallback())(
            tvm.IRModule({"main": _add_one}))
    assert "threadIdx.x" in mod["main"].script()


class _BuggyOwnCode(dlight.ScheduleRule):
    def apply(self, func, target, tunable):
        from relax_memplan.schedules.codegen_guard import _extent

        return _extent(object())  # an AttributeError raised inside our package (no .extent)


class _AttributeErrorElsewhere(dlight.ScheduleRule):
    def apply(self, func, target, tunable):
        raise AttributeError("raised outside relax_memplan, as dlight's rules may")


def test_guarded_rule_reraises_a_bug_in_our_own_code_but_not_elsewhere():
    with pytest.raises(AttributeError):
        GuardedRule(_BuggyOwnCode()).apply(_add_one, CUDA, False)
    rule = GuardedRule(_AttributeErrorElsewhere())
    assert rule.apply(_add_one, CUDA, False) is None
    assert rule.failures == ["_AttributeErrorElsewhere: AttributeError: raised outside "
                             "relax_memplan, as dlight's rules may"]


def test_gpu_rules_are_tvms_order_with_fallback_unguarded():
    rules = gpu_schedule_rules()
    assert [type(r.rule).__name__ for r in rules[:-1]] == [
        "Matmul", "GEMV", "Reduction", "GeneralReduction"]
    assert isinstance(rules[-1], dlight.gpu.Fallback)
    scheduled = schedule_gpu_prim_func(_add_one, CUDA)
    assert bool(scheduled.attrs["tirx.is_scheduled"]) and "threadIdx.x" in scheduled.script()
    # SpecializeKernels schedules its CUDA versions with the same rules
    assert "threadIdx.x" in backend_schedule(CUDA)(_add_one, CUDA).script()


def test_cuda_pipeline_uses_the_guarded_rules_in_place_of_tvms_pass():
    legalize = dict(backend_phases(CUDA))["legalize"]
    names = [p.info.name for p in legalize]
    assert names.count("ApplyDefaultSchedule") == 1
    assert names.index("ApplyDefaultSchedule") == names.index("FuseTIR") + 1
    with CUDA:
        mod = legalize[names.index("ApplyDefaultSchedule")](tvm.IRModule({"main": _add_one}))
    assert "threadIdx.x" in mod["main"].script()


def test_host_target_names_the_host_cpu():
    target = host_target()
    assert target.kind.name == "llvm"
    cpu = tvm.target.codegen.llvm_get_system_cpu()
    if cpu and cpu != "generic":
        assert str(target.attrs["mcpu"]) == cpu
        # the CPU features LLVM sees are those of the host, not of x86-64 generic
        generic = len(tvm.target.codegen.llvm_get_cpu_features(tvm.target.Target("llvm")))
        assert len(tvm.target.codegen.llvm_get_cpu_features(target)) >= generic
    else:
        assert "mcpu" not in target.attrs
