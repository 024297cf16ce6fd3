"""dlight's CPU ``Reduction`` rule, kept only when its parallel loop runs over the rows.

Where it runs
-------------
In :func:`relax_memplan.schedules.cpu_schedule_rules`, after the GEMV rule and
before :class:`~relax_memplan.schedules.cpu_fallback.SpatialFallback`.

Why
---
dlight's CPU ``Reduction`` (softmax, layer norm: reductions over the last axis
followed by element-wise blocks) parallelises the leading loop of the last
block and computes the reductions of that row under it. When there is one
row (softmax over ``(1, 1000)``, the classifier of squeezenet; layer norm at
one token) the unit row loop is dropped and the leading loop is the *column*
loop: every one of the 1000 outputs recomputes the whole max/exp/sum, a
quadratic kernel (4-11 ms instead of 6 us), and the parallel tasks all write
the same reduction buffer. :class:`RowReduction` runs the rule and keeps its
schedule only when the loop over the reduction blocks is as long as their
rows (the product of their spatial extents).
"""

from __future__ import annotations

from typing import Optional

import tvm
from tvm import s_tir, tirx
from tvm.s_tir import dlight

from .cpu_gemv import reduction_blocks

__all__ = ["RowReduction"]


def _rows(block: s_tir.SBlock):
    rows = tirx.IntImm("int64", 1)
    for iv in block.iter_vars:
        if iv.iter_type == tirx.IterVar.DataPar:
            rows = rows * iv.dom.extent
    return rows


class RowReduction(dlight.ScheduleRule):
    """dlight's CPU ``Reduction``, rejected when its outer loop is not the row loop.

    Parameters
    ----------
    rule : tvm.s_tir.dlight.ScheduleRule, optional
        The rule to check (default ``dlight.cpu.Reduction()``).
    """

    def __init__(self, rule: Optional[dlight.ScheduleRule] = None):
        self.rule = rule if rule is not None else dlight.cpu.Reduction()

    def apply(self, func, target, tunable):
        if not isinstance(func, tirx.PrimFunc):
            return None
        blocks = reduction_blocks(func)
        if not blocks:
            return None
        result = self.rule.apply(func, target, tunable)
        sch = result[0] if isinstance(result, list) and result else result
        if not isinstance(sch, s_tir.Schedule):
            return result
        analyzer = tvm.sym.Analyzer()
        for block in blocks:
            rv = sch.get_sblock(block.name_hint)
            loops = sch.get_loops(rv)
            if not loops:
                return None
            outer = sch.get(loops[0])
            if not analyzer.can_prove_equal(outer.extent, _rows(block)):
                return None
        return result

    def __repr__(self) -> str:
        return f"RowReduction({type(self.rule).__name__})"
