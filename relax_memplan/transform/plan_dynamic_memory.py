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
    Then the ratio target is checked (arena / lower bound <= ``max_ratio``) at
    **every** shape of the declared ranges when there are at most
    ``max_enumerated_shapes`` of them (else at ``check_samples`` random
    shapes); each shape above it is *pinned*: planned on its own, with constant
    offsets chosen by ``Select`` on the dims (at most ``max_pinned``, the most
    wasteful first). The VM computes all of it per call (``VMShapeLower``), so
    the arena is sized for the actual shape and is valid at every shape.
``buckets``
    As ``exact``, plus one piece per declared bucket value (``buckets={"seq":
    [64, 128]}``): at ``seq == 64`` the stackings planned at seq 64 are used
    (the other dims stay symbolic), elsewhere the generic exact plan.

In-place reuse
--------------
With ``inplace=True`` (``exact``/``buckets``), a kernel call may write its output over an
input that dies there, by the rules of :mod:`relax_memplan.analysis.liveness` (the
kernel's TIR reads the input at the output's indices only; the input has no other live
alias) with the two byte sizes equal *as expressions* (``tvm.sym.Analyzer`` proves the
byte-size PrimExprs equal; sizes equal only at some shapes are refused). Each such group
is one arena buffer live over the group's span (fewer tensors in the symbolic-offset
plan); every tensor of the group gets its offset and the call goes to the kernel's
in-place variant (``PrimFunc.specialize``). Each shape the plan is validated at is checked
with every tensor on its own live range and exactly these groups allowed to overlap.
Binding order is not changed for symbolic sizes (``ReorderForMemory`` leaves such blocks).

Size classes (a bounded policy for TVM's pooled allocator)
---------------------------------------------------------
The pooled VM allocator caches freed buffers by exact size and never shrinks,
so an exact arena (a new size for nearly every shape) grows it without bound.
With ``size_classes=True`` every bounded dim is rounded up to a geometric class
(``upper``, ``upper / size_class_growth``, ..., down to ``lower``); the arena is
allocated at the largest height over the dims' class cell (a constant per cell,
chosen by ``Select``; ``max`` with the actual height for safety) and each
symbolic function output gets its own storage of its size at the cell's corner.
The pool then keeps at most one arena and one storage per output per cell.
Offsets stay exact.

