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
4. Never worse than TVM: the function is kept only if it allocates no more
   than with TVM's ``StaticPlanBlockMemory`` alone; otherwise it is left
   untouched (TVM's planner, which runs next, plans it) and
   :attr:`FunctionPlan.fallback_reason` says why. Both figures come from running
   ``StaticPlanBlockMemory`` on a copy of the module (without and with our
   arenas) and reading the result with
   :func:`relax_memplan.analysis.storage.summarize_storage`.

What "allocate" means
---------------------
The bytes one call of the function requests from ``vm.builtin.alloc_storage``
for its constant-size allocations (what the VM's instrument hook sees, and what
the naive allocator really allocates): every ``R.memory.alloc_storage`` (our
arenas, whose tensor sizes are rounded up to ``alignment_bytes``, and TVM's
storage tokens) plus every ``R.builtin.alloc_tensor`` no planner took
(function outputs, If results TVM does not plan), each of which becomes its own
``alloc_storage`` of the tensor's exact bytes. An ``R.If`` counts its larger
branch. Our views at non-zero offsets cost nothing: they are 64-byte aligned,
so ``ensure_zero_offset`` never copies. Allocations sized at run time are the
same in both builds (this pass leaves them) and are not counted.

Function attributes
-------------------
Reads none. Writes ``relax_memplan.arena_bytes`` (total arena bytes of the
function) and ``relax_memplan.lower_bound_bytes`` (peak live bytes of the
planned tensors, sizes rounded to the alignment) on every function it plans.
"""

from __future__ import annotations

import warnings
from dataclasses import dataclass, field
from typing import Dict, List, Optional, Sequence, Tuple

import tvm
from tvm import relax

from ..analysis.concat import concat_table
from ..analysis.inplace import kernel_table
from ..analysis.liveness import FunctionLiveness, TensorLiveness, analyze_liveness
from ..analysis.storage import summarize_storage
from ..planner import Buffer, peak_live_bytes
from ._arena_rewrite import ArenaRewriter, alloc_arena
from ._concat_plan import plan_concats
from ._inplace_plan import (count_capable, inplace_calls, merged_buffers, nesting_from_groups,
                            place_with_sharing)
from ._module_util import before_call_tir_rewrite, replace_functions
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
    lower_bound_without_inplace_bytes : int
        :attr:`lower_bound_bytes` if every kernel wrote a fresh output (equal to it
        when in-place reuse is off or found nothing).
    lower_bound_without_concat_bytes : int
        :attr:`lower_bound_bytes` without concatenations written in place (with in-place
        reuse if on).
    concat_sites : list of ConcatSite
        The concat calls of this arena written in place (their call dropped).
    concat_refusals : dict of str to int
        Reason -> concat calls refused for it (:mod:`._concat_plan`).
    nested, nested_without_concat : dict of str to (str, int)
        Tensor uid -> (parent uid, byte delta) of the tensors placed inside another (in-place
        chains at delta 0, concat inputs in their output), with and without the concats.
    """

    device_index: int
    storage_scope: str
    arena_bytes: int
    lower_bound_bytes: int
    unaligned_lower_bound_bytes: int
    offsets: Dict[str, int]
    algorithm: str
    lower_bound_without_inplace_bytes: int = 0
    lower_bound_without_concat_bytes: int = 0
    concat_sites: list = field(default_factory=list)
    concat_refusals: Dict[str, int] = field(default_factory=dict)
    nested: Dict[str, Tuple[str, int]] = field(default_factory=dict)
    nested_without_concat: Dict[str, Tuple[str, int]] = field(default_factory=dict)


@dataclass
class FunctionPlan:
    """What :class:`PlanStaticMemory` decided for one function.

    Attributes
    ----------
    name : str
        Function name.
    liveness : FunctionLiveness
        Live ranges of the function's allocations.
    arenas : list of ArenaPlan
        The arenas placed in the function (empty when :attr:`fallback_reason` is set).
    rejected_arenas : list of ArenaPlan
        The arenas planned but not used because TVM's plan is smaller.
    bytes_per_call : int or None
        Bytes the function allocates per call with our arenas (see the module
        docstring for what is counted); ``None`` if nothing was planned.
    tvm_bytes_per_call : int or None
        The same with TVM's ``StaticPlanBlockMemory`` alone.
    fallback_reason : str or None
        Why our plan was not used (``"TVM's plan is smaller (432 B vs our 528 B per call)"``);
        ``None`` when it is used or nothing was planned.
    inplace_capable_kernels : int or None
        Distinct kernels the function calls that may write an output over an input
        (:mod:`relax_memplan.analysis.inplace`); ``None`` when in-place reuse is off.
    concat_inplace_on : bool
        Whether concatenations written in place were looked for.
    """

    name: str
    liveness: FunctionLiveness
    arenas: List[ArenaPlan] = field(default_factory=list)
    rejected_arenas: List[ArenaPlan] = field(default_factory=list)
    bytes_per_call: Optional[int] = None
    tvm_bytes_per_call: Optional[int] = None
    fallback_reason: Optional[str] = None
    inplace_capable_kernels: Optional[int] = None
    concat_inplace_on: bool = False

    @property
    def concat_inplace(self) -> Optional[int]:
        """Concat calls written in place (dropped) in the arenas used; ``None`` when off."""
        return sum(len(a.concat_sites) for a in self.arenas) if self.concat_inplace_on else None

    @property
    def concat_refusals(self) -> Dict[str, int]:
        """Reason -> concat calls refused for it, over the arenas planned (used or not)."""
        out: Dict[str, int] = {}
        for a in self.arenas or self.rejected_arenas:
            for why, n in a.concat_refusals.items():
                out[why] = out.get(why, 0) + n
        return out

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

    @property
    def lower_bound_without_inplace_bytes(self) -> int:
        """Sum over arenas of their lower bounds with every kernel writing a fresh output."""
        return sum(a.lower_bound_without_inplace_bytes for a in self.arenas)


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
    inplace_nested = nesting_from_groups(liveness.sharing_groups())
    arenas = []
    for k, ((dev, scope), tensors) in enumerate(sorted(groups.items())):
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
        ids = {b.id for b in buffers}
        nested = {m: p for m, p in inplace_nested.items() if m in ids and p[0] in ids}
        concats = plan_concats(liveness, buffers, nested, alignment_bytes, owns_unplaced=k == 0)
        result, offsets = place_with_sharing(buffers, concats.nested, algorithms, time_limit_s)
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
                unaligned_lower_bound_bytes=peak_live_bytes(merged_buffers(exact, concats.nested)),
                offsets=offsets,
                algorithm=result.algorithm,
                lower_bound_without_inplace_bytes=peak_live_bytes(buffers),
                lower_bound_without_concat_bytes=peak_live_bytes(merged_buffers(buffers, nested)),
                concat_sites=concats.applied,
                concat_refusals=dict(concats.refusals),
                nested=concats.nested,
                nested_without_concat=nested,
            )
        )
    return arenas


