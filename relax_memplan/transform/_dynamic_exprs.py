"""PrimExprs of a dynamic plan: offsets, arena size and size classes as functions of the dims.

Private helper of :class:`PlanDynamicMemory`. Offsets are written in the
signature's dims only (TVM 0.27's ``VMShapeLower`` cannot load an
``alloc_tensor`` offset bound to a var defined by ``match_cast``), so every
expression is built in full; ``max`` terms provably dominated over the declared
ranges are dropped to keep them short.
"""

from __future__ import annotations

from typing import Dict, List, Mapping, Sequence, Tuple

import tvm
import tvm_ffi
from tvm import tirx

from ..analysis.dims import DimRange, int_evaluator
from ..planner import stacked_offsets
from ._dynamic_plan import DynamicFunctionPlan, Piece, count_points, range_points

__all__ = ["aligned", "bound_analyzer", "max_of", "plan_exprs", "class_select", "ExpressionTooLarge"]

_PROOF_BUDGET = 64  # can_prove calls per max() built
_PROOF_MAX_CHARS = 1500


class ExpressionTooLarge(Exception):
    """An offset expression would exceed the pass's ``max_expr_chars``."""


def _i64(v: int):
    return tirx.IntImm("int64", int(v))


def aligned(expr, alignment: int):
    """``expr`` rounded up to a multiple of ``alignment`` (simplified)."""
    return tvm.sym.Analyzer().simplify(tirx.floordiv(expr + _i64(alignment - 1), _i64(alignment)) * _i64(alignment))


def bound_analyzer(dims: Mapping[str, tirx.Var], ranges: Mapping[str, DimRange]):
    """An analyzer knowing the declared (bounded) ranges of ``dims``."""
    analyzer = tvm.sym.Analyzer()
    for name, var in dims.items():
        r = ranges[name]
        if r.upper is not None:
            analyzer.bind(var, tvm.ir.Range.from_min_extent(_i64(r.lower), _i64(r.upper - r.lower + 1)))
    return analyzer


def max_of(exprs, analyzer, probes, exhaustive: bool = False):
    """``max(0, *exprs)``, dropping terms provably no larger than a kept one.

    ``probes`` are dim values inside the declared ranges: a term larger at any
    probe cannot be dominated, which spares most (slow) ``can_prove`` calls.
    With ``exhaustive=True`` the probes are *every* shape of the declared
    ranges (which the run-time range check enforces), so a term no larger at
    every probe is dominated: no proof is needed.
    """
    values = {}

    def at(e):
        key = e.__hash__()
        if key not in values:
            f = int_evaluator(e)
            values[key] = (e, [f(p) for p in probes])
        return values[key][1]

    budget = [_PROOF_BUDGET]

    def dominated(e, k):  # provably e <= k everywhere in the ranges? (False when unsure)
        if any(x > y for x, y in zip(at(e), at(k))):
            return False
        if exhaustive or tvm_ffi.structural_equal(e, k):
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
    out = _i64(0)
    for e in kept:
        out = e if isinstance(out, tirx.IntImm) and int(out) == 0 else tirx.max(out, e)
    return analyzer.simplify(out)


def _when(piece: Piece, dims: Mapping[str, tirx.Var]):
    cond = None
    for name, value in sorted(piece.when.items()):
        eq = dims[name] == _i64(value)
        cond = eq if cond is None else tirx.all(cond, eq)
    return cond


