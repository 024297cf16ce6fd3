"""Our CPU schedules cost no memory: a scheduled concatenation is still written in place, a
scheduled 1x1 convolution keeps the in-place pair of the unscheduled kernel, and yolov8n's
lower bound is the unscheduled build's (slow)."""

import pytest
import tvm_ffi
from tvm import relax

from relax_memplan.analysis.concat import CONCAT_AXIS_ATTR, concat_axis
from relax_memplan.analysis.inplace import inplace_pairs
from relax_memplan.schedules import SCHEDULE_RULE_ATTR, host_target, schedule_prim_func
from tests.conftest import shared_model
from tests.schedules.conv_blocked_checks import _fused
from tests.schedules.conv_checks import conv_module


def _concat_kernel():
    parts = [relax.Var(f"x{k}", relax.TensorType([1, c, 20, 20], "float32"))
             for k, c in enumerate((16, 32))]
    bb = relax.BlockBuilder()
    with bb.function("main", parts):
        with bb.dataflow():
            out = bb.emit_output(relax.op.concat(parts, axis=1))
        bb.emit_func_output(out)
    (func,) = _fused(bb.get())
    return func


def test_scheduled_concatenation_is_still_one():
    """Regression: SpatialFallback's loops made the concatenation kernels unrecognisable, and
    yolov8n under our schedules wrote 3 of its concatenations in place instead of 9 (lower
    bound 2,048,000 -> 2,457,600 B)."""
    func = _concat_kernel()
    scheduled = schedule_prim_func(func, host_target())
    assert str(scheduled.attrs[SCHEDULE_RULE_ATTR]) == "SpatialFallback"
    assert not tvm_ffi.structural_equal(scheduled.body, func.body)
    assert concat_axis(func) == 1 and concat_axis(scheduled) == 1
    assert int(scheduled.attrs[CONCAT_AXIS_ATTR]) == 1


def test_concat_axis_attribute_must_agree_with_the_shapes():
    wrong = schedule_prim_func(_concat_kernel(), host_target()).with_attr(CONCAT_AXIS_ATTR, 2)
    assert concat_axis(wrong) is None


_AVX512 = {"kind": "llvm", "mcpu": "skylake-avx512"}
_AVX2 = {"kind": "llvm", "mcpu": "haswell"}


@pytest.mark.parametrize("target, shape, rule", [
    (_AVX512, (1, 32, 7, 7), "ChannelBlockedConv"),
    (_AVX512, (1, 32, 14, 14), "ChannelBlockedConv"),
    (_AVX512, (1, 32, 64, 64), "DirectConv"),
    (_AVX2, (1, 32, 14, 14), "ChannelBlockedConv"),
    (_AVX2, (1, 32, 64, 64), "DirectConv"),
    # on AVX2 ChannelBlockedConv leaves a 7-column map (too little of its 8-lane tile
    # filled), StaticMatmul takes it and loses the pair: a known gap, strict so that a fix
    # shows here
    pytest.param(_AVX2, (1, 32, 7, 7), "ChannelBlockedConv", marks=pytest.mark.xfail(
        strict=True, reason="AVX2: StaticMatmul takes the 7x7 map and loses the in-place pair")),
])
def test_scheduled_1x1_conv_keeps_the_in_place_pair(target, shape, rule):
    """The unscheduled 1x1 conv copies its input (TOPI's padding block) before writing its
    output, so the output may take the input's storage; StaticMatmul's tile reads the input
    inside the parallel loop and lost that (a 14x14 map: DirectConv left it to StaticMatmul).
    ChannelBlockedConv and DirectConv keep the copy first. Targets are named (scheduling only,
    nothing runs), so the expectation does not depend on the host."""
    import tvm

    (func,) = _fused(conv_module(shape, shape[1], 1, 1, 0, 1, 1, "relu"))
    scheduled = schedule_prim_func(func, tvm.target.Target(target))
    assert str(scheduled.attrs[SCHEDULE_RULE_ATTR]) == rule
    assert inplace_pairs(func) and inplace_pairs(scheduled) == inplace_pairs(func)


def _main_bound(path, shapes, schedule: bool) -> int:
    from relax_memplan.frontend import import_onnx
    from relax_memplan.pipeline import fusion_passes, get_pipeline
    from relax_memplan.transform import PlanStaticMemory, ReorderForMemory

    mod, _ = import_onnx(path, shapes)
    target = host_target()
    plan = PlanStaticMemory(time_limit_s=0.2, inplace=True, concat_inplace=True)
    get_pipeline(target, plan_pass=plan, schedule=schedule, reorder_pass=ReorderForMemory(),
                 fusion_pass_list=fusion_passes(target, "auto", schedule))(mod)
    return plan.plans["main"].lower_bound_bytes


@pytest.mark.slow
def test_yolov8n_bound_is_the_unscheduled_builds():
    path = shared_model("yolov8n-nudenet-320n.onnx")
    shapes = {"images": (1, 3, 320, 320)}
    assert _main_bound(path, shapes, True) == _main_bound(path, shapes, False) == 2048000
