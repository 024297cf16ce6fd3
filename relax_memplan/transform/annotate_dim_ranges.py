"""AnnotateDimRanges: declare the range of symbolic dims on the functions that take them.

Where it runs: anywhere before memory planning (our pipeline runs it first).
Writes the function attributes TVM's planners read: ``tir_var_lower_bound``
and ``tir_var_upper_bound`` (both inclusive, names to ints), merged into any
already present, and ``relax_memplan.dim_step`` for dims declared with a step. :class:`~relax_memplan.transform.InsertDimRangeCheck` turns
them into a run-time check; :class:`~relax_memplan.transform.PlanDynamicMemory`
plans with them.
"""

from __future__ import annotations

from typing import Dict, Mapping, Optional, Sequence, Tuple

import tvm
from tvm import relax

from ..analysis.dims import STEP_ATTR, DimRange, signature_dims
from ._module_util import replace_functions

__all__ = ["AnnotateDimRanges"]


@tvm.transform.module_pass(opt_level=0, name="AnnotateDimRanges")
class AnnotateDimRanges:
    """Write declared dim ranges as ``tir_var_lower_bound`` / ``tir_var_upper_bound`` attributes.

    Parameters
    ----------
    ranges : mapping of str to (int or None, int or None[, int])
        Dim name -> (lower, upper) or (lower, upper, step), inclusive, in
        elements; ``None`` leaves that end undeclared. ``{"seq": (1, 128)}``,
        ``{"height": (160, 640, 32)}`` (multiples of 32 from 160).
    func_names : sequence of str, optional
        Functions to annotate; default every Relax function whose signature
        has one of the dims.

    Raises
    ------
    ValueError
        When running: a named dim appears in no annotated function's signature
        (the message lists the dims there are). At construction: an empty range
        or a step < 1.
    """

    def __init__(self, ranges: Mapping[str, Tuple[Optional[int], Optional[int]]],
                 func_names: Optional[Sequence[str]] = None):
        self.ranges: Dict[str, DimRange] = {
            name: DimRange(lower=r[0] or 0, upper=r[1], step=r[2] if len(r) > 2 else 1)
            for name, r in ranges.items()
        }
        self.func_names = tuple(func_names) if func_names is not None else None

    def transform_module(self, mod: tvm.IRModule, _ctx) -> tvm.IRModule:
        used, seen = set(), set()
        updates = {}
        for gv, func in mod.functions_items():
            if not isinstance(func, relax.Function):
                continue
            if self.func_names is not None and gv.name_hint not in self.func_names:
                continue
            dims = signature_dims(func)
            seen.update(dims)
            mine = {n: r for n, r in self.ranges.items() if n in dims}
            if not mine:
                continue
            used.update(mine)
            attrs = func.attrs
            lower = dict(attrs["tir_var_lower_bound"]) if attrs and "tir_var_lower_bound" in attrs else {}
            upper = dict(attrs["tir_var_upper_bound"]) if attrs and "tir_var_upper_bound" in attrs else {}
            step = dict(attrs[STEP_ATTR]) if attrs and STEP_ATTR in attrs else {}
            for name, r in mine.items():
                if r.lower > 0:
                    lower[name] = r.lower
                if r.upper is not None:
                    upper[name] = r.upper
                if r.step > 1:
                    step[name] = r.step
            new_attrs = {}
            if step:
                new_attrs[STEP_ATTR] = {str(k): int(v) for k, v in step.items()}
            if lower:
                new_attrs["tir_var_lower_bound"] = {str(k): int(v) for k, v in lower.items()}
            if upper:
                new_attrs["tir_var_upper_bound"] = {str(k): int(v) for k, v in upper.items()}
            updates[gv] = func.with_attrs(new_attrs) if new_attrs else func
        unknown = sorted(set(self.ranges) - used)
        if unknown:
            have = ", ".join(sorted(seen)) or "none"
            raise ValueError(
                f"dim(s) {', '.join(repr(u) for u in unknown)} not in any function signature "
                f"(symbolic dims there: {have})"
            )
        return replace_functions(mod, updates)