def _piece_exprs(fplan: DynamicFunctionPlan, piece: Piece, dims, probes, max_enumerated: int) -> Tuple[Dict, object]:
    """Offsets and height of one piece as expressions (constants for a pinned shape)."""
    if piece.kind == "pinned":
        offsets, height = piece.layout(fplan.sizes_at(piece.when), fplan.alignment_bytes)
        return {u: _i64(o) for u, o in offsets.items()}, _i64(height)
    analyzer = bound_analyzer({n: v for n, v in dims.items() if n not in piece.when}, fplan.ranges)
    for name, value in piece.when.items():
        analyzer.bind(dims[name], _i64(value))  # simplify() substitutes the fixed dims
    sizes = {u: analyzer.simplify(e) if piece.when else e for u, e in fplan.aligned_size_exprs.items()}
    ranges = dict(fplan.ranges, **{n: DimRange(v, v) for n, v in piece.when.items()})
    names = fplan.used_dims
    total = count_points(ranges, names)
    exhaustive = total is not None and total <= max_enumerated
    if exhaustive:  # every shape the range check lets through
        probes = list(range_points(ranges, names))
    else:
        probes = [p for p in probes if piece.matches(p)] or [dict(probes[0], **piece.when)]
    layouts = []  # (offsets, height, selector height) per stacking
    for order, selector in zip(piece.orders, piece.selectors or [()] * len(piece.orders)):
        offsets, top_of = {}, {}
        for uid, below in order:
            base = max_of([top_of[c] for c in below], analyzer, probes, exhaustive)
            offsets[uid] = base
            top_of[uid] = analyzer.simplify(base + sizes[uid])
        height = max_of(list(top_of.values()), analyzer, probes, exhaustive)
        key = max_of([top_of[u] for u in selector], analyzer, probes, exhaustive) if selector else height
        layouts.append((offsets, height, key))
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
    return offset_of, height


def plan_exprs(fplan: DynamicFunctionPlan, dims: Mapping[str, tirx.Var], max_expr_chars: int,
               max_enumerated: int = 4096):
    """Offsets (uid -> int or PrimExpr) and arena height (PrimExpr) of the whole plan.

    Pieces are chosen in order by ``Select`` on their fixed dims (the generic
    piece last, unconditionally).

    Raises
    ------
    ExpressionTooLarge
        If the generic piece chooses among several stackings and that makes the
        expressions longer than ``max_expr_chars``, or any offset is longer.
    """
    probes = [s["dims"] for s in fplan.samples] or [
        {n: max(r.lower, 1) for n, r in fplan.ranges.items()}]
    generic_offsets, height = _piece_exprs(fplan, fplan.generic, dims, probes, max_enumerated)
    longest = max((len(str(o)) for o in generic_offsets.values()), default=0)
    if len(fplan.generic.orders) > 1 and longest > max_expr_chars:
        raise ExpressionTooLarge(
            f"choosing among {len(fplan.generic.orders)} stackings needs expressions over "
            f"{max_expr_chars} characters (longest offset {longest})")
    offset_of = dict(generic_offsets)
    for piece in reversed(fplan.pieces[:-1]):
        offs, h = _piece_exprs(fplan, piece, dims, probes, max_enumerated)
        cond = _when(piece, dims)
        offset_of = {u: tirx.Select(cond, offs[u], offset_of[u]) for u in offs}
        height = tirx.Select(cond, h, height)
    offset_of = {u: (int(o) if isinstance(o, tirx.IntImm) else o) for u, o in offset_of.items()}
    too_big = [uid for uid, off in offset_of.items() if len(str(off)) > max_expr_chars]
    if too_big:
        raise ExpressionTooLarge(f"offset expression of {too_big[0]} exceeds {max_expr_chars} characters")
    return offset_of, height


def class_select(names: Sequence[str], class_values: Mapping[str, List[int]],
                 table: Mapping[Tuple[int, ...], int], dims: Mapping[str, tirx.Var]):
    """``Select`` over the class cells of ``names``: the table's bytes for the dims' cell."""

    def build(k: int, prefix: Tuple[int, ...]):
        if k == len(names):
            return _i64(table[prefix])
        values = class_values[names[k]]
        out = build(k + 1, prefix + (values[-1],))
        for v in reversed(values[:-1]):
            out = tirx.Select(dims[names[k]] <= _i64(v), build(k + 1, prefix + (v,)), out)
        return out

    return build(0, ())


def layout_heights(fplan: DynamicFunctionPlan, dims_at: Mapping[str, int]) -> int:
    """Largest height of any stacking of any piece at ``dims_at`` (a bound for smaller dims)."""
    sizes = fplan.sizes_at(dims_at)
    return max(stacked_offsets(order, sizes, fplan.alignment_bytes)[1]
               for piece in fplan.pieces for order in piece.orders)
