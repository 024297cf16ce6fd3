"""Size classes of a dynamic plan: arena and output storage sizes rounded up per class cell.

Private helper of :class:`PlanDynamicMemory` (``size_classes=True``): each bounded
dim is rounded up to a class value (:func:`~._dynamic_plan.size_class_values`),
and a storage is allocated at the largest size it can need in the dims' cell,
so TVM's pooled allocator, which caches buffers by exact size, keeps at most
one size per cell.
"""

from __future__ import annotations

import itertools
from typing import Iterator, Mapping, Optional, Tuple

from tvm import relax, tirx

from ..analysis.dims import int_evaluator
from ._dynamic_exprs import class_select, layout_heights
from ._dynamic_plan import DynamicFunctionPlan, size_class_values

__all__ = ["class_arena", "output_storages"]

_OUTPUT = "function output"


def class_arena(fplan: DynamicFunctionPlan, dims: Mapping[str, tirx.Var], height, growth: float,
                heights: Optional[Mapping[Tuple[int, ...], int]]):
    """The arena size expression rounded up to its class cell.

    ``heights`` (every shape of the ranges -> layout height, when they were all
    measured) gives the largest height in each cell; otherwise every stacking's
    height at the cell's corner bounds it (sizes grow with the dims). The
    result is ``max(height, Select over cells)``, so it is never below the
    actual height. Returns ``height`` unchanged (with a note) when a dim has no
    upper bound. Writes ``fplan.class_values`` and ``fplan.class_arena_bytes``.
    """
    fplan.class_values = {n: size_class_values(fplan.ranges[n], growth)
                          for n in fplan.used_dims if fplan.ranges[n].upper is not None}
    if len(fplan.class_values) != len(fplan.used_dims):
        fplan.notes.append("size classes need an upper bound on every dim; arena left exact")
        fplan.class_values = {}
        return height
    names = fplan.used_dims
    cells = list(itertools.product(*(fplan.class_values[n] for n in names)))
    if heights is not None:
        table = {c: 0 for c in cells}
        for point, h in heights.items():
            cell = fplan.cell_of(dict(zip(names, point)))
            table[cell] = max(table[cell], h)
    else:
        table = {c: layout_heights(fplan, dict(zip(names, c))) for c in cells}
    fplan.class_arena_bytes = table
    return tirx.max(height, class_select(names, fplan.class_values, table, dims))


def output_storages(fplan: DynamicFunctionPlan, dims: Mapping[str, tirx.Var], device_index: int,
                    storage_scope: str, growth: float) -> Iterator[Tuple[object, relax.Var, object]]:
    """``(tensor, storage var, bytes expression)`` for each symbolic function output.

    Each output whose size depends only on bounded signature dims gets its own
    storage of its size at its class cell's corner (``max`` with the actual
    size). Writes ``fplan.output_class_bytes``.
    """
    for t in fplan.liveness.tensors:
        if (t.reason != _OUTPUT or t.size_bytes is not None or t.device_index != device_index
                or t.storage_scope != storage_scope):
            continue
        free = sorted({v.name for v in tirx.analysis.undefined_vars(t.size_expr)})
        if any(n not in dims or fplan.ranges[n].upper is None for n in free):
            continue
        values = {n: size_class_values(fplan.ranges[n], growth) for n in free}
        size = int_evaluator(t.size_expr)
        table = {c: max(size(dict(zip(free, c))), 1) for c in itertools.product(*values.values())}
        fplan.output_class_bytes[t.uid] = table
        storage = relax.Var(f"{t.name}_storage", relax.ObjectType())
        yield t, storage, tirx.max(t.size_expr, class_select(free, values, table, dims))
