"""PlanDynamicMemory: one arena per function when tensor sizes depend on symbolic dims.

Where it runs
-------------
After ``CallTIRRewrite`` and :class:`InsertDimRangeCheck`, before
:class:`PlanStaticMemory` and ``StaticPlanBlockMemory`` (which then see only
what this pass left). Reads ``tir_var_lower_bound`` / ``tir_var_upper_bound``;
writes ``relax_memplan.strategy`` on every function it plans.

Strategies
----------
``upper_bound``
    Every size is taken at the declared upper bounds of its dims (the largest
    value of the size expression over the declared ranges) and the tensors are
    placed in one arena of constant size, at constant offsets. A tensor with a
    dim that has no upper bound is left to TVM (never planned as if static).
``exact``
    The tensors are placed once at reference sizes (the upper bounds, or the
    lower bounds / 1 where none is declared); the plan's below-relation
    (:func:`relax_memplan.planner.stacking_order`) then gives each offset as an
    expression of the dims, ``align(max over tensors below of offset + size)``,
    and the arena size as ``max(offset + size)``. This is done for several
    reference shapes (range ends, then random ones); every stacking that gives
    the smallest arena at some probed shape is kept, and a ``Select`` picks one
    per call: the first whose "selector" tensors (those on top at some probe)
    end lowest. Any choice is valid; the arena is the chosen stacking's height.
    The VM computes all of it per call
    (``VMShapeLower``), so the arena is sized for the actual shape and is valid
    at every shape (also outside the sampled ones). Terms of a ``max`` that the
    arithmetic analyzer proves dominated over the declared ranges are dropped,
    which keeps the expressions small. (Offsets are written in the signature's
    dims: TVM 0.27's ``VMShapeLower`` cannot load an ``alloc_tensor`` offset
    bound to a var defined by ``match_cast``.)

Only dims defined by the function's parameters are used; a tensor whose size
depends on a var defined inside the body (data-dependent shapes) is left to
TVM. Before the plan is used it is checked with the planner's validator at the
ends of the declared ranges and at sampled shapes; if that ever fails the
function is left to TVM and the reason recorded (never a silently wrong plan).
"""

from __future__ import annotations

import random
from dataclasses import dataclass, field
from typing import Dict, List, Mapping, Optional, Sequence, Tuple

import tvm
import tvm_ffi
from tvm import relax, tirx

from ..analysis.dims import DimRange, declared_ranges, evaluate_bytes, evaluate_int, signature_dims
from ..analysis.liveness import SYMBOLIC_SHAPE, FunctionLiveness, TensorLiveness, analyze_liveness
from ..planner import (Buffer, PlanError, peak_live_bytes, plan, stacked_offsets,
                       stacking_order, validate)
from ._arena_rewrite import ArenaRewriter, alloc_arena
from ._args import check_planner_args

__all__ = ["PlanDynamicMemory", "DynamicFunctionPlan", "STRATEGIES"]

STRATEGIES = ("upper_bound", "exact")


