"""PlanStaticMemory: place the statically sized tensors of each Relax function in one arena.

Where it runs
-------------
In place of TVM's ``StaticPlanBlockMemory``: after ``CallTIRRewrite`` (tensors
are ``R.builtin.alloc_tensor`` bindings) and before ``LowerAllocTensor``. Run
``relax.transform.StaticPlanBlockMemory()`` right after it: the tensors this
pass leaves alone (symbolic shapes, function outputs, tensors a callee may
retain) are then planned exactly as TVM would plan them.

What it does
------------
1. :func:`relax_memplan.analysis.liveness.analyze_liveness` gives each
   allocation a half-open live range in program steps, with aliases (views,
   ``match_cast``, tuples) and ``R.If`` branches accounted for.
2. For each (device index, storage scope) the plannable tensors become
   :class:`relax_memplan.planner.Buffer` s (sizes rounded to
   ``alignment_bytes``) and :func:`relax_memplan.planner.plan` assigns byte
   offsets (best of greedy-by-size / greedy-by-breadth and an improvement
   search, as in TFLite's and XLA's arena planners). The plan is validated
   before it is used.
3. One ``R.memory.alloc_storage`` of ``uint8`` (the arena) is bound at the
   top of the function; each planned ``R.builtin.alloc_tensor`` becomes
   ``R.memory.alloc_tensor(arena, offset, ...)`` followed, for a non-zero
   offset, by ``R.memory.ensure_zero_offset`` (``vm.builtin.ensure_zero_offset``
   once lowered: a zero-copy view at a 64-byte-aligned offset; kernels assert
   ``byte_offset == 0``).

Function attributes
-------------------
Reads none. Writes ``relax_memplan.arena_bytes`` (total arena bytes of the
function) and ``relax_memplan.lower_bound_bytes`` (peak live bytes of the
planned tensors, sizes rounded to the alignment) on every function it plans.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Dict, List, Optional, Sequence, Tuple

import tvm
from tvm import relax

from ..analysis.liveness import FunctionLiveness, TensorLiveness, analyze_liveness
from ..planner import Buffer, peak_live_bytes, plan, validate
from ._arena_rewrite import ArenaRewriter, alloc_arena
from ._module_util import replace_functions
from ._args import check_planner_args

__all__ = ["PlanStaticMemory", "ArenaPlan", "FunctionPlan"]


@dataclass
class ArenaPlan:
    """The arena of one function for one (device index, storage scope).

    Attributes
    ----------
    device_index, storage_scope
        Where the arena lives.
    arena_bytes : int
        Size of the arena (its ``alloc_storage``), in bytes.
    lower_bound_bytes : int
        Peak live bytes of the tensors in the arena, each rounded up to the
        alignment: no plan with aligned offsets can be smaller (a tensor at an
        aligned offset keeps the next tensor from starting before the next
        aligned address).
    unaligned_lower_bound_bytes : int
        Peak live bytes with exact tensor sizes (the bound if alignment were free).
    offsets : dict of str to int
        Tensor uid -> byte offset in the arena.
    algorithm : str
        Name of the placement algorithm whose plan was kept.
    """

    device_index: int
    storage_scope: str
    arena_bytes: int
    lower_bound_bytes: int
    unaligned_lower_bound_bytes: int
    offsets: Dict[str, int]
    algorithm: str


@dataclass
class FunctionPlan:
    """What :class:`PlanStaticMemory` decided for one function."""

    name: str
    liveness: FunctionLiveness
    arenas: List[ArenaPlan] = field(default_factory=list)

    @property
    def arena_bytes(self) -> int:
        """Total bytes of this function's arenas."""
        return sum(a.arena_bytes for a in self.arenas)

    @property
    def lower_bound_bytes(self) -> int:
        """Sum over arenas of their lower bounds (peak live bytes, aligned sizes)."""
        return sum(a.lower_bound_bytes for a in self.arenas)

    @property
    def unaligned_lower_bound_bytes(self) -> int:
        """Sum over arenas of their peak live bytes with exact sizes."""
        return sum(a.unaligned_lower_bound_bytes for a in self.arenas)


def _round_up(value: int, multiple: int) -> int:
    return (value + multiple - 1) // multiple * multiple


