"""CPU (llvm) schedules for matmul-like kernels, applied after FuseTIR.

TVM 0.27 has no CPU matmul schedule: a legalized matmul is a plain triple loop.
This subpackage provides dlight rules (:class:`StaticMatmul`,
:class:`GenericMatmul`), the pass that applies them with dlight's CPU GEMV
and Reduction rules (:func:`cpu_schedule_pass`, appended to the ``legalize``
phase by ``get_pipeline(..., schedule=True)``), and
:func:`schedule_prim_func` to schedule one PrimFunc, e.g. a copy specialised
to a shape bucket.

For CUDA, :mod:`relax_memplan.schedules.gpu` has dlight's GPU rules made robust
(:func:`gpu_schedule_pass`, used by the pipeline in place of TVM's), and
:func:`host_target` gives an llvm target for the CPU this process runs on.
"""

from __future__ import annotations

from typing import Union

import tvm
from tvm import s_tir, tirx
from tvm.s_tir import dlight
from tvm.target import Target

from .concat_kernel import CONCAT_AXIS_ATTR, concat_axis
from . import _rule_gates
from ._rule_gates import kernel_blocks, may_apply
from .codegen_guard import CodegenGuard, vector_codegen_risk
from .cpu_conv import DirectConv
from .cpu_conv_blocked import ChannelBlockedConv
from .cpu_conv_depthwise import ChannelBlockedDepthwise
from .cpu_fallback import SpatialFallback
from .cpu_gemv import DotProductGEMV
from .cpu_reduction import RowReduction, VectorPlaneSum, VectorRowReduction
from .cpu_matmul import GenericMatmul, StaticMatmul, TileConfig, simd_lanes
from .host import NO_GATHER_FEATURES, host_target
from .gpu import GuardedRule, gpu_schedule_pass, gpu_schedule_rules, schedule_gpu_prim_func

__all__ = [
    "IS_SCHEDULED_ATTR",
    "REDUCTION_RULES",
    "NO_GATHER_FEATURES",
    "SCHEDULE_RULE_ATTR",
    "ChannelBlockedConv",
    "ChannelBlockedDepthwise",
    "CodegenGuard",
    "DirectConv",
    "DotProductGEMV",
    "GenericMatmul",
    "GuardedRule",
    "RowReduction",
    "SpatialFallback",
    "StaticMatmul",
    "TileConfig",
    "VectorPlaneSum",
    "VectorRowReduction",
    "cpu_schedule_rules",
    "cpu_schedule_pass",
    "gpu_schedule_rules",
    "gpu_schedule_pass",
    "host_target",
    "rule_name",
    "schedule_prim_func",
    "schedule_gpu_prim_func",
    "simd_lanes",
    "vector_codegen_risk",
]

IS_SCHEDULED_ATTR = "tirx.is_scheduled"
"""The function attribute dlight's ``ApplyDefaultSchedule`` sets and skips on."""

SCHEDULE_RULE_ATTR = "relax_memplan.schedule_rule"
"""The function attribute :func:`cpu_schedule_pass` writes: the name of the rule that
scheduled the kernel (:func:`rule_name`), for profiles and tests."""


def _as_target(target: Union[str, dict, Target]) -> Target:
    return target if isinstance(target, Target) else Target(target)


def cpu_schedule_rules() -> list:
    """The rules, most specific first: convolutions (:class:`ChannelBlockedConv`, output
    channels in the lanes, where the map is too narrow for full column vectors or the
    reduction long; :class:`ChannelBlockedDepthwise`, depthwise ones with large kernels,
    strides or narrow maps; :class:`DirectConv`, output columns in the lanes, which declines
    1x1 convolutions on small maps, :attr:`DirectConv.min_direct_1x1_pixels`), matmul, GEMV,
    reduction, then the fallback.

    dlight's CPU ``GEMV`` and ``Reduction`` (softmax, layer norm) follow ours,
    guarded (:class:`GuardedRule`): any failure inside them, e.g. GEMV's assertion on a
    reduction of length 1 (bert at seq 1), leaves the function unscheduled. GEMV is
    only tried on plain dot products (:class:`DotProductGEMV`): on a convolution with a
    one-pixel output it produces vector code LLVM needs minutes to compile, and its
    result is dropped by :class:`CodegenGuard` when it vectorises a loop wider than 64
    lanes or one that encloses the reduction loop (per-lane gathers: the VAD model's
    ``[seq, 1, 64] @ [64, 1]`` head did not compile in 15 min for an AVX-512 host).
    Softmax / layer norm / RMS norm over the last axis get :class:`VectorRowReduction`
    (vectorized partial sums), sums / means over trailing axes :class:`VectorPlaneSum` (a
    vector accumulator as wide as the innermost one); where neither applies, dlight's ``Reduction`` is kept
    only when its parallel loop runs over the rows (:class:`RowReduction`: with one row
    it recomputes the row per output).
    :class:`SpatialFallback` (guarded too) comes last: parallel outer loops and short
    vectors for element-wise, layout and pooling kernels with enough work.

    Returns
    -------
    list of tvm.s_tir.dlight.ScheduleRule
    """
    return [ChannelBlockedConv(), ChannelBlockedDepthwise(), DirectConv(), StaticMatmul(),
            GenericMatmul(),
            GuardedRule(CodegenGuard(DotProductGEMV(dlight.cpu.GEMV()))),
            GuardedRule(VectorRowReduction()), GuardedRule(VectorPlaneSum()),
            GuardedRule(RowReduction(dlight.cpu.Reduction())),
            GuardedRule(SpatialFallback())]