def _bytes_per_call(mod: tvm.IRModule) -> Dict[str, int]:
    """Bytes each Relax function of ``mod`` allocates per call once ``StaticPlanBlockMemory``
    has planned what is left (constant sizes; an ``R.If`` counts its larger branch)."""
    planned = relax.transform.StaticPlanBlockMemory()(mod)
    return {gv.name_hint: summarize_storage(func).static_total_bytes
            for gv, func in planned.functions_items() if isinstance(func, relax.Function)}


def _tvm_bytes_per_call(mod: tvm.IRModule) -> Dict[str, int]:
    """:func:`_bytes_per_call` of the module before our pass: TVM's plan alone."""
    return _bytes_per_call(mod)


def _rewriter_for(fplan: FunctionPlan, calls: Optional[Dict] = None) -> ArenaRewriter:
    prologue, placement = [], {}
    by_uid = {t.uid: t for t in fplan.liveness.tensors}
    for arena in fplan.arenas:
        arena_var = relax.Var(f"arena_d{arena.device_index}", relax.ObjectType())
        prologue.append(relax.VarBinding(arena_var, alloc_arena(
            arena.arena_bytes, arena.device_index, arena.storage_scope)))
        for uid, offset in arena.offsets.items():
            placement[by_uid[uid].var] = (arena_var, offset, by_uid[uid])
    return ArenaRewriter(prologue, placement, calls)


