"""Dim values a model cannot take, found before any build from the importer's shape arithmetic.

TVM's ONNX importer writes ``R.match_cast`` where two computations of one extent must agree:
ppocrv4-det's FPN adds ``Resize(x // 32) * 2`` to a conv output of ``(H - 1) // 16 + 1`` and
casts the first to the second. At run time a height for which the two differ (``H = 17``:
2 vs. 1) stops the VM in the cast, after both builds. :func:`check_shape_casts` evaluates
both sides of every such cast at each value of a declared ``--dim`` range and refuses the
range up front, naming the dim, a value it cannot take and a ``:STEP`` whose values it can.

Only casts whose two extents depend on a single declared dim are checked; any other cast
(two dims, a data-dependent extent) is left to TVM's check at run time, as before.
"""

from __future__ import annotations

from typing import Dict, Mapping, Optional, Sequence, Tuple

from ..analysis.dims import DimRange, evaluate_int
from ..errors import ShapeSpecError
from ..frontend.flags import dim_flag

__all__ = ["check_shape_casts", "MAX_CHECKED_VALUES"]

MAX_CHECKED_VALUES = 4096
"""Values of one dim's range evaluated (the first ones of a longer range)."""


def check_shape_casts(mod, dim_ranges: Mapping[str, Tuple]) -> None:
    """Refuse a declared dim range that holds values the model's shape casts reject.

    Runs on the imported module, before any pass (compile path: after the import and the
    ``--dim`` checks, before the builds). Reads the ``R.match_cast`` bindings of ``main``'s
    top-level blocks (not inside an ``If`` branch, nor other functions); writes nothing.

    Parameters
    ----------
    mod : tvm.IRModule
        The module as TVM's ONNX importer wrote it, dims symbolic.
    dim_ranges : mapping of str to (int, int or None[, int])
        Declared range per dim name (``--dim``); an unbounded range is not checked.

    Raises
    ------
    ShapeSpecError
        A value of a range makes the two sides of a cast differ; the message names the dim,
        the value, both extents, and a ``--dim NAME=LO..HI:STEP`` whose values all agree
        (when one exists within the range).
    """
    grids = {name: DimRange(*r).values()[:MAX_CHECKED_VALUES]
             for name, r in dim_ranges.items() if r[1] is not None}
    casts = list(_cast_extents(mod))
    for name, grid in grids.items():
        mine = [(a, b) for a, b in casts if _at(a, name, grid[0]) is not None
                and _at(b, name, grid[0]) is not None and _has_var(a, b)]
        for have, want in mine:
            bad = _first_disagreement(have, want, name, grid)
            if bad is None:
                continue
            value, got, expected = bad
            step = _working_step(mine, name, grid)
            given = "..".join(map(str, dim_ranges[name][:2])) + (
                f":{dim_ranges[name][2]}" if len(dim_ranges[name]) > 2 else "")
            fix = (f"; use a step: {dim_flag(name, _grid_text(grid, step))}" if step else "")
            raise ShapeSpecError(
                f"{dim_flag(name, given)}: the model cannot take {name}={value} (a shape cast "
                f"of the imported model needs {expected} where it computes {got}){fix}")


def _cast_extents(mod):
    """(computed extent, cast-to extent) of each axis where a ``match_cast`` changes it."""
    from tvm import relax

    func = mod["main"] if any(gv.name_hint == "main" for gv in mod.get_global_vars()) else None
    if isinstance(func, relax.Function):  # other functions (loop bodies) have their own vars
        for block in getattr(func.body, "blocks", ()):
            for binding in block.bindings:
                if not isinstance(binding, relax.MatchCast):
                    continue
                have = getattr(binding.value.ty, "shape", None)
                want = getattr(binding.ty, "shape", None)
                if have is None or want is None or not hasattr(have, "values") \
                        or not hasattr(want, "values") or len(have.values) != len(want.values):
                    continue
                for a, b in zip(have.values, want.values):
                    if not a.same_as(b):
                        yield a, b


def _at(expr, name: str, value: int) -> Optional[int]:
    """``expr`` at ``name = value``; None when it needs another var."""
    try:
        return evaluate_int(expr, {name: value})
    except ValueError:
        return None


def _has_var(*exprs) -> bool:
    """Whether any of ``exprs`` has a var (a constant cast is not a dim's business)."""
    for expr in exprs:
        try:
            evaluate_int(expr, {})
        except ValueError:
            return True
    return False


def _first_disagreement(have, want, name: str, grid: Sequence[int]):
    """(value, computed, cast-to) at the first value of ``grid`` where they differ, else None
    (also None when either side depends on another var)."""
    for value in grid:
        got, expected = _at(have, name, value), _at(want, name, value)
        if got is None or expected is None:
            return None
        if got != expected:
            return value, got, expected
    return None


def _working_step(casts, name: str, grid: Sequence[int]) -> Optional[int]:
    """The smallest power of two whose multiples in ``grid`` agree in every cast, else None."""
    step = 2
    while step <= grid[-1]:
        multiples = [v for v in grid if v % step == 0]
        if multiples and all(_first_disagreement(a, b, name, multiples) is None
                             for a, b in casts):
            return step
        step *= 2
    return None


def _grid_text(grid: Sequence[int], step: int) -> str:
    """``LO..HI:STEP`` of the multiples of ``step`` in ``grid``."""
    multiples = [v for v in grid if v % step == 0]
    return f"{multiples[0]}..{multiples[-1]}:{step}"

