"""Compile-time guard: a schedule whose vector code would blow up LLVM is not applied.

Where it runs
-------------
In :func:`relax_memplan.schedules.cpu_schedule_rules`, around dlight's CPU ``GEMV``
(around :class:`~relax_memplan.schedules.cpu_gemv.DotProductGEMV`), when the ``legalize``
phase ends (after FuseTIR): when the rule's
result fails the check, the rule counts as not applying and the next rule (or
none: TVM's unscheduled kernel) is used.

Why
---
dlight's CPU ``GEMV`` vectorises the *spatial* loop 64 or 128 lanes wide and keeps
the reduction loop (unrolled, ``pragma_auto_unroll_max_step``) inside it. Each
lane then reads its own matrix row: strided loads (gathers) of 64-128 lanes,
repeated once per unrolled reduction step. For the VAD model's head
(``[seq, 1, 64] @ [64, 1]``, seq = 256) that is 64 x 128-lane gathers; for an
AVX-512 host (``mcpu=znver4``) LLVM did not finish that one kernel in 15 minutes,
and on plain ``llvm`` the kernel ran 1.9 ms per call for 16 K multiply-adds.

The check is structural and cheap (one walk over the scheduled PrimFunc): a
vectorised loop wider than ``max_vector_lanes`` elements, or one that encloses
another loop of extent > 1, is refused. Both are what TVM's ``VectorizeLoop``
turns into very wide vector values or per-lane gathers.
"""

from __future__ import annotations

from typing import List, Optional

from tvm import s_tir, tirx
from tvm.s_tir import dlight

__all__ = ["CodegenGuard", "vector_codegen_risk", "DEFAULT_MAX_VECTOR_LANES"]

DEFAULT_MAX_VECTOR_LANES = 64
"""Widest vectorised loop accepted, in elements (4 AVX-512 registers of float32)."""


def _extent(loop: tirx.For) -> Optional[int]:
    return loop.extent.value if isinstance(loop.extent, tirx.IntImm) else None


def vector_codegen_risk(func: tirx.PrimFunc,
                        max_vector_lanes: int = DEFAULT_MAX_VECTOR_LANES) -> Optional[str]:
    """Why ``func``'s vectorised loops would blow up code generation, or ``None``.

    Parameters
    ----------
    func : tvm.tirx.PrimFunc
        A scheduled PrimFunc (loops annotated ``T.vectorized``).
    max_vector_lanes : int
        Widest vectorised loop accepted, in elements; a symbolic extent counts as too wide.

    Returns
    -------
    str or None
        ``"vectorized loop <var> has <n> lanes (max <m>)"`` or
        ``"vectorized loop <var> encloses loop <var2> of extent <n>"``; ``None`` when safe.
    """
    sch = s_tir.Schedule(func)
    for block in _all_blocks(sch):
        loops = [sch.get(rv) for rv in sch.get_loops(block)]  # outermost first
        for depth, loop in enumerate(loops):
            if loop.kind != tirx.ForKind.VECTORIZED:
                continue
            lanes = _extent(loop)
            if lanes is None or lanes > max_vector_lanes:
                return (f"vectorized loop {loop.loop_var.name} has {loop.extent} lanes "
                        f"(max {max_vector_lanes})")
            for inner in loops[depth + 1:]:
                if _extent(inner) != 1:
                    return (f"vectorized loop {loop.loop_var.name} encloses loop "
                            f"{inner.loop_var.name} of extent {inner.extent}")
    return None


def _all_blocks(sch: s_tir.Schedule) -> list:
    """Every block under the root block, nested ones included."""
    out, todo = [], list(sch.get_child_blocks(sch.get_sblock("root")))
    while todo:
        block = todo.pop()
        out.append(block)
        todo.extend(sch.get_child_blocks(block))
    return out


class CodegenGuard(dlight.ScheduleRule):
    """A dlight rule whose result is dropped when :func:`vector_codegen_risk` finds a risk.

    Parameters
    ----------
    rule : tvm.s_tir.dlight.ScheduleRule
        The rule to guard.
    max_vector_lanes : int
        Passed to :func:`vector_codegen_risk` (elements).

    Attributes
    ----------
    rejected : list of str
        ``"<rule>: <reason>"`` for each result refused (diagnostics; grows over the
        rule's lifetime).
    """

    def __init__(self, rule: dlight.ScheduleRule,
                 max_vector_lanes: int = DEFAULT_MAX_VECTOR_LANES):
        self.rule = rule
        self.max_vector_lanes = max_vector_lanes
        self.rejected: List[str] = []

    def apply(self, func, target, tunable):
        result = self.rule.apply(func, target, tunable)
        if result is None:
            return None
        for sch in result if isinstance(result, list) else [result]:
            if not isinstance(sch, s_tir.Schedule):
                continue
            reason = vector_codegen_risk(sch.mod["main"], self.max_vector_lanes)
            if reason is not None:
                self.rejected.append(f"{self.rule!r}: {reason}")
                return None
        return result

    def __repr__(self) -> str:
        return f"CodegenGuard({self.rule!r})"
