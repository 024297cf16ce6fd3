"""Dims and shapes for the compile path: the declared ranges checked against the model's
symbolic dims, sampled points and the input shapes there (the ``--dim``/``--bucket`` specs:
:mod:`relax_memplan.compile.specs`).

A fixed-shape build is the case with no symbolic dim: one point, ``{}``.
"""

from __future__ import annotations

import dataclasses
import itertools
import re
from typing import Dict, List, Mapping, Sequence, Tuple

import numpy as np

from ..analysis.dims import DimRange, evaluate_int
from ..errors import ShapeSpecError, UndeclaredDimError
from ..frontend.input_shapes import plan_inputs
from ..frontend.flags import dim_flag, shape_flag, tvm_dim_name
from ..transform._dynamic_plan import sample_points
from .dim_suggestions import checked_dim_ranges, missing_dims_advice

__all__ = ["sample_dims", "symbolic_dims", "shapes_at",
           "with_shapes", "fit_values", "check_declared_dims", "check_dims_up_front",
           "flag_spelling", "undeclared_dims_fix"]


def sample_dims(ranges: Mapping[str, Tuple], count: int, seed: int) -> List[Dict[str, int]]:
    """``count`` distinct shapes: the range ends, then random shapes on each dim's grid (an
    unbounded dim up to 4x its lower bound), as the planner samples them; every shape in range
    (the ends first) when there are no more than ``count``."""
    dim_ranges = {n: DimRange(*r) for n, r in ranges.items()}
    lows = {n: r.values()[0] if r.upper is not None else max(r.lower, 1) for n, r in dim_ranges.items()}
    grids = [r.values() if r.upper is not None else range(lows[n], 4 * lows[n] + 1)
             for n, r in dim_ranges.items()]
    if int(np.prod([len(g) for g in grids], dtype=np.float64)) <= count:
        every = [dict(zip(dim_ranges, values)) for values in itertools.product(*grids)]
        return every[:1] + every[-1:] + every[1:-1] if len(every) > 1 else every
    points = sample_points(dim_ranges, list(dim_ranges), lows, 4 * count + 8, seed)
    distinct = [p for i, p in enumerate(points) if p not in points[:i]]
    return distinct[: max(count, 2)]


def with_shapes(info, shapes):
    """``info`` with the input shapes of one sampled point."""
    return dataclasses.replace(info, input_shapes={n: shapes.get(n, s) for n, s in info.input_shapes.items()})


def fit_values(values, shapes, sampled: bool = False):
    """Fixed input values; a scalar or fixed-shape value is used at every shape (``sampled``:
    ``shapes`` is one sampled point of declared dim ranges, said in the error)."""
    out = {}
    for name, value in (values or {}).items():
        if name in shapes and tuple(np.shape(value)) != tuple(shapes[name]):
            why = ("" if not sampled else
                   " at a sampled shape (with --dim a value given by --input is used at every "
                   "sampled shape: give one only for an input whose shape does not change, or "
                   "fix that input with --shape)")
            raise ShapeSpecError(f"value for input '{name}' has shape {tuple(np.shape(value))}, "
                                 f"expected {tuple(shapes[name])}{why}")
        out[name] = value
    return out


def symbolic_dims(mod, info, dim_ranges: Mapping[str, Tuple]) -> List[str]:
    """The symbolic dims of ``main``'s inputs, checked against the declared ranges
    (:func:`check_declared_dims`).

    Raises
    ------
    ShapeSpecError
        A declared dim is fixed by ``--shape`` or is not a symbolic dim of the model, or a
        symbolic dim has no declared range.
    """
    symbolic = sorted({d.name for p in mod["main"].params for d in getattr(p.ty, "shape", None) or ()
                       if type(d).__name__ == "Var"})
    check_declared_dims(symbolic, info.fixed_dims, dim_ranges)
    return symbolic


def check_declared_dims(symbolic: Sequence[str], fixed: Mapping[str, int],
                        dim_ranges: Mapping[str, Tuple], input_dims=None, model=None) -> None:
    """Every dim in ``symbolic`` (the model's symbolic dims not fixed by ``--shape``) has a
    range in ``dim_ranges``, and every range names such a dim.

    Raises
    ------
    ShapeSpecError
        A ranged dim is in ``fixed`` (also given by ``--shape``) or not a symbolic dim of the
        model, or a symbolic dim has no range (the message gives the ``--dim`` flags to add).

    Notes
    -----
    With the model's ``input_dims`` (input name -> dims) and the ONNX ``model``, the flags
    suggested for a missing dim name the input and axis it is and are inspect's
    (:func:`relax_memplan.compile.dim_suggestions.checked_dim_ranges`); else they go by the
    dim's name.
    """
    both = sorted(set(dim_ranges) & set(fixed))
    if both:
        raise ShapeSpecError(f"--dim {both[0]}: dim '{both[0]}' is fixed to {fixed[both[0]]} by "
                             f"--shape; give it a --shape value or a --dim range, not both")
    unknown = sorted(set(dim_ranges) - set(symbolic))
    if unknown:
        raise ShapeSpecError(f"--dim {', '.join(unknown)}: not a symbolic dim of the model "
                             f"(its dims: {', '.join(sorted(symbolic)) or 'none'})")
    missing = [d for d in symbolic if d not in dim_ranges]
    if missing:
        raise ShapeSpecError("give a range for every symbolic dim of the model: "
                             + missing_dims_advice(missing, input_dims or {}, model=model))