Only dims defined by the function's parameters are used; a tensor whose size
depends on a var defined inside the body (data-dependent shapes) is left to
TVM. Before the plan is used it is checked with the planner's validator at the
ends of the declared ranges, at sampled shapes and at every pinned shape; if
that ever fails the function is left to TVM and the reason recorded (never a
silently wrong plan).
"""

from __future__ import annotations

import itertools
from typing import Dict, List, Mapping, Optional, Sequence, Tuple

import tvm
from tvm import relax, tirx

from ..analysis.dims import DimRange, declared_ranges, signature_dims
from ..analysis.inplace import kernel_table
from ..analysis.liveness import SYMBOLIC_SHAPE, TensorLiveness, analyze_liveness
from ..planner import Buffer, PlanError, peak_live_bytes, plan, stacked_offsets, stacking_order
from ._arena_rewrite import ArenaRewriter, alloc_arena
from ._module_util import replace_functions
from ._args import check_buckets, check_planner_args
from ._dynamic_exprs import ExpressionTooLarge, aligned, bound_analyzer, plan_exprs
from ._dynamic_plan import DynamicFunctionPlan, Piece, count_points, range_points, sample_points
from ._inplace_plan import inplace_variant_calls
from ._size_classes import class_arena, output_storages

__all__ = ["PlanDynamicMemory", "DynamicFunctionPlan", "Piece", "STRATEGIES"]

STRATEGIES = ("upper_bound", "exact", "buckets")


@tvm.transform.module_pass(opt_level=0, name="PlanDynamicMemory")
class PlanDynamicMemory:
    """Plan functions with symbolic tensor sizes into one arena (see the module docstring).

    Parameters
    ----------
    strategy : {"exact", "upper_bound", "buckets"}
        How sizes that depend on dims are planned.
    alignment_bytes : int
        Offset alignment, a power of two >= 64.
    algorithms : sequence of str, optional
        Planner algorithms for the reference placements (default all).
    time_limit_s : float
        Offset-search budget per function and piece, seconds.
    num_samples : int
        Random shapes (besides the range ends) at which each plan is validated.
    seed : int
        Seed of the sampled shapes.
    max_expr_chars : int
        ``exact``/``buckets``: a function whose offset expressions grow longer
        than this (printed) is left to TVM, with the reason recorded.
    num_references : int
        ``exact``/``buckets``: reference shapes to plan at (range ends first, then
        random); each stacking that gives the smallest arena at some probed shape
        is kept, and the VM picks the smallest per call.
    buckets : mapping of str to sequence of int, optional
        ``buckets``: dim name -> bucket values (each inside the dim's declared
        range; values outside are skipped with a note).
    max_ratio : float
        ``exact``/``buckets``: shapes whose arena exceeds this times their lower
        bound are pinned (planned on their own).
    max_enumerated_shapes : int
        Check the ratio at every shape when the declared ranges hold at most
        this many; otherwise at ``check_samples`` random shapes.
    check_samples : int
    max_pinned : int
        At most this many pinned shapes per function (the most wasteful first).
    size_classes : bool
        Round the arena and symbolic output storages up to geometric size classes
        (a bounded policy for the pooled VM allocator).
    size_class_growth : float
        Ratio between consecutive class values of a dim (> 1). Larger: fewer
        classes, so fewer cached sizes, but a call may allocate up to about this
        factor x its exact arena (never more than the ``upper_bound`` arena).
    inplace : bool
        ``exact``/``buckets``: let a kernel write its output over an input that dies
        there when its TIR allows it (:mod:`relax_memplan.analysis.inplace`) and the two
        byte sizes are equal as expressions (``tvm.sym.Analyzer`` proves it; sizes equal
        only at some shapes are refused). The two tensors become one arena buffer, live
        over both ranges; the call goes to the kernel's in-place variant
        (``<kernel>_inplace_o<k>_i<j>``, a new PrimFunc). Ignored by ``upper_bound``.

    Attributes
    ----------
    plans : dict of str to DynamicFunctionPlan
        Filled when the pass runs, for every function with symbolic tensors.

    Raises
    ------
    ValueError
        Unknown strategy, alignment not a power of two >= 64, empty or unknown
        algorithms, time limit not > 0, ``buckets`` strategy without buckets or
        with a bucket value < 1, ``max_ratio < 1``, ``size_class_growth <= 1``.
    TypeError
        An argument of the wrong type.
    """

    def __init__(self, strategy: str = "exact", alignment_bytes: int = 64,
                 algorithms: Optional[Sequence[str]] = None, time_limit_s: float = 1.0,
                 num_samples: int = 6, seed: int = 0, max_expr_chars: int = 20000,
                 num_references: int = 8, buckets: Optional[Mapping[str, Sequence[int]]] = None,
                 max_ratio: float = 1.02, max_enumerated_shapes: int = 4096, check_samples: int = 64,
                 max_pinned: int = 64, size_classes: bool = False, size_class_growth: float = 4.0,
                 inplace: bool = False):
        if strategy not in STRATEGIES:
            raise ValueError(f"unknown strategy '{strategy}'; use one of {STRATEGIES}")
        self.alignment_bytes, self.algorithms, self.time_limit_s = check_planner_args(
            alignment_bytes, algorithms, time_limit_s)
        self.buckets = _check_buckets(strategy, buckets)
        if not max_ratio >= 1.0:
            raise ValueError(f"max_ratio must be >= 1, got {max_ratio}")
        if not size_class_growth > 1.0:
            raise ValueError(f"size_class_growth must be > 1, got {size_class_growth}")
        self.strategy = strategy
        self.num_samples = num_samples
        self.seed = seed
        self.max_expr_chars = max_expr_chars
        self.num_references = num_references
        self.max_ratio = float(max_ratio)
        self.max_enumerated_shapes = max_enumerated_shapes
        self.check_samples = check_samples
        self.max_pinned = max_pinned
        self.size_classes = bool(size_classes)
        self.size_class_growth = float(size_class_growth)
        if not isinstance(inplace, bool):
            raise TypeError(f"inplace must be a bool, got {type(inplace).__name__}")
        self.inplace = inplace
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
    def _share(self, fplan: DynamicFunctionPlan, chosen) -> None:
        """Keep the in-place uses whose two tensors are both placed here: their groups
        become one arena buffer (the first tensor's uid), the others go to ``shared``."""
        uids = {t.uid for t in chosen}
        fplan.inplace = [u for u in fplan.liveness.inplace if u.in_uid in uids and u.out_uid in uids]
        fplan.sharing = fplan.liveness.sharing_groups(fplan.inplace)
        fplan.shared = {u: group[0] for group in fplan.sharing for u in group[1:]}
        fplan.planned = [u for u in fplan.planned if u not in fplan.shared]

    def _plan_function(self, func: relax.Function, name: str, mod, table=None) -> Optional[Tuple]:
        liveness = analyze_liveness(mod, name, table)
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
        if table is not None and self.strategy != "upper_bound":
            self._share(fplan, chosen)
        fplan.aligned_size_exprs = {t.uid: aligned(t.size_expr, self.alignment_bytes) for t in chosen}
        used = sorted({v.name for t in chosen for v in tirx.analysis.undefined_vars(t.size_expr)
                       if t.size_bytes is None})
        fplan.used_dims = used
        reference = {n: (fplan.ranges[n].upper if fplan.ranges[n].upper is not None
                         else max(fplan.ranges[n].lower, 1)) for n in used}
        self._reference = reference

        if self.strategy == "upper_bound":
            analyzer = bound_analyzer(dims, fplan.ranges)
            ref_sizes = {u: int(analyzer.const_int_bound(e).max_value)
                         for u, e in fplan.aligned_size_exprs.items()}
            result = plan(self._buffers(chosen, ref_sizes), algorithms=self.algorithms,
                          time_limit_s=self.time_limit_s)
            fplan.static_offsets = dict(result.offsets)
            fplan.static_arena_bytes = result.height_bytes
        else:
            fplan.pieces = self._bucket_pieces(fplan, chosen, used, reference)
            fplan.pieces.append(Piece("generic", {}, *self._exact_orders(
                fplan, chosen, used, fplan.ranges, reference)))
            self._pin_shapes(fplan, used, reference)
        try:
            for dims_at in sample_points(fplan.ranges, used, reference, self.num_samples, self.seed):
                arena, lb, _ = fplan.bytes_at(dims_at)
                fplan.samples.append({"dims": dims_at, "arena_bytes": arena, "lower_bound_bytes": lb})
            for piece in fplan.pieces[:-1]:
                if piece.kind == "pinned":
                    fplan.bytes_at(piece.when)
        except PlanError as err:  # never expected; keep TVM's behaviour if it happens
            fplan.fallback_reason = f"plan failed validation at a sampled shape: {err}"
            fplan.planned, fplan.shared, fplan.sharing, fplan.inplace = [], {}, [], []
            return None
        return fplan, chosen, dev, scope, dims

    def _buffers(self, chosen, sizes) -> List[Buffer]:
        return [Buffer(t.uid, t.start, t.end, max(sizes[t.uid], 1), self.alignment_bytes) for t in chosen]

    def _bucket_pieces(self, fplan, chosen, used, reference) -> List[Piece]:
        names = [n for n in sorted(self.buckets) if n in used]
        for n in sorted(set(self.buckets) - set(used)):
            fplan.notes.append(f"bucket dim '{n}': no planned size of {fplan.name} depends on it")
        values = {}
        for n in names:
            inside = [v for v in self.buckets[n] if v in fplan.ranges[n]]
            skipped = sorted(set(self.buckets[n]) - set(inside))
            if skipped:
                fplan.notes.append(f"bucket values {skipped} of '{n}' are outside its declared "
                                   f"range {fplan.ranges[n]}: skipped")
            values[n] = inside
        pieces = []
        for combo in itertools.product(*(values[n] for n in names)):
            when = dict(zip(names, combo))
            if not when:
                continue
            ranges = dict(fplan.ranges, **{n: DimRange(v, v) for n, v in when.items()})
            pieces.append(Piece("bucket", when, *self._exact_orders(
                fplan, chosen, used, ranges, dict(reference, **when))))
        return pieces

    def _exact_orders(self, fplan, chosen, used, ranges, reference):
        """Stackings planned at several reference shapes; keep those best somewhere."""
        refs = [reference, {n: max(ranges[n].lower, 1) for n in used}]
        refs += [p for p in sample_points(ranges, used, reference, self.num_references, self.seed + 1)
                 if p not in refs]
        refs = refs[: max(1, self.num_references)]
        budget = self.time_limit_s / len(refs)
        probes = refs + sample_points(ranges, used, reference, self.num_samples, self.seed + 2)
        candidates = []
        for ref in refs:
            ref_buffers = fplan.buffers_at(ref)
            result = plan(ref_buffers, algorithms=self.algorithms, time_limit_s=budget)
            order = stacking_order(ref_buffers, result.offsets)
            if order not in candidates:
                candidates.append(order)
        orders = self._best_orders(fplan, candidates, self._check_points(ranges, used, reference)[0])
        if len(orders) == 1:
            return orders, [()]
        # Per stacking, the few tensors whose top is highest at some probe: the max of
        # their tops (a short expression) decides which stacking to use per call.
        selectors = []
        for order in orders:
            top_ids = set()
            for dims_at in probes:
                sizes = fplan.sizes_at(dims_at)
                offs, _ = stacked_offsets(order, sizes, self.alignment_bytes)
                top_ids.add(max(offs, key=lambda u: offs[u] + sizes[u]))
            selectors.append(tuple(sorted(top_ids)))
        return orders, selectors

    def _check_points(self, ranges, used, reference):
        """Every shape in ``ranges`` when few enough, else random ones; and whether it was every one."""
        total = count_points(ranges, used)
        if total is not None and total <= self.max_enumerated_shapes:
            return list(range_points(ranges, used)), True
        return sample_points(ranges, used, reference, self.check_samples, self.seed + 3), False

    def _best_orders(self, fplan, candidates, points) -> List:
        """Stackings to keep, best first: the one with the fewest shapes above ``max_ratio``
        (then the lowest total height), then any that lowers that count when chosen per call."""
        lbs = [peak_live_bytes(fplan.buffers_at(p)) for p in points]
        sizes = [fplan.sizes_at(p) for p in points]
        heights = [[stacked_offsets(o, sz, self.alignment_bytes)[1] for sz in sizes] for o in candidates]

        def score(rows):
            best = [min(col) for col in zip(*rows)]
            return sum(h > self.max_ratio * lb for h, lb in zip(best, lbs)), sum(best)

        kept = [min(range(len(candidates)), key=lambda k: score([heights[k]]))]
        while len(kept) < len(candidates):
            current = score([heights[k] for k in kept])
            if current[0] == 0:
                break
            k = min((k for k in range(len(candidates)) if k not in kept),
                    key=lambda k: score([heights[j] for j in kept + [k]]))
            if score([heights[j] for j in kept + [k]])[0] >= current[0]:
                break
            kept.append(k)
        return [candidates[k] for k in kept]

    def _pin_shapes(self, fplan: DynamicFunctionPlan, used, reference) -> None:
        """Plan on its own every checked shape whose arena is above ``max_ratio`` x its lower bound."""
        points, enumerated = self._check_points(fplan.ranges, used, reference)
        measured = [(p, *fplan.ratio_at(p)) for p in points]
        bad = sorted((m for m in measured if m[1] > self.max_ratio * m[2]), key=lambda m: m[2] - m[1])
        budget = min(0.05, self.time_limit_s)
        pins = []
        for p, height, _lb in bad[: self.max_pinned]:
            buffers = fplan.buffers_at(p)
            result = plan(buffers, algorithms=self.algorithms, time_limit_s=budget, search=False)
            if result.height_bytes < height:
                pins.append(Piece("pinned", dict(p), [stacking_order(buffers, result.offsets)], [()]))
        if len(bad) > self.max_pinned:
            fplan.notes.append(f"{len(bad)} shapes above {self.max_ratio} x the lower bound; "
                               f"pinned the {self.max_pinned} most wasteful")
        fplan.pieces = pins + fplan.pieces
        self._record_check(fplan, points, enumerated, measured)

    def _record_check(self, fplan, points, enumerated, measured=None) -> None:
        """Worst ratio over ``points`` (and their heights, kept when they are every shape).

        ``measured``: ``(point, height, lower bound)`` from before pinning; only the
        pinned points changed since, so only they are measured again.
        """
        pinned = [p.when for p in fplan.pieces if p.kind == "pinned"]
        known = measured if measured is not None else [(p, None, None) for p in points]
        worst, heights = 1.0, {}
        for p, height, lb in known:
            if height is None or p in pinned:
                height, lb = fplan.ratio_at(p)
            heights[tuple(p[n] for n in fplan.used_dims)] = height
            worst = max(worst, height / lb if lb else 1.0)
        fplan.checked = {"shapes": len(points), "enumerated": enumerated, "max_ratio": round(worst, 4),
                         "pinned": sum(p.kind == "pinned" for p in fplan.pieces)}
        self._heights = heights if enumerated else None

    def _rewriter(self, fplan: DynamicFunctionPlan, chosen, dev: int, scope: str, dims,
                  calls=None) -> ArenaRewriter:
        arena_var = relax.Var("arena_d%d" % dev, relax.ObjectType())
        placement, prologue = {}, []
        if self.strategy == "upper_bound":
            prologue.append(relax.VarBinding(arena_var, alloc_arena(fplan.static_arena_bytes, dev, scope)))
            for t in chosen:
                placement[t.var] = (arena_var, fplan.static_offsets[t.uid], t)
        else:
            offset_of, height = plan_exprs(fplan, dims, self.max_expr_chars, self.max_enumerated_shapes)
            if self.size_classes:
                height = class_arena(fplan, dims, height, self.size_class_growth, self._heights)
            prologue.append(relax.VarBinding(arena_var, alloc_arena(height, dev, scope)))
            tensors = {t.uid: t for t in chosen}
            for uid, offset in fplan.with_shared(offset_of).items():
                placement[tensors[uid].var] = (arena_var, offset, tensors[uid])
        if self.size_classes:
            for t, storage, nbytes in output_storages(fplan, dims, dev, scope, self.size_class_growth):
                prologue.append(relax.VarBinding(storage, alloc_arena(nbytes, dev, scope)))
                placement[t.var] = (storage, 0, t)
        return ArenaRewriter(prologue, placement, calls)

    def _degrade(self, fplan: DynamicFunctionPlan, err: Exception) -> bool:
        """Make the expressions smaller after ``err``; False when nothing is left to drop."""
        pins = [p for p in fplan.pieces if p.kind == "pinned"]
        generic = fplan.generic
        if len(generic.orders) > 1:
            generic.orders, generic.selectors = generic.orders[:1], [()]
            fplan.notes.append(f"{err}; kept only the first reference stacking")
            fplan.pieces = [p for p in fplan.pieces if p.kind != "pinned"]
            self._pin_shapes(fplan, fplan.used_dims, self._reference)  # ratios changed
            return True
        if pins:
            keep = pins[: len(pins) // 2]
            fplan.pieces = keep + [p for p in fplan.pieces if p.kind != "pinned"]
            fplan.notes.append(f"{err}; kept {len(keep)} of {len(pins)} pinned shapes")
            self._record_check(fplan, *self._check_points(fplan.ranges, fplan.used_dims, self._reference))
            return True
        return False

    def transform_module(self, mod: tvm.IRModule, _ctx) -> tvm.IRModule:
        updates, kernels = {}, {}
        table = kernel_table(mod) if self.inplace and self.strategy != "upper_bound" else None
        builder = relax.BlockBuilder(mod)
        for gv, func in mod.functions_items():
            if not isinstance(func, relax.Function) or not isinstance(func.body, relax.SeqExpr):
                continue
            self._heights, self._reference = None, {}
            planned = self._plan_function(func, gv.name_hint, mod, table)
            if planned is None:
                continue
            fplan, chosen, dev, scope, dims = planned
            calls = inplace_variant_calls(mod, fplan.inplace, kernels, builder)
            rewriter, degraded = None, False
            while rewriter is None:
                try:
                    rewriter = self._rewriter(fplan, chosen, dev, scope, dims, calls)
                except ExpressionTooLarge as err:
                    degraded = self._degrade(fplan, err)
                    if not degraded:
                        fplan.fallback_reason = f"{err}; left to TVM"
                        fplan.planned, fplan.pieces = [], []
                        fplan.shared, fplan.sharing, fplan.inplace = {}, [], []
                        break
            if rewriter is None:
                continue
            if degraded or fplan.class_arena_bytes:  # measured before the change: measure again
                fplan.samples = [dict(s, arena_bytes=fplan.bytes_at(s["dims"])[0]) for s in fplan.samples]
            new_func = rewriter.rewrite_function(func)
            updates[gv] = new_func.with_attrs({"relax_memplan.strategy": self.strategy})
        if not updates:
            return mod
        if kernels:
            mod = builder.get()
        return relax.transform.Normalize()(replace_functions(mod, updates))


def _check_buckets(strategy: str, buckets) -> Dict[str, Tuple[int, ...]]:
    if buckets is None:
        if strategy == "buckets":
            raise ValueError("strategy 'buckets' needs buckets, e.g. {'seq': [64, 128]}")
        return {}
    return {name: tuple(sorted(values)) for name, values in check_buckets(buckets).items()}