def _plan_function(
    liveness: FunctionLiveness,
    alignment_bytes: int,
    algorithms: Optional[Sequence[str]],
    time_limit_s: float,
) -> List[ArenaPlan]:
    groups: Dict[Tuple[int, str], List[TensorLiveness]] = {}
    for t in liveness.plannable:
        groups.setdefault((t.device_index, t.storage_scope), []).append(t)
    arenas = []
    for (dev, scope), tensors in sorted(groups.items()):
        buffers = [
            Buffer(
                id=t.uid,
                start=t.start,
                end=t.end,
                size_bytes=_round_up(t.size_bytes or 1, alignment_bytes),
                alignment_bytes=alignment_bytes,
            )
            for t in tensors
        ]
        result = plan(buffers, algorithms=algorithms, time_limit_s=time_limit_s)
        validate(buffers, result.offsets)
        exact = [
            Buffer(id=t.uid, start=t.start, end=t.end, size_bytes=max(t.size_bytes, 1))
            for t in tensors
        ]
        arenas.append(
            ArenaPlan(
                device_index=dev,
                storage_scope=scope,
                arena_bytes=result.height_bytes,
                lower_bound_bytes=result.lower_bound_bytes,
                unaligned_lower_bound_bytes=peak_live_bytes(exact),
                offsets=dict(result.offsets),
                algorithm=result.algorithm,
            )
        )
    return arenas


def _rewriter_for(fplan: FunctionPlan) -> ArenaRewriter:
    prologue, placement = [], {}
    by_uid = {t.uid: t for t in fplan.liveness.tensors}
    for arena in fplan.arenas:
        arena_var = relax.Var(f"arena_d{arena.device_index}", relax.ObjectType())
        prologue.append(relax.VarBinding(arena_var, alloc_arena(
            arena.arena_bytes, arena.device_index, arena.storage_scope)))
        for uid, offset in arena.offsets.items():
            placement[by_uid[uid].var] = (arena_var, offset, by_uid[uid])
    return ArenaRewriter(prologue, placement)


@tvm.transform.module_pass(opt_level=0, name="PlanStaticMemory")
class PlanStaticMemory:
    """Place statically sized intermediate tensors at byte offsets in one arena per function.

    Must run after ``CallTIRRewrite`` and before ``LowerAllocTensor``, in place
    of ``StaticPlanBlockMemory``; follow it with ``StaticPlanBlockMemory`` so
    that what it leaves (see :mod:`relax_memplan.analysis.liveness`) keeps
    TVM's behaviour.

    Parameters
    ----------
    alignment_bytes : int
        Alignment of every offset, in bytes; a power of two >= 64 (the VM's
        ``ensure_zero_offset`` makes a zero-copy view only at 64-byte
        alignment, otherwise it silently copies).
    algorithms : sequence of str, optional
        Names from :data:`relax_memplan.planner.ALGORITHMS`; ``None`` tries all.
    time_limit_s : float
        Budget in seconds for the offset search, per arena.
    func_names : sequence of str, optional
        Functions to plan; ``None`` plans every Relax function.

    Attributes
    ----------
    plans : dict of str to FunctionPlan
        Filled when the pass runs: per function, the liveness and the arenas.

    Raises
    ------
    ValueError
        If ``alignment_bytes`` is not a power of two >= 64, ``algorithms`` is
        empty or names an unknown algorithm, or ``time_limit_s`` is not > 0.
    TypeError
        If an argument has the wrong type.
    relax_memplan.planner.PlanError
        If a plan fails validation (an internal error: never silently used).
    """

    def __init__(
        self,
        alignment_bytes: int = 64,
        algorithms: Optional[Sequence[str]] = None,
        time_limit_s: float = 1.0,
        func_names: Optional[Sequence[str]] = None,
    ):
        self.alignment_bytes, self.algorithms, self.time_limit_s = check_planner_args(
            alignment_bytes, algorithms, time_limit_s)
        self.func_names = tuple(func_names) if func_names is not None else None
        self.plans: Dict[str, FunctionPlan] = {}

    def transform_module(self, mod: tvm.IRModule, _ctx) -> tvm.IRModule:
        updates = {}
        for gv, func in mod.functions_items():
            if not isinstance(func, relax.Function):
                continue
            if self.func_names is not None and gv.name_hint not in self.func_names:
                continue
            liveness = analyze_liveness(mod, gv.name_hint)
            fplan = FunctionPlan(gv.name_hint, liveness)
            fplan.arenas = _plan_function(
                liveness, self.alignment_bytes, self.algorithms, self.time_limit_s
            )
            self.plans[gv.name_hint] = fplan
            if not fplan.arenas:
                continue
            new_func = _rewriter_for(fplan).rewrite_function(func)
            new_func = new_func.with_attrs(
                {
                    "relax_memplan.arena_bytes": fplan.arena_bytes,
                    "relax_memplan.lower_bound_bytes": fplan.lower_bound_bytes,
                }
            )
            updates[gv] = new_func
        if not updates:
            return mod
        return relax.transform.Normalize()(replace_functions(mod, updates))
