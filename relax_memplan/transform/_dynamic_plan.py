"""What :class:`PlanDynamicMemory` decided for one function, evaluated at concrete dims.

Private helper of the pass: the plan is a list of *pieces* tried in order at
run time (pinned shapes, bucket values, then the generic piece), each a set of
stackings (:func:`relax_memplan.planner.stacking_order`), plus optional
geometric *size classes* that round the arena and output storages up so a
caching allocator keeps few distinct sizes. Everything here is plain Python on
integers; the pass turns the same decisions into PrimExprs for the VM, and
:meth:`DynamicFunctionPlan.bytes_at` mirrors what the VM computes per call.
"""

from __future__ import annotations

import itertools
import math
import numbers
import random
from dataclasses import dataclass, field
from typing import Dict, Iterator, List, Mapping, Optional, Sequence, Tuple

from ..analysis.dims import DimRange, int_evaluator
from ..analysis.liveness import FunctionLiveness, InplaceUse
from ..planner import Buffer, peak_live_bytes, stacked_offsets, validate
from ._inplace_plan import merged_buffers, nesting_from_groups

__all__ = ["Piece", "DynamicFunctionPlan", "size_class_values", "range_points", "sample_points"]

Order = List[Tuple[str, Tuple[str, ...]]]


@dataclass
class Piece:
    """One part of a dynamic plan, used when the dims equal ``when``.

    Attributes
    ----------
    kind : {"pinned", "bucket", "generic"}
        ``pinned``: one shape whose generic layout was above the ratio target,
        planned on its own (constant offsets); ``bucket``: a declared bucket
        value (the other dims stay symbolic); ``generic``: every other shape.
    when : dict of str to int
        Dims fixed in this piece (empty for the generic piece).
    orders : list of stacking orders
        At run time the first order whose selector tensors end lowest is used.
    selectors : list of tuple of str
        Per order, the tensors whose tops decide the choice (empty with one order).
    """

    kind: str
    when: Dict[str, int]
    orders: List[Order]
    selectors: List[Tuple[str, ...]] = field(default_factory=list)

    def matches(self, dims: Mapping[str, int]) -> bool:
        return all(dims[k] == v for k, v in self.when.items())

    def layout(self, sizes: Mapping[str, int], alignment_bytes: int) -> Tuple[Dict[str, int], int]:
        """Offsets and height at concrete (aligned) sizes, chosen as the VM chooses."""
        candidates = [stacked_offsets(order, sizes, alignment_bytes) for order in self.orders]
        if len(candidates) == 1:
            return candidates[0]
        keys = [max(offs[u] + sizes[u] for u in sel) for (offs, _), sel in zip(candidates, self.selectors)]
        return candidates[keys.index(min(keys))]


def size_class_values(r: DimRange, growth: float) -> List[int]:
    """Class values of one dim: ``upper``, ``upper / growth``, ... (floored), down to ``lower``.

    Anchored at the upper bound, so the largest class is the bound itself and the
    classes below it shrink geometrically: the bytes a caching allocator keeps for
    one buffer per class stay within ``growth / (growth - 1)`` x the largest one
    (for sizes linear in the dim). A dim value ``d`` belongs to the smallest
    class value ``>= d``.
    """
    lowest = max(r.lower, 1)
    values = [r.upper]
    while values[-1] > lowest:
        below = max(lowest, min(values[-1] - 1, math.floor(values[-1] / growth)))
        below = r.lower + (below - r.lower) // r.step * r.step  # onto the declared grid
        values.append(max(below, r.values()[0]))
    return sorted(set(values))


def class_of(values: Sequence[int], d: int) -> int:
    """The smallest class value ``>= d``."""
    for v in values:
        if d <= v:
            return v
    raise ValueError(f"dim value {d} is above the last class value {values[-1]}")


def range_points(ranges: Mapping[str, DimRange], names: Sequence[str]) -> Iterator[Dict[str, int]]:
    """Every shape in the declared (bounded) ranges of ``names``."""
    axes = [ranges[n].values() for n in names]
    for values in itertools.product(*axes):
        yield dict(zip(names, values))


def count_points(ranges: Mapping[str, DimRange], names: Sequence[str]) -> Optional[int]:
    """Number of shapes in the ranges, ``None`` if a range is unbounded."""
    if any(ranges[n].upper is None for n in names):
        return None
    return math.prod(len(ranges[n].values()) for n in names)