@dataclass
class DynamicFunctionPlan:
    """What :class:`PlanDynamicMemory` decided for one function.

    Attributes
    ----------
    name : str
    strategy : str
    liveness : FunctionLiveness
    ranges : dict of str to DimRange
        Declared ranges of the signature dims.
    planned : list of str
        Uids of the tensors placed in the arena.
    left_to_tvm : dict of str to str
        Uid -> reason, for allocations left to TVM.
    aligned_size_exprs : dict of str to PrimExpr
        Uid -> bytes rounded up to the alignment, as an expression of the dims.
    orders : list of list of (str, tuple of str)
        ``exact``: one stacking order per reference shape kept; at run time the
        one giving the smallest arena is used (the first on ties);
        ``upper_bound``: unused (empty).
    selectors : list of tuple of str
        ``exact`` with several stackings: per stacking, the tensors whose tops
        decide the choice (the first stacking with the smallest max top wins).
    static_offsets : dict of str to int
        ``upper_bound``: the constant offsets.
    static_arena_bytes : int or None
        ``upper_bound``: the constant arena size.
    alignment_bytes : int
    samples : list of dict
        Shapes the plan was validated at: ``{"dims", "arena_bytes", "lower_bound_bytes"}``.
    fallback_reason : str or None
        Set when the function was left to TVM entirely.
    notes : list of str
        Degradations, e.g. fewer stackings kept because expressions grew too long.
    """

    name: str
    strategy: str
    liveness: FunctionLiveness
    ranges: Dict[str, DimRange]
    planned: List[str] = field(default_factory=list)
    left_to_tvm: Dict[str, str] = field(default_factory=dict)
    aligned_size_exprs: Dict[str, object] = field(default_factory=dict)
    orders: List[List[Tuple[str, Tuple[str, ...]]]] = field(default_factory=list)
    selectors: List[Tuple[str, ...]] = field(default_factory=list)
    static_offsets: Dict[str, int] = field(default_factory=dict)
    static_arena_bytes: Optional[int] = None
    alignment_bytes: int = 64
    samples: List[Dict] = field(default_factory=list)
    fallback_reason: Optional[str] = None
    notes: List[str] = field(default_factory=list)

    def _buffers_at_ids(self, dims: Mapping[str, int]) -> List[Buffer]:
        return self._buffers_at(dims)

    def _buffers_at(self, dims: Mapping[str, int]) -> List[Buffer]:
        tensors = {t.uid: t for t in self.liveness.tensors}
        out = []
        for uid in self.planned:
            size = evaluate_int(self.aligned_size_exprs[uid], dims)
            out.append(Buffer(uid, tensors[uid].start, tensors[uid].end, max(size, 1),
                              self.alignment_bytes))
        return out

    def bytes_at(self, dims: Mapping[str, int]) -> Tuple[int, int, Dict[str, int]]:
        """Arena bytes, lower bound (peak live aligned bytes) and offsets at concrete dims.

        Raises
        ------
        relax_memplan.planner.PlanError
            If the plan is not valid at ``dims`` (it always should be).
        ValueError
            If a dim has no value in ``dims``.
        """
        if not self.planned:
            raise ValueError(f"function {self.name} was left to TVM: {self.fallback_reason}")
        buffers = self._buffers_at(dims)
        if self.strategy == "exact":
            sizes = {b.id: b.size_bytes for b in buffers}
            candidates = [stacked_offsets(order, sizes, self.alignment_bytes) for order in self.orders]
            if len(candidates) == 1:
                offsets, height = candidates[0]
            else:  # the first stacking whose selector height is smallest, as at run time
                keys = [max(offs[u] + sizes[u] for u in sel)
                        for (offs, _), sel in zip(candidates, self.selectors)]
                offsets, height = candidates[keys.index(min(keys))]
        else:
            offsets, height = dict(self.static_offsets), self.static_arena_bytes or 0
        validate(buffers, offsets, capacity_bytes=height)
        return height, peak_live_bytes(buffers), offsets


def _aligned(expr, alignment: int):
    a = tirx.IntImm("int64", alignment)
    return tvm.sym.Analyzer().simplify(tirx.floordiv(expr + a - tirx.IntImm("int64", 1), a) * a)


def _bound_analyzer(dims: Mapping[str, tirx.Var], ranges: Mapping[str, DimRange]):
    analyzer = tvm.sym.Analyzer()
    for name, var in dims.items():
        r = ranges[name]
        if r.upper is not None:
            analyzer.bind(var, tvm.ir.Range.from_min_extent(
                tirx.IntImm("int64", r.lower), tirx.IntImm("int64", r.upper - r.lower + 1)))
    return analyzer


class _ExpressionTooLarge(Exception):
    pass


_PROOF_BUDGET = 64  # can_prove calls per max() built
_PROOF_MAX_CHARS = 1500


def _max_of(exprs, analyzer, probes):
    """``max(0, *exprs)``, dropping terms provably no larger than a kept one.

    ``probes`` are dim values inside the declared ranges: a term larger at any
    probe cannot be dominated, which spares most (slow) ``can_prove`` calls.
    """
    values = {}

    def at(e):
        key = e.__hash__()
        if key not in values:
            values[key] = (e, [evaluate_int(e, p) for p in probes])
        return values[key][1]

    budget = [_PROOF_BUDGET]

    def dominated(e, k):  # provably e <= k everywhere in the ranges? (False when unsure)
        if any(x > y for x, y in zip(at(e), at(k))):
            return False
        if tvm_ffi.structural_equal(e, k):
            return True
        # keeping a term is always safe; proofs on long terms are slow
        if budget[0] <= 0 or len(str(e)) + len(str(k)) > _PROOF_MAX_CHARS:
            return False
        budget[0] -= 1
        return analyzer.can_prove(e <= k)

    kept = []
    for e in sorted(exprs, key=lambda e: -max(at(e), default=0)):
        if any(dominated(e, k) for k in kept):
            continue
        kept = [k for k in kept if not dominated(k, e)] + [e]
    out = tirx.IntImm("int64", 0)
    for e in kept:
        out = e if isinstance(out, tirx.IntImm) and int(out) == 0 else tirx.max(out, e)
    return analyzer.simplify(out)


