"""Checks run in a subprocess by test_cpu_conv_blocked.py (an out-of-bounds store then fails a
test instead of killing pytest): convolutions scheduled by ChannelBlockedConv (and depthwise
ones by ChannelBlockedDepthwise) give the numbers
of the unscheduled build, with the weights as parameters (copied to the blocked layout per
call) and as constants (prepacked at compile time)."""

import numpy as np
import tvm
from tvm import relax, tirx
from tvm.ir.instrument import pass_instrument

from relax_memplan.schedules import (SCHEDULE_RULE_ATTR, ChannelBlockedConv,
                                    ChannelBlockedDepthwise, host_target)

from tests.schedules.conv_checks import conv_module
from tests.schedules.isolated_checks import build_and_run

# (label, in shape, filters, kernel, stride, padding, dilation, groups, epilogue): each taken
# by ChannelBlockedConv (test_cpu_conv_blocked.py asserts it)
CASES = [
    ("3x3 s1 p1 14x14 relu", (1, 32, 14, 14), 32, 3, 1, 1, 1, 1, "relu"),
    ("3x3 s2 p1 10x10 out silu", (1, 16, 20, 20), 32, 3, 2, 1, 1, 1, "silu"),
    ("1x1 s2 7x7 out bias", (1, 64, 14, 14), 32, 1, 2, 0, 1, 1, "bias"),
    ("1x1 s1 7x7 48 channels clip", (1, 96, 7, 7), 48, 1, 1, 0, 1, 1, "clip"),
    ("7x7 s2 p3 stem 16x16 out", (1, 3, 32, 32), 64, 7, 2, 3, 1, 1, "relu"),
    ("3x3 dilated 2 batch 2", (2, 16, 12, 12), 16, 3, 1, 2, 2, 1, "relu"),
    ("conv1d k3 8 outputs", (1, 64, 10), 32, 3, 1, 0, 1, 1, "bias"),
    ("conv1d as conv2d over (length, 1)", (1, 16, 70, 1), 32, (5, 1), 1, 0, 1, 1, "relu"),
]


# the CASES ChannelBlockedConv leaves on an AVX2 target (8 lanes, 16 registers): maps of 7
# or 8 columns fill too little of its column tile; on AVX-512 it takes every case
AVX2_DECLINED = frozenset({"1x1 s2 7x7 out bias", "1x1 s1 7x7 48 channels clip",
                           "conv1d k3 8 outputs"})


def taken_on(target, label: str) -> bool:
    """Whether the rule takes case ``label`` on ``target`` (the host decides which run)."""
    from relax_memplan.schedules import simd_lanes

    return not (simd_lanes(target) == 8 and label in AVX2_DECLINED)


# depthwise convolutions ChannelBlockedDepthwise takes
DW_CASES = [
    ("dw 7x7 14x14 relu", (1, 32, 14, 14), 32, 7, 1, 3, 1, 32, "relu"),
    ("dw 5x5 s2 13x13 silu", (1, 16, 13, 13), 16, 5, 2, 2, 1, 16, "silu"),
    ("dw 3x3 7x7 batch 2 clip", (2, 48, 7, 7), 48, 3, 1, 1, 1, 48, "clip"),
    ("dw 7x7 20x9 map bias", (1, 16, 20, 9), 16, 7, 1, 3, 1, 16, "bias"),
]


def _fused(mod):
    seq = tvm.transform.Sequential([
        relax.transform.LegalizeOps(), relax.transform.AnnotateTIROpPattern(),
        relax.transform.FuseOps(), relax.transform.FuseTIR()])
    return [f for _, f in seq(mod).functions_items() if isinstance(f, tirx.PrimFunc)]


def check_rule_on_parameters():
    """The rules applied to the fused PrimFunc, weights as parameters (per-call layout copy)."""
    target = host_target()
    rng = np.random.default_rng(0)
    for label, *case in CASES + DW_CASES:
        (func,) = _fused(conv_module(*case))
        rule = ChannelBlockedDepthwise if case[-2] > 1 else ChannelBlockedConv
        sch = rule(min_parallel_macs=0).apply(func, target, False)
        assert (sch is not None) == taken_on(target, label), label
        if sch is None:
            continue
        arrays = [rng.standard_normal([int(d) for d in p.shape], dtype="float32")
                  for p in func.params]  # the params are the buffers in TVM 0.27
        outs = []
        for f in (func, sch.mod["main"]):
            lib = tvm.compile(tvm.IRModule({"main": f.with_attr("global_symbol", "main")}),
                              target=target)
            args = [tvm.runtime.tensor(a) for a in arrays]
            args[-1] = tvm.runtime.tensor(np.full_like(arrays[-1], np.nan))
            lib["main"](*args)
            outs.append(args[-1].numpy())
        np.testing.assert_allclose(outs[1], outs[0], rtol=1e-4, atol=1e-4, err_msg=label)
    print("BLOCKED PARAMS OK")


def constant_weight_module(case, seed=0):
    """``conv_module(*case)`` with its weight and bias bound to constants."""
    mod = conv_module(*case)
    rng = np.random.default_rng(seed)
    params = mod["main"].params
    binds = {p.name: rng.standard_normal([int(d) for d in p.ty.shape]).astype("float32")
             for p in params[1:3]}
    return relax.transform.BindParams("main", binds)(mod)


@pass_instrument
class _ScheduledKernels:
    """Records the names of the PrimFuncs after ``SplitPrepackedWeights`` and the rule
    ``CPUSchedule`` gave each."""

    def __init__(self):
        self.rules, self.names = {}, []

    def run_after_pass(self, mod, info):
        funcs = [(gv.name_hint, f) for gv, f in mod.functions_items()
                 if isinstance(f, tirx.PrimFunc)]
        if info.name == "CPUSchedule":
            self.rules.update({n: str(f.attrs[SCHEDULE_RULE_ATTR]) for n, f in funcs
                               if f.attrs is not None and SCHEDULE_RULE_ATTR in f.attrs})
        elif info.name == "SplitPrepackedWeights":
            self.names = [n for n, _f in funcs]


def check_pipeline_with_constant_weights():
    """Through ``get_pipeline(schedule=True)``: ChannelBlockedConv takes the kernel, its
    weight is prepacked at compile time (the kernel is replaced by its ``_prepacked`` split),
    and the result equals the unscheduled build's."""
    target = host_target()
    rng = np.random.default_rng(1)
    for label, *case in CASES + DW_CASES:
        if not taken_on(target, label):
            continue  # what the rule declines there: check_rule_on_parameters asserts it
        mod = constant_weight_module(case)
        arrays = [rng.standard_normal([int(d) for d in p.ty.shape], dtype="float32")
                  for p in mod["main"].params]
        want = build_and_run(mod, target, False, arrays)
        for _ in range(2):  # repeated: heap damage often shows on a later allocation
            seen = _ScheduledKernels()
            with tvm.transform.PassContext(instruments=[seen]):
                got = build_and_run(mod, target, True, arrays)
            np.testing.assert_allclose(got, want, rtol=1e-4, atol=1e-4, err_msg=label)
            rule = "ChannelBlockedDepthwise" if case[-2] > 1 else "ChannelBlockedConv"
            conv = [n for n, r in seen.rules.items() if r == rule]
            assert conv, (label, seen.rules)
            assert any(n.startswith(conv[0]) and n.endswith("_prepacked")
                       for n in seen.names), (label, seen.names)
    print("BLOCKED PIPELINE OK")