def sample_points(ranges: Mapping[str, DimRange], names: Sequence[str], reference: Mapping[str, int],
                  count: int, seed: int) -> List[Dict[str, int]]:
    """The range ends, then ``count`` random shapes (an unbounded dim is drawn up to 4x its reference)."""
    rng = random.Random(seed)

    def grid(n):
        r = ranges[n]
        hi = r.upper if r.upper is not None else 4 * max(reference[n], 1)
        return range(r.values()[0] if r.upper is not None else max(r.lower, 1), hi + 1, r.step)

    axes = {n: grid(n) for n in names}
    points = [{n: axes[n][0] for n in names}, {n: axes[n][-1] for n in names}]
    for _ in range(count):
        point = {n: rng.choice(axes[n]) for n in names}
        if point not in points:
            points.append(point)
    return points


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
    pieces : list of Piece
        ``exact``/``buckets``: tried in order per call (pinned shapes, buckets,
        generic last).
    static_offsets : dict of str to int
        ``upper_bound``: the constant offsets.
    static_arena_bytes : int or None
        ``upper_bound``: the constant arena size.
    alignment_bytes : int
    used_dims : list of str
        Dims the planned sizes depend on.
    class_values : dict of str to list of int
        With size classes: the class values of each used dim.
    class_arena_bytes : dict of tuple to int
        With size classes: arena bytes allocated for each class cell (one value
        per used dim, in ``used_dims`` order).
    output_class_bytes : dict of str to dict of tuple to int
        With size classes: per output tensor uid, its storage bytes per cell.
    samples : list of dict
        Shapes the plan was validated at: ``{"dims", "arena_bytes", "lower_bound_bytes"}``.
    checked : dict
        ``{"shapes", "enumerated", "max_ratio", "pinned"}``: how many shapes the
        ratio target was checked at, whether that was every shape in range, the
        worst arena / lower bound seen, and how many shapes were pinned.
    fallback_reason : str or None
        Set when the function was left to TVM entirely.
    notes : list of str
        Degradations, e.g. fewer stackings kept because expressions grew too long.
    inplace : list of InplaceUse
        In-place calls used (``PlanDynamicMemory(inplace=True)``): both tensors placed here,
        byte sizes proved equal as expressions.
    sharing : list of list of str
        Tensors sharing one storage through :attr:`inplace` (chains merged), allocation order.
    shared : dict of str to str
        Uid of every tensor of a sharing group but the first -> the first one's uid: it is
        not in :attr:`planned` (the arena holds one buffer per group, live over the group's
        span) and gets the first one's offset.
    """

    name: str
    strategy: str
    liveness: FunctionLiveness
    ranges: Dict[str, DimRange]
    planned: List[str] = field(default_factory=list)
    left_to_tvm: Dict[str, str] = field(default_factory=dict)
    aligned_size_exprs: Dict[str, object] = field(default_factory=dict)
    pieces: List[Piece] = field(default_factory=list)
    static_offsets: Dict[str, int] = field(default_factory=dict)
    static_arena_bytes: Optional[int] = None
    alignment_bytes: int = 64
    used_dims: List[str] = field(default_factory=list)
    class_values: Dict[str, List[int]] = field(default_factory=dict)
    class_arena_bytes: Dict[Tuple[int, ...], int] = field(default_factory=dict)
    output_class_bytes: Dict[str, Dict[Tuple[int, ...], int]] = field(default_factory=dict)
    samples: List[Dict] = field(default_factory=list)
    checked: Dict = field(default_factory=dict)
    fallback_reason: Optional[str] = None
    notes: List[str] = field(default_factory=list)
    inplace: List[InplaceUse] = field(default_factory=list)
    sharing: List[List[str]] = field(default_factory=list)
    shared: Dict[str, str] = field(default_factory=dict)
    _evaluators: Dict[str, object] = field(default_factory=dict, repr=False)
    _ranges: Dict[str, Tuple[int, int]] = field(default_factory=dict, repr=False)

    @property
    def generic(self) -> Piece:
        return self.pieces[-1]

    @property
    def orders(self) -> List[Order]:
        """Stackings of the generic piece."""
        return self.generic.orders if self.pieces else []

    @property
    def placed(self) -> List[str]:
        """Uids of every tensor at an arena offset: :attr:`planned` and :attr:`shared`."""
        return self.planned + list(self.shared)

    def sizes_at(self, dims: Mapping[str, int]) -> Dict[str, int]:
        """Aligned bytes of every placed tensor (:attr:`placed`) at concrete dims."""
        placed = self.placed
        if len(self._evaluators) != len(placed):
            self._evaluators = {u: int_evaluator(self.aligned_size_exprs[u]) for u in placed}
        return {u: max(f(dims), 1) for u, f in self._evaluators.items()}

    def tensor_buffers_at(self, dims: Mapping[str, int]) -> List[Buffer]:
        """One buffer per placed tensor, each with its own live range (no in-place merge)."""
        placed = self.placed
        if len(self._ranges) != len(placed):  # live ranges, once (called per shape)
            tensors = {t.uid: t for t in self.liveness.tensors}
            self._ranges = {u: (tensors[u].start, tensors[u].end) for u in placed}
        return [Buffer(u, *self._ranges[u], s, self.alignment_bytes)
                for u, s in self.sizes_at(dims).items()]

    def buffers_at(self, dims: Mapping[str, int]) -> List[Buffer]:
        """The arena's buffers at concrete dims: one per :attr:`planned` uid, a sharing group
        as one buffer live over the group's span
        (:func:`~relax_memplan.transform._inplace_plan.merged_buffers`)."""
        buffers = self.tensor_buffers_at(dims)
        return (merged_buffers(buffers, nesting_from_groups(self.sharing)) if self.sharing
                else buffers)

    def with_shared(self, offsets: Mapping[str, int]) -> Dict[str, int]:
        """``offsets`` of the :attr:`planned` uids plus each :attr:`shared` tensor at its
        group's offset."""
        out = dict(offsets)
        out.update({u: offsets[first] for u, first in self.shared.items() if first in offsets})
        return out

    def piece_for(self, dims: Mapping[str, int]) -> Piece:
        return next(p for p in self.pieces if p.matches(dims))

    def layout_at(self, dims: Mapping[str, int]) -> Tuple[Dict[str, int], int]:
        """Offsets and height of the arena the VM lays out at ``dims`` (no size class)."""
        if self.strategy == "upper_bound":
            return dict(self.static_offsets), self.static_arena_bytes or 0
        offsets, height = self.piece_for(dims).layout(self.sizes_at(dims), self.alignment_bytes)
        return self.with_shared(offsets), height

    def cell_of(self, dims: Mapping[str, int]) -> Tuple[int, ...]:
        return tuple(class_of(self.class_values[n], dims[n]) for n in self.used_dims)

    def check_dims(self, dims: Mapping[str, int]) -> None:
        """Refuse dims the plan does not hold for (``bytes_at`` at seq=500 for a range 1..128,
        at batch=0, or with a dim missing would return bytes or raise KeyError 'seq').

        Raises
        ------
        ValueError
            A dim of :attr:`used_dims` has no value, or a value is not an integer inside its
            declared range (:attr:`ranges`); the message names the dim, the value and the range.
        """
        missing = [n for n in self.used_dims if n not in dims]
        if missing:
            raise ValueError(f"function {self.name}: no value for dim {missing[0]!r} (the arena "
                             f"depends on {', '.join(self.used_dims)}; given: "
                             f"{', '.join(sorted(dims)) or 'none'})")
        for name, value in dims.items():
            declared = self.ranges.get(name)
            if declared is None:
                continue
            if isinstance(value, bool) or not isinstance(value, numbers.Integral):
                raise ValueError(f"function {self.name}: dim {name}={value!r} is not an integer")
            if value not in declared:
                raise ValueError(f"function {self.name}: dim {name}={value} is outside its "
                                 f"declared range {declared}")

    def bytes_at(self, dims: Mapping[str, int]) -> Tuple[int, int, Dict[str, int]]:
        """Arena bytes allocated, lower bound (peak live aligned bytes) and offsets at concrete dims.

        With size classes the arena bytes are the class cell's (>= the layout's height).

        Raises
        ------
        relax_memplan.planner.PlanError
            If the plan is not valid at ``dims`` (it always should be).
        ValueError
            If the function was left to TVM, a dim the sizes use has no value in ``dims``, or a
            value lies outside its declared range (:meth:`check_dims`).
        """
        if not self.planned:
            raise ValueError(f"function {self.name} was left to TVM: {self.fallback_reason}")
        self.check_dims(dims)
        buffers = self.buffers_at(dims)
        offsets, height = self.layout_at(dims)
        # every tensor on its own live range: only the declared in-place sharings may overlap
        validate(self.tensor_buffers_at(dims), offsets, capacity_bytes=height, shared=self.sharing)
        if self.class_arena_bytes and self.strategy != "upper_bound":
            height = max(height, self.class_arena_bytes[self.cell_of(dims)])
        return height, peak_live_bytes(buffers), offsets

    def lower_bound_without_inplace_at(self, dims: Mapping[str, int]) -> int:
        """Peak live aligned bytes at ``dims`` had every kernel written a fresh output."""
        return peak_live_bytes(self.tensor_buffers_at(dims))

    def ratio_at(self, dims: Mapping[str, int]) -> Tuple[int, int]:
        """(layout height, lower bound) at ``dims``, without validation (fast; for enumeration)."""
        buffers = self.buffers_at(dims)
        return self.layout_at(dims)[1], peak_live_bytes(buffers)