def flag_spelling(symbolic: Sequence[str], given: Sequence[str]) -> Dict[str, str]:
    """Given dim names written as TVMScript prints them -> the model's own names.

    TVMScript prints ``p2o.DynamicDimension.1`` as ``p2o_DynamicDimension_1`` (a Python
    identifier) and TVM's importer names dim ``seq len`` ``seqlen``
    (:func:`~relax_memplan.frontend.flags.tvm_dim_name`); ``--dim`` takes all three. A given
    name that is not in ``symbolic`` maps to the one name of ``symbolic`` with that
    identifier or TVM form; names already in ``symbolic``, or matching none or several, are
    left out.
    """
    by_form: Dict[str, set] = {}
    for name in symbolic:
        for form in (_identifier(name), tvm_dim_name(name)):
            by_form.setdefault(form, set()).add(name)
    return {g: next(iter(by_form[g])) for g in given
            if g not in symbolic and len(by_form.get(g, ())) == 1}


def _identifier(name: str) -> str:
    return re.sub(r"\W", "_", name)


def undeclared_dims_fix(onnx_model, input_dims) -> Tuple[str, str]:
    """What to type for symbolic dims left undeclared: (``--dim`` flags, ``--shape`` flags at
    each range's lower end), from ``inspect``'s checked suggestions
    (:func:`~relax_memplan.compile.dim_suggestions.checked_dim_ranges`); ``input_dims``: each
    input's dims (a name per symbolic dim, an int per fixed one)."""
    ranges = checked_dim_ranges(onnx_model, input_dims)
    low = {n: r.split("..")[0] for n, r in ranges.items()}
    shape_flags = " ".join(shape_flag(name, [low[d] if isinstance(d, str) else d for d in dims])
                           for name, dims in input_dims.items()
                           if any(isinstance(d, str) for d in dims or ()))
    return " ".join(dim_flag(n, r) for n, r in ranges.items()), shape_flags


def check_dims_up_front(onnx_model, shapes, dim_ranges: Mapping[str, Tuple],
                       command: str = "compile") -> Dict[str, str]:
    """Before importing: the ONNX model's symbolic dims against ``--shape`` and ``--dim``.

    With ranges, :func:`check_declared_dims` (an error before any import or build). Without,
    every symbolic dim must be fixed by a ``--shape``: a dim left free is refused with the
    ``--dim`` ranges ``inspect`` suggests and the ``--shape`` flags at their lower ends, each
    passing compile's checks (:func:`undeclared_dims_fix`). No size is guessed: a model
    compiled at 1 for a dim the user did not choose gives a report about a shape nobody runs.

    Parameters
    ----------
    onnx_model : onnx.ModelProto
    shapes : mapping of str to sequence of int
        ``--shape`` values by input name.
    dim_ranges : mapping of str to tuple
        ``--dim`` ranges by dim name.
    command : {"compile", "bench"}
        The command named in the refusal; ``bench`` times fixed shapes only, so its refusal
        suggests ``--shape`` alone.

    Returns
    -------
    dict of str to str
        Each given dim name that differs from the imported module's name for it, to that
        name: the printed spelling (:func:`flag_spelling`) and the ONNX name with spaces
        (``seq len``, which TVM's importer names ``seqlen``); the checks ran on the ONNX names.

    Raises
    ------
    ShapeSpecError
        A bad ``--shape`` (unknown input, wrong rank, ...) or a dim range that does not fit.
    UndeclaredDimError
        A symbolic dim with neither a ``--shape`` value nor a ``--dim`` range; the message
        gives the flags to add.
    """
    plan = plan_inputs(onnx_model, dict(shapes or {}), keep_dynamic=True)
    symbolic = list(dict.fromkeys(d for dims in plan.input_dims.values() for d in dims
                                  if isinstance(d, str)))
    renames = flag_spelling(symbolic, list(dim_ranges))
    onnx_names = {n: renames.get(n, n) for n in dim_ranges}
    if dim_ranges:
        check_declared_dims(symbolic, plan.fixed, {onnx_names[n]: r
                                                   for n, r in dim_ranges.items()},
                            plan.input_dims, onnx_model)
    elif symbolic:
        raise _undeclared(onnx_model, plan.input_dims, symbolic, command)
    return {n: tvm_dim_name(m) for n, m in onnx_names.items() if tvm_dim_name(m) != n}


def _undeclared(onnx_model, input_dims, symbolic, command: str) -> UndeclaredDimError:
    """The refusal of ``symbolic`` dims left free, with the flags that declare them."""
    from ..frontend.suggested_ranges import dim_locations

    flags, fix = undeclared_dims_fix(onnx_model, input_dims)
    where = dim_locations(input_dims)
    dims = ", ".join(f"{d} ({where[d]})" for d in symbolic)
    # bench times fixed shapes only: no --dim to suggest
    ranged = "" if command == "bench" else f"add {flags} to compile once for those ranges, or "
    return UndeclaredDimError(
        f"symbolic dim(s) {dims} not declared and {command} does not guess a size: {ranged}fix "
        f"them with {fix} (placeholders: set them to the sizes you will run)")


def shapes_at(mod, dims: Mapping[str, int]) -> Dict[str, Tuple[int, ...]]:
    """The shape of each input of ``main`` at the dims' values (``{}``: a static module)."""
    return {p.name: tuple(evaluate_int(d, dims) if not isinstance(d, int) else d
                          for d in p.ty.shape) for p in mod["main"].params}