@tvm.transform.module_pass(opt_level=0, name="PlanStaticMemory")
class PlanStaticMemory:
    """Place statically sized intermediate tensors at byte offsets in one arena per function.

    Must run after ``CallTIRRewrite`` and before ``LowerAllocTensor``, in place
    of ``StaticPlanBlockMemory``; follow it with ``StaticPlanBlockMemory`` so
    that what it leaves (see :mod:`relax_memplan.analysis.liveness`) keeps
    TVM's behaviour. A function whose arenas would make it allocate more per
    call than TVM's plan alone (tiny tensors, where 64-byte alignment costs
    more than sharing saves) is left to TVM: never worse than TVM's plan.

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
    inplace : bool
        Let a kernel write its output over an input that dies there when its TIR allows
        it (:mod:`relax_memplan.analysis.inplace`): both tensors get one offset and the
        call goes to the kernel's in-place variant (``<kernel>_inplace_o<k>_i<j>``, a new
        PrimFunc of the module).
    concat_inplace : bool
        Write concatenations in place (:mod:`relax_memplan.transform._concat_plan`): a
        concatenation kernel along an axis before which every dim is 1 gets its inputs
        placed at their byte ranges inside its output, so their producers write there
        and the concat call is dropped; applied only where the live bytes drop.

    Attributes
    ----------
    plans : dict of str to FunctionPlan
        Filled when the pass runs: per function, the liveness, the arenas, the
        bytes per call with ours and with TVM's plan, and the fallback reason.

    Warns
    -----
    UserWarning
        When run before ``CallTIRRewrite`` (kernels called with ``R.call_tir``, no
        ``R.builtin.alloc_tensor``): it then plans nothing and returns the module unchanged.

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
        inplace: bool = False,
        concat_inplace: bool = False,
    ):
        self.alignment_bytes, self.algorithms, self.time_limit_s = check_planner_args(
            alignment_bytes, algorithms, time_limit_s)
        if not isinstance(inplace, bool):
            raise TypeError(f"inplace must be a bool, got {type(inplace).__name__}")
        self.inplace = inplace
        if not isinstance(concat_inplace, bool):
            raise TypeError(f"concat_inplace must be a bool, got {type(concat_inplace).__name__}")
        self.concat_inplace = concat_inplace
        self.func_names = tuple(func_names) if func_names is not None else None
        self.plans: Dict[str, FunctionPlan] = {}

    def transform_module(self, mod: tvm.IRModule, _ctx) -> tvm.IRModule:
        if before_call_tir_rewrite(mod):
            warnings.warn(
                "PlanStaticMemory planned nothing: the module calls kernels with R.call_tir but "
                "has no R.builtin.alloc_tensor, so CallTIRRewrite has not run yet; run "
                "PlanStaticMemory after CallTIRRewrite (relax_memplan.get_pipeline places it "
                "there)", stacklevel=2)
            return mod
        original, updates, kernels = mod, {}, {}
        table = kernel_table(mod) if self.inplace else None
        concats = concat_table(mod) if self.concat_inplace else None
        builder = relax.BlockBuilder(mod)
        for gv, func in mod.functions_items():
            if not isinstance(func, relax.Function):
                continue
            if self.func_names is not None and gv.name_hint not in self.func_names:
                continue
            liveness = analyze_liveness(mod, gv.name_hint, table, concats)
            fplan = FunctionPlan(gv.name_hint, liveness, concat_inplace_on=self.concat_inplace)
            if table is not None:
                fplan.inplace_capable_kernels = count_capable(func, table)
            fplan.arenas = _plan_function(
                liveness, self.alignment_bytes, self.algorithms, self.time_limit_s
            )
            self.plans[gv.name_hint] = fplan
            if not fplan.arenas:
                continue
            calls = inplace_calls(mod, fplan, kernels, builder) if table else {}
            for arena in fplan.arenas:
                for site in arena.concat_sites:  # inputs already written in place
                    calls[site.binding_var] = relax.Tuple([])
            new_func = _rewriter_for(fplan, calls).rewrite_function(func)
            new_func = new_func.with_attrs(
                {
                    "relax_memplan.arena_bytes": fplan.arena_bytes,
                    "relax_memplan.lower_bound_bytes": fplan.lower_bound_bytes,
                }
            )
            updates[gv] = new_func
        if not updates:
            return mod
        if kernels:
            mod = builder.get()
        updates = self._keep_if_not_worse_than_tvm(mod, updates)
        if not updates:
            return original
        return relax.transform.Normalize()(replace_functions(mod, updates))

    def _keep_if_not_worse_than_tvm(self, mod: tvm.IRModule, updates: Dict) -> Dict:
        """The updates whose function allocates no more per call than with TVM's plan alone;
        the others are dropped and their :class:`FunctionPlan` says why."""
        theirs = _tvm_bytes_per_call(mod)
        ours = _bytes_per_call(replace_functions(mod, updates))
        kept = {}
        for gv, new_func in updates.items():
            fplan = self.plans[gv.name_hint]
            fplan.bytes_per_call, fplan.tvm_bytes_per_call = ours[gv.name_hint], theirs[gv.name_hint]
            if fplan.bytes_per_call <= fplan.tvm_bytes_per_call:
                kept[gv] = new_func
                continue
            fplan.fallback_reason = (f"TVM's plan is smaller ({fplan.tvm_bytes_per_call:,} B "
                                     f"vs our {fplan.bytes_per_call:,} B per call)")
            fplan.rejected_arenas, fplan.arenas = fplan.arenas, []
        return kept
