"""Fallback CPU (llvm) rule for kernels without reductions: parallel outer loops, vector inner.

Where it runs
-------------
Last in :func:`relax_memplan.schedules.cpu_schedule_rules`, on PrimFuncs no
other rule took whose blocks are all spatial: element-wise chains, transpose,
concat, resize, padding, layout changes (pooling and batch-norm statistics
are reductions and stay with dlight's ``Reduction`` or unscheduled).

Algorithm
---------
TVM TOPI's x86 injective schedule (``topi.x86.schedule_injective``): each block
at the root gets its outer loops fused and parallelised and its innermost loop
vectorised when its extent is constant (:func:`~relax_memplan.schedules.cpu_spatial.parallelize_spatial`).
Blocks with fewer than ``min_work`` iterations in all are left serial (a
parallel launch costs more than it saves).
"""

from __future__ import annotations

from tvm import s_tir, tirx
from tvm.s_tir.dlight import ScheduleRule
from tvm.s_tir.dlight.analysis import get_root_block
from tvm.target import Target

from .cpu_matmul import simd_lanes
from .cpu_spatial import parallelize_spatial

__all__ = ["SpatialFallback"]


class SpatialFallback(ScheduleRule):
    """Parallel + vectorised loops for functions whose blocks are all spatial.

    Parameters
    ----------
    min_work : int
        Fewest iterations (product of constant loop extents) for a block to be
        parallelised; smaller blocks stay serial.
    """

    def __init__(self, min_work: int = 4096):
        self.min_work = min_work

    def is_target_available(self, target: Target) -> bool:
        return target is not None and target.kind.name == "llvm"

    def apply(self, func: tirx.PrimFunc, target: Target, _tunable: bool):
        if not isinstance(func, tirx.PrimFunc) or not self.is_target_available(target):
            return None
        sch = s_tir.Schedule(func)
        blocks = sch.get_child_blocks(get_root_block(sch))
        if not blocks:
            return None
        for block in blocks:
            node = sch.get(block)
            if any(iv.iter_type != tirx.IterVar.DataPar for iv in node.iter_vars):
                return None
            if len(sch.get_loops(block)) == 0:
                return None
        changed = False
        for block in blocks:
            work = 1
            for lp in sch.get_loops(block):
                ext = sch.get(lp).extent
                work *= ext.value if isinstance(ext, tirx.IntImm) else self.min_work
            if work < self.min_work:
                continue
            dtype = str(sch.get(block).writes[0].source.dtype)
            parallelize_spatial(sch, block, simd_lanes(target, dtype))
            changed = True
        return sch if changed else None