def cpu_schedule_pass(target: Union[str, dict, Target]) -> tvm.transform.Pass:
    """The module pass scheduling every unscheduled PrimFunc for an llvm target.

    Runs after ``FuseTIR`` (end of the ``legalize`` phase). Each PrimFunc not marked
    ``tirx.is_scheduled`` gets the first of :func:`cpu_schedule_rules` that applies (as dlight's
    ``ApplyDefaultSchedule`` does): a PrimFunc whose matmul extents are all constant gets
    :class:`StaticMatmul`, one with symbolic extents :class:`GenericMatmul`, convolutions
    :class:`DirectConv`, GEMV and reductions dlight's CPU rules, element-wise, layout and
    pooling kernels :class:`SpatialFallback`; anything else is left as is. Scheduled
    functions get ``tirx.is_scheduled = True`` and ``relax_memplan.schedule_rule = <rule>``
    (:data:`SCHEDULE_RULE_ATTR`).

    Parameters
    ----------
    target : str, dict or tvm.target.Target
        An llvm target; the SIMD width comes from its ``mcpu``/``mattr``.

    Returns
    -------
    tvm.transform.Pass
        The module pass ``CPUSchedule``, run under ``target``.
    """
    tgt = _as_target(target)
    rules = [(rule, rule_name(rule), _unwrap(rule)) for rule in cpu_schedule_rules()]

    @tvm.transform.module_pass(opt_level=0, name="CPUSchedule")
    def _pass(mod: tvm.IRModule, ctx) -> tvm.IRModule:
        updated = {}
        with tgt:
            for gvar, func in mod.functions_items():
                if isinstance(func, tirx.PrimFunc) and not _is_scheduled(func):
                    # rules that cannot apply are not tried (each builds a Schedule and
                    # analyses the blocks only to decline; this pass on magika: 0.17-0.18
                    # -> 0.13 CPU s); the first that applies is the same (_rule_gates)
                    blocks = kernel_blocks(func)
                    tried = [rule for rule, name, inner in rules
                             if may_apply(name, inner, blocks)]
                    scheduled = _apply_first(tried, func, tgt)
                    if scheduled is not None:
                        updated[gvar] = scheduled
        for gvar, func in updated.items():
            mod[gvar] = func
        return mod

    return _pass


REDUCTION_RULES = _rule_gates.REDUCTION_RULES
"""Names (:func:`rule_name`) of the rules of :func:`cpu_schedule_rules` that return ``None``
on a PrimFunc with no block iterating a reduction (``CommReduce``) axis: each matches a
reduction block (convolution, matmul, GEMV, row or plane reduction) first. The schedule pass
does not try them on such a function, nor where the cheaper necessary condition of
:mod:`relax_memplan.schedules._rule_gates` fails; tests check that each of these declines a
spatial function."""


def _has_reduction(func: tirx.PrimFunc) -> bool:
    """Whether any block of ``func``, at any depth, has a reduction (``CommReduce``) iter var;
    ``True`` also on a statement kind not known here (every rule is then tried)."""
    return kernel_blocks(func).has_reduction


def _unwrap(rule):
    while isinstance(rule, (GuardedRule, CodegenGuard)):
        rule = rule.rule
    return rule


def _is_scheduled(func: tirx.PrimFunc) -> bool:
    return func.attrs is not None and IS_SCHEDULED_ATTR in func.attrs \
        and bool(func.attrs[IS_SCHEDULED_ATTR])


def rule_name(rule) -> str:
    """The class name of the rule inside any :class:`GuardedRule`/:class:`CodegenGuard` wrappers
    (``GuardedRule(CodegenGuard(DotProductGEMV(GEMV)))`` -> ``"DotProductGEMV"``)."""
    return type(_unwrap(rule)).__name__


def _apply_first(rules, func: tirx.PrimFunc, target: Target):
    """dlight's ``ApplyDefaultSchedule`` for one function: the first rule's result, marked
    ``tirx.is_scheduled`` and ``relax_memplan.schedule_rule`` (and, for a plain
    concatenation, :data:`~relax_memplan.analysis.concat.CONCAT_AXIS_ATTR`, so that the
    planner still writes it in place); ``None`` if no rule applies."""
    for rule in rules:
        space = rule.apply(func, target, False)
        if space is None:
            continue
        sch = space if isinstance(space, s_tir.Schedule) else space[0]
        attrs = {IS_SCHEDULED_ATTR: True, SCHEDULE_RULE_ATTR: rule_name(rule)}
        axis = concat_axis(func)
        if axis is not None:
            attrs[CONCAT_AXIS_ATTR] = axis
        return sch.mod["main"].with_attrs(attrs)
    return None


def schedule_prim_func(func: tirx.PrimFunc, target: Union[str, dict, Target]) -> tirx.PrimFunc:
    """Schedule one PrimFunc with :func:`cpu_schedule_rules`.

    Use it on specialised copies of a symbolic kernel (``func.specialize({m: 64})``
    or ``BindSymbolicVars``): with all matmul extents constant the static rule
    applies. A function already marked ``tirx.is_scheduled`` or that no rule
    matches is returned unchanged.

    Parameters
    ----------
    func : tvm.tirx.PrimFunc
        An unscheduled (legalized, possibly fused) PrimFunc.
    target : str, dict or tvm.target.Target
        An llvm target.

    Returns
    -------
    tvm.tirx.PrimFunc
        The scheduled function with ``tirx.is_scheduled = True``, or ``func``.
    """
    if func.attrs is not None and IS_SCHEDULED_ATTR in func.attrs and func.attrs[IS_SCHEDULED_ATTR]:
        return func
    mod = tvm.IRModule({"main": func})
    out = cpu_schedule_pass(target)(mod)["main"]
    return out