def _sample_points(ranges: Mapping[str, DimRange], names: Sequence[str], reference: Mapping[str, int],
                   count: int, seed: int) -> List[Dict[str, int]]:
    rng = random.Random(seed)

    def hi(n):
        r = ranges[n]
        return r.upper if r.upper is not None else 4 * max(reference[n], 1)

    points = [{n: max(ranges[n].lower, 1) for n in names}, {n: hi(n) for n in names}]
    for _ in range(count):
        point = {n: rng.randint(max(ranges[n].lower, 1), hi(n)) for n in names}
        if point not in points:
            points.append(point)
    return points


@tvm.transform.module_pass(opt_level=0, name="PlanDynamicMemory")
class PlanDynamicMemory:
    """Plan functions with symbolic tensor sizes into one arena (see the module docstring).

    Parameters
    ----------
    strategy : {"exact", "upper_bound"}
        How sizes that depend on dims are planned.
    alignment_bytes : int
        Offset alignment, a power of two >= 64.
    algorithms : sequence of str, optional
        Planner algorithms for the reference placement (default all).
    time_limit_s : float
        Offset-search budget per function, seconds.
    num_samples : int
        Random shapes (besides the range ends) at which each plan is validated.
    seed : int
        Seed of the sampled shapes.
    max_expr_chars : int
        ``exact``: a function whose offset expressions grow longer than this
        (printed) is left to TVM, with the reason recorded.
    num_references : int
        ``exact``: reference shapes to plan at (range ends first, then random);
        each stacking that gives the smallest arena at some probed shape is
        kept, and the VM picks the smallest per call.

    Attributes
    ----------
    plans : dict of str to DynamicFunctionPlan
        Filled when the pass runs, for every function with symbolic tensors.

    Raises
    ------
    ValueError
        Unknown strategy, alignment not a power of two >= 64, empty or unknown
        algorithms, time limit not > 0.
    TypeError
        An argument of the wrong type.
    """

    def __init__(self, strategy: str = "exact", alignment_bytes: int = 64,
                 algorithms: Optional[Sequence[str]] = None, time_limit_s: float = 1.0,
                 num_samples: int = 6, seed: int = 0, max_expr_chars: int = 20000,
                 num_references: int = 4):
        if strategy not in STRATEGIES:
            raise ValueError(f"unknown strategy '{strategy}'; use one of {STRATEGIES}")
        self.alignment_bytes, self.algorithms, self.time_limit_s = check_planner_args(
            alignment_bytes, algorithms, time_limit_s)
        self.strategy = strategy
        self.num_samples = num_samples
        self.seed = seed
        self.max_expr_chars = max_expr_chars
        self.num_references = num_references
        self.plans: Dict[str, DynamicFunctionPlan] = {}

    # ---- selection ---------------------------------------------------------
    def _select(self, fplan: DynamicFunctionPlan, dims: Mapping[str, tirx.Var]) -> List[TensorLiveness]:
        chosen = []
        for t in fplan.liveness.tensors:
            if t.reason is not None and t.reason != SYMBOLIC_SHAPE:
                fplan.left_to_tvm[t.uid] = t.reason
                continue
            free = {v.name for v in tirx.analysis.undefined_vars(t.size_expr)} if t.size_bytes is None else set()
            inner = sorted(free - set(dims))
            if inner:
                fplan.left_to_tvm[t.uid] = f"size depends on {', '.join(inner)}, defined in the body"
                continue
            unbounded = sorted(n for n in free if fplan.ranges[n].upper is None)
            if self.strategy == "upper_bound" and unbounded:
                fplan.left_to_tvm[t.uid] = f"dim {', '.join(unbounded)} has no upper bound"
                continue
            chosen.append(t)
        return chosen

    # ---- planning ----------------------------------------------------------
    def _plan_function(self, func: relax.Function, name: str, mod) -> Optional[Tuple]:
        liveness = analyze_liveness(mod, name)
        if not any(t.size_bytes is None for t in liveness.tensors):
            return None  # nothing symbolic: PlanStaticMemory's job
        dims = signature_dims(func)
        fplan = DynamicFunctionPlan(name, self.strategy, liveness, declared_ranges(func),
                                    alignment_bytes=self.alignment_bytes)
        self.plans[name] = fplan
        chosen = self._select(fplan, dims)
        groups = {(t.device_index, t.storage_scope) for t in chosen}
        if not chosen or len(groups) != 1:
            fplan.fallback_reason = ("nothing to plan" if not chosen
                                     else "tensors on several devices (not supported yet)")
            return None
        (dev, scope), = groups
        fplan.planned = [t.uid for t in chosen]
        fplan.aligned_size_exprs = {t.uid: _aligned(t.size_expr, self.alignment_bytes) for t in chosen}
        used = sorted({v.name for t in chosen for v in tirx.analysis.undefined_vars(t.size_expr)
                       if t.size_bytes is None})
        reference = {n: (fplan.ranges[n].upper if fplan.ranges[n].upper is not None
                         else max(fplan.ranges[n].lower, 1)) for n in used}

        def buffers_at(sizes):
            return [Buffer(t.uid, t.start, t.end, max(sizes[t.uid], 1), self.alignment_bytes)
                    for t in chosen]

        if self.strategy == "upper_bound":
            analyzer = _bound_analyzer(dims, fplan.ranges)
            ref_sizes = {t.uid: int(analyzer.const_int_bound(fplan.aligned_size_exprs[t.uid]).max_value)
                         for t in chosen}
            result = plan(buffers_at(ref_sizes), algorithms=self.algorithms, time_limit_s=self.time_limit_s)
            fplan.static_offsets = dict(result.offsets)
            fplan.static_arena_bytes = result.height_bytes
        else:
            self._exact_orders(fplan, chosen, used, reference, buffers_at)
        try:
            for dims_at in _sample_points(fplan.ranges, used, reference, self.num_samples, self.seed):
                arena, lb, _ = fplan.bytes_at(dims_at)
                fplan.samples.append({"dims": dims_at, "arena_bytes": arena, "lower_bound_bytes": lb})
        except PlanError as err:  # never expected; keep TVM's behaviour if it happens
            fplan.fallback_reason = f"plan failed validation at a sampled shape: {err}"
            fplan.planned = []
            return None
        return fplan, chosen, dev, scope, dims

    def _exact_orders(self, fplan, chosen, used, reference, buffers_at) -> None:
        """Stackings planned at several reference shapes; keep those best somewhere."""
        refs = [reference, {n: max(fplan.ranges[n].lower, 1) for n in used}]
        refs += [p for p in _sample_points(fplan.ranges, used, reference, self.num_references, self.seed + 1)
                 if p not in refs]
        refs = refs[: max(1, self.num_references)]
        budget = self.time_limit_s / len(refs)
        candidates = []
        for ref in refs:
            sizes = {t.uid: evaluate_int(fplan.aligned_size_exprs[t.uid], ref) for t in chosen}
            ref_buffers = buffers_at(sizes)
            result = plan(ref_buffers, algorithms=self.algorithms, time_limit_s=budget)
            order = stacking_order(ref_buffers, result.offsets)
            if order not in candidates:
                candidates.append(order)
        # keep a stacking only if it gives the smallest arena at one of the probe shapes
        probes = refs + _sample_points(fplan.ranges, used, reference, self.num_samples, self.seed + 2)
        keep = set()
        for dims_at in probes:
            sizes = {b.id: b.size_bytes for b in fplan._buffers_at_ids(dims_at)}
            heights = [stacked_offsets(o, sizes, self.alignment_bytes)[1] for o in candidates]
            keep.add(heights.index(min(heights)))
        fplan.orders = [candidates[k] for k in sorted(keep)]
        # Per stacking, the few tensors whose top is highest at some probe: the max of
        # their tops (a short expression) decides which stacking to use per call.
        fplan.selectors = []
        for order in fplan.orders:
            top_ids = set()
            for dims_at in probes:
                sizes = {b.id: b.size_bytes for b in fplan._buffers_at_ids(dims_at)}
                offs, _ = stacked_offsets(order, sizes, self.alignment_bytes)
                top_ids.add(max(offs, key=lambda u: offs[u] + sizes[u]))
            fplan.selectors.append(tuple(sorted(top_ids)))

    def _rewriter(self, fplan: DynamicFunctionPlan, chosen, dev: int, scope: str, dims) -> ArenaRewriter:
        arena_var = relax.Var("arena_d%d" % dev, relax.ObjectType())
        placement, prologue = {}, []
        if self.strategy == "upper_bound":
            prologue.append(relax.VarBinding(arena_var, alloc_arena(fplan.static_arena_bytes, dev, scope)))
            for t in chosen:
                placement[t.var] = (arena_var, fplan.static_offsets[t.uid], t)
            return ArenaRewriter(prologue, placement)
        analyzer = _bound_analyzer(dims, fplan.ranges)
        probes = [s["dims"] for s in fplan.samples]
        tensors = {t.uid: t for t in chosen}
        layouts = []  # (offsets, height, selector height) per stacking, as expressions
        for order, selector in zip(fplan.orders, fplan.selectors or [()] * len(fplan.orders)):
            offsets, top_of = {}, {}
            for uid, below in order:
                base = _max_of([top_of[c] for c in below], analyzer, probes)
                offsets[uid] = base
                top_of[uid] = analyzer.simplify(base + fplan.aligned_size_exprs[uid])
            height = _max_of(list(top_of.values()), analyzer, probes)
            key = _max_of([top_of[u] for u in selector], analyzer, probes) if selector else height
            layouts.append((offsets, height, key))
        longest = max(len(str(o)) for offs, _, _ in layouts for o in offs.values())
        if len(layouts) > 1 and longest + sum(len(str(k)) for _, _, k in layouts) > self.max_expr_chars:
            raise _ExpressionTooLarge(
                f"choosing among {len(layouts)} stackings needs expressions over "
                f"{self.max_expr_chars} characters (longest offset {longest})")
        # the first stacking with the smallest selector height, decided per call; any
        # choice is valid since every stacking is, and the arena is that stacking's height
        offset_of, height = dict(layouts[-1][0]), layouts[-1][1]
        for k in range(len(layouts) - 2, -1, -1):
            offs_k, h_k, key_k = layouts[k]
            better = None
            for _, _, key in layouts[k + 1:]:
                better = key_k <= key if better is None else tirx.all(better, key_k <= key)
            offset_of = {u: tirx.Select(better, offs_k[u], offset_of[u]) for u in offs_k}
            height = tirx.Select(better, h_k, height)
        # (each part is simplified already; simplifying the Selects is slow)
        offset_of = {u: (int(o) if isinstance(o, tirx.IntImm) else o) for u, o in offset_of.items()}
        too_big = [uid for uid, off in offset_of.items() if len(str(off)) > self.max_expr_chars]
        if too_big:
            raise _ExpressionTooLarge(f"offset expression of {too_big[0]} exceeds "
                                      f"{self.max_expr_chars} characters")
        prologue.append(relax.VarBinding(arena_var, alloc_arena(height, dev, scope)))
        for uid, offset in offset_of.items():
            placement[tensors[uid].var] = (arena_var, offset, tensors[uid])
        return ArenaRewriter(prologue, placement)

    def transform_module(self, mod: tvm.IRModule, _ctx) -> tvm.IRModule:
        updates = {}
        for gv, func in mod.functions_items():
            if not isinstance(func, relax.Function) or not isinstance(func.body, relax.SeqExpr):
                continue
            planned = self._plan_function(func, gv.name_hint, mod)
            if planned is None:
                continue
            fplan, chosen, dev, scope, dims = planned
            rewriter = None
            while rewriter is None:
                try:
                    rewriter = self._rewriter(fplan, chosen, dev, scope, dims)
                except _ExpressionTooLarge as err:
                    if len(fplan.orders) > 1:
                        # fewer stackings to choose from: smaller expressions
                        fplan.orders, fplan.selectors = fplan.orders[:1], fplan.selectors[:1]
                        fplan.notes.append(f"{err}; kept only the first reference stacking")
                        continue
                    fplan.fallback_reason = f"{err}; left to TVM"
                    fplan.planned, fplan.orders = [], []
                    break
            if rewriter is None:
                continue
            if fplan.notes:  # samples were measured with all stackings: measure again
                fplan.samples = [dict(s, arena_bytes=fplan.bytes_at(s["dims"])[0]) for s in fplan.samples]
            new_func = rewriter.rewrite_function(func)
            updates[gv] = new_func.with_attrs({"relax_memplan.strategy": self.strategy})
        if not updates:
            return mod
        new_mod = tvm.IRModule(dict(mod.functions_items()), attrs=mod.attrs)
        for gv, func in updates.items():
            new_mod[gv] = func
        return relax.transform.Normalize()(new_mod)
