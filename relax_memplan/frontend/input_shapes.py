"""Input shapes of an ONNX model before TVM imports it: ``--shape`` specs, each input's dims
(static, named symbolic, unnamed ones given a name), and the shapes chosen for the import
(:func:`plan_inputs`: the user's shapes checked, dims not fixed set to 1 or kept symbolic).

Pure ONNX, no TVM: :func:`relax_memplan.frontend.import_onnx` and the up-front dim checks of
:mod:`relax_memplan.compile.shapes` use it; ``relax_memplan.frontend`` re-exports
:func:`parse_shape_spec`.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field

import numpy as np
import onnx

from ..errors import ModelLoadError, ShapeSpecError
from .flags import shape_flag
from .suggested_ranges import suggest_dim_ranges

__all__ = ["MAX_DIM", "parse_shape_spec", "InputPlan", "graph_inputs", "input_dim_symbols",
           "plan_inputs", "named_dims_from_shapes", "with_input_dims", "check_user_shape",
           "static_dim", "without_negative_dims"]

#: Largest dim accepted in a shape spec (TVM shape arithmetic is int64; a tensor
#: this long in one dim is far beyond any memory).
MAX_DIM = 2**31 - 1


def parse_shape_spec(text: str) -> tuple[str, tuple[int, ...]]:
    """Parse one ``--shape`` argument.

    Parameters
    ----------
    text : str
        ``"<input name>=<d0>,<d1>,..."``, e.g. ``"x=1,3,96,96"``.  Whitespace around the
        name and the numbers is ignored; the name may itself contain ``=``.

    Returns
    -------
    name : str
        The graph input name.
    shape : tuple of int
        The full shape of that input (rank >= 1); every dimension is positive.

    Raises
    ------
    ShapeSpecError
        When the text has no ``=``, an empty name, no dimensions, a dimension that is not an
        integer, or a dimension <= 0.  The message quotes ``text``.
    """
    name, sep, dims_text = text.rpartition("=")
    name = name.strip()
    if not sep or not name:
        raise ShapeSpecError(f"bad shape spec {text!r}: expected NAME=D0,D1,... e.g. x=1,3,96,96")
    if not dims_text.strip():
        raise ShapeSpecError(f"bad shape spec {text!r}: no dimensions after '='")
    shape = []
    for axis, item in enumerate(dims_text.split(",")):
        try:
            dim = int(item.strip())
        except ValueError:
            raise ShapeSpecError(
                f"bad shape spec {text!r}: dim {axis} {item.strip()!r} is not an integer"
            ) from None
        if dim <= 0:
            raise ShapeSpecError(f"bad shape spec {text!r}: dim {axis} is {dim}, must be > 0")
        if dim > MAX_DIM:
            raise ShapeSpecError(f"bad shape spec {text!r}: dim {axis} is {dim}, above {MAX_DIM}")
        shape.append(dim)
    return name, tuple(shape)




@dataclass
class InputPlan:
    """Shapes chosen for the graph inputs before calling TVM."""

    tvm_shapes: dict[str, list[int]] = field(default_factory=dict)
    run_shapes: dict[str, tuple[int, ...]] = field(default_factory=dict)
    dtypes: dict[str, str] = field(default_factory=dict)
    defaulted: dict[str, tuple[tuple[int, str], ...]] = field(default_factory=dict)
    notes: list[str] = field(default_factory=list)
    hint: str = ""  # appended to import errors when dims were set to 1
    steps: list[str] = field(default_factory=list)  # ONNX preparation steps to run
    # every input's dims as imported: int fixed, str a symbolic dim (unnamed ones named)
    input_dims: dict[str, list[int | str]] = field(default_factory=dict)
    fixed: dict[str, int] = field(default_factory=dict)  # symbolic dims that shapes fixed


def graph_inputs(model: onnx.ModelProto) -> list[onnx.ValueInfoProto]:
    """Graph inputs that are not initializers, in graph order."""
    initializers = {init.name for init in model.graph.initializer}
    return [value for value in model.graph.input if value.name not in initializers]


_UNNAMED_DIMS = frozenset({"", "?"})
"""``dim_param`` values that name no dim: each such dim is unknown and independent."""


def static_dim(dim: onnx.TensorShapeProto.Dimension) -> int | None:
    """The static extent of one declared dim, None when it is unknown.

    A ``dim_value`` that is set and not negative is static, 0 included (ONNX Runtime runs
    an input declared 0 only at size 0). A negative ``dim_value`` is unknown: paddle2onnx
    writes ``-1`` for a dynamic dim, and ONNX Runtime reads any negative value so.
    """
    if dim.WhichOneof("value") == "dim_value" and dim.dim_value >= 0:
        return dim.dim_value
    return None


def without_negative_dims(model: onnx.ModelProto) -> tuple[onnx.ModelProto, int]:
    """A copy of ``model`` whose declared shapes (inputs, outputs, ``value_info``, in
    subgraphs too) have no negative ``dim_value``: each becomes an unnamed dim, the form
    ONNX shape inference and TVM's importer read as unknown; with the number replaced.
    The model itself is returned when it has none."""
    def dims(graph):
        for value in list(graph.input) + list(graph.output) + list(graph.value_info):
            if value.type.HasField("tensor_type"):
                yield from value.type.tensor_type.shape.dim
        for node in graph.node:
            for attr in node.attribute:
                for body in ([attr.g] if attr.type == onnx.AttributeProto.GRAPH
                             else attr.graphs):
                    yield from dims(body)

    if not any(d.WhichOneof("value") == "dim_value" and d.dim_value < 0
               for d in dims(model.graph)):
        return model, 0
    copy = onnx.ModelProto()
    copy.CopyFrom(model)
    count = 0
    for dim in dims(copy.graph):
        if dim.WhichOneof("value") == "dim_value" and dim.dim_value < 0:
            dim.Clear()
            count += 1
    return copy, count


def input_dim_symbols(inputs) -> dict[str, list[int | str] | None]:
    """Each input's dims: an int for a static dim, the ``dim_param`` for a named dynamic
    dim, and a fresh unique name ``<input>_dim<axis>`` for an unnamed one (``dim_param``
    empty or ``?``, or a negative ``dim_value``: :func:`static_dim`), so that only a name
    shared in the model ties two dims together. A ``dim_value`` of 0 set in the model is
    the static size 0, not an unknown dim. None for an input of unknown rank."""
    taken = {
        dim.dim_param
        for value in inputs
        for dim in value.type.tensor_type.shape.dim
        if static_dim(dim) is None and dim.dim_param not in _UNNAMED_DIMS
    }
    symbols = {}
    for value in inputs:
        tensor_type = value.type.tensor_type
        if not tensor_type.HasField("shape"):
            symbols[value.name] = None
            continue
        dims = []
        for axis, dim in enumerate(tensor_type.shape.dim):
            if static_dim(dim) is not None:
                dims.append(dim.dim_value)  # 0 set explicitly: a static empty dim
            elif dim.WhichOneof("value") == "dim_param" and dim.dim_param not in _UNNAMED_DIMS:
                dims.append(dim.dim_param)
            else:  # a name TVM's shape parser reads as one symbol, unique in the model
                base = re.sub(r"\W", "_", f"{value.name}_dim{axis}")
                fresh, k = base, 0
                while fresh in taken:
                    k += 1
                    fresh = f"{base}_{k}"
                taken.add(fresh)
                dims.append(fresh)
        symbols[value.name] = dims
    return symbols


def plan_inputs(model, shapes: dict, keep_dynamic: bool) -> InputPlan:
    """Validate ``shapes`` against the model's inputs and choose every input's shape."""
    inputs = graph_inputs(model)
    names = [value.name for value in inputs]
    unknown = sorted(set(shapes) - set(names))
    if unknown:
        raise ShapeSpecError(
            f"unknown input name(s) {', '.join(map(repr, unknown))}; "
            f"the model's inputs are: {', '.join(map(repr, names))}"
        )
    plan = InputPlan()
    symbols = input_dim_symbols(inputs)
    plan.fixed = named_dims_from_shapes(symbols, shapes)
    fixes = []
    for value in inputs:
        name = value.name
        if not value.type.HasField("tensor_type"):
            raise ModelLoadError(f"graph input '{name}' is not a tensor; cannot import it")
        tensor_type = value.type.tensor_type
        if tensor_type.elem_type == onnx.TensorProto.UNDEFINED:
            raise ModelLoadError(f"graph input '{name}' has no element type")
        plan.dtypes[name] = onnx.helper.tensor_dtype_to_np_dtype(tensor_type.elem_type).name
        model_dims = symbols[name]
        if model_dims is None and name not in shapes:
            raise ShapeSpecError(f"input '{name}' has unknown rank; pass --shape {name}=...")
        if model_dims is not None and 0 in model_dims:
            raise ShapeSpecError(f"input '{name}' has size 0 at axis {model_dims.index(0)} in "
                                 f"the model ({model_dims}): an empty input cannot be compiled "
                                 f"or planned; fix the model's input shape")
        if name in shapes:
            shape = check_user_shape(name, shapes[name], model_dims)
            plan.tvm_shapes[name] = list(shape)
            plan.run_shapes[name] = shape
            plan.input_dims[name] = list(shape)
            continue
        # a dim named like one a --shape fixed takes that value (the model says they are equal)
        model_dims = [plan.fixed.get(d, d) if isinstance(d, str) else d for d in model_dims]
        defaulted = tuple((axis, d) for axis, d in enumerate(model_dims) if isinstance(d, str))
        plan.run_shapes[name] = tuple(1 if isinstance(d, str) else d for d in model_dims)
        plan.input_dims[name] = model_dims
        if not keep_dynamic:
            plan.tvm_shapes[name] = list(plan.run_shapes[name])
            plan.input_dims[name] = list(plan.run_shapes[name])
        if defaulted:
            plan.defaulted[name] = defaulted
            template = shape_flag(name, [_grid_low(model, symbols).get(d, 1) if isinstance(d, str)
                                         else d for d in model_dims])
            if template != shape_flag(name, plan.run_shapes[name]):
                fixes.append(template)
            action = "kept symbolic; test inputs use 1" if keep_dynamic else "using 1"
            for axis, symbol in defaulted:
                plan.notes.append(
                    f"input '{name}' dim {axis} '{symbol}' not fixed; {action} "
                    f"(fix it with e.g. {template})"
                )
    if plan.defaulted and not keep_dynamic:
        symbols = dict.fromkeys(s for pairs in plan.defaulted.values() for _, s in pairs)
        plan.hint = (f"dynamic dims {', '.join(symbols)} were set to 1"
                     + (f"; try {' '.join(fixes)} (the model's grid)" if fixes else ""))
    return plan


def named_dims_from_shapes(symbols: dict, shapes: dict) -> dict[str, int]:
    """Symbolic dims (from :func:`input_dim_symbols`) -> the value a user shape gives them.

    Raises
    ------
    ShapeSpecError
        If two user shapes (or two dims of one) give one named dim different values.
    """
    named: dict[str, tuple[int, str]] = {}
    for name, dims in symbols.items():
        if name not in shapes or dims is None:
            continue
        given = list(shapes[name]) if isinstance(shapes[name], (list, tuple)) else []
        if len(given) != len(dims):
            continue  # check_user_shape reports the rank mismatch
        for dim, v in zip(dims, given):
            if not isinstance(dim, str) or not isinstance(v, (int, np.integer)):
                continue  # static dims and non-integers: check_user_shape reports them
            seen = named.setdefault(dim, (int(v), name))
            if seen[0] != int(v):
                raise ShapeSpecError(
                    f"dim '{dim}' is {seen[0]} in --shape {seen[1]} but {v} in "
                    f"--shape {name}; the model declares them equal")
    return {k: v for k, (v, _) in named.items()}


def with_input_dims(model: onnx.ModelProto, input_dims: dict) -> onnx.ModelProto:
    """A copy of ``model`` whose graph inputs declare ``input_dims`` (int: ``dim_value``,
    str: ``dim_param``), so the preparation steps see the shapes TVM will import."""
    copy = onnx.ModelProto()
    copy.CopyFrom(model)
    for value in copy.graph.input:
        dims = input_dims.get(value.name)
        if dims is None:
            continue
        shape = value.type.tensor_type.shape
        shape.Clear()
        for d in dims:
            entry = shape.dim.add()
            if isinstance(d, str):
                entry.dim_param = d
            else:
                entry.dim_value = int(d)
    return copy


def check_user_shape(name: str, shape, model_dims: list | None) -> tuple[int, ...]:
    """Check a user-given full shape against the model's dims (int static, str dynamic,
    None for an input of unknown rank)."""
    items = list(shape) if isinstance(shape, (list, tuple, np.ndarray)) else None
    if items is None or not all(
        isinstance(d, (int, np.integer)) and not isinstance(d, bool) for d in items
    ):
        raise ShapeSpecError(f"shape for input '{name}' must be a list of integers, got {shape!r}")
    dims = tuple(int(d) for d in items)
    if model_dims is None:
        model_dims = [None] * len(dims)
    if len(dims) != len(model_dims):
        raise ShapeSpecError(
            f"shape {list(dims)} for input '{name}' has rank {len(dims)}; "
            f"the model's input has rank {len(model_dims)}"
        )
    for axis, (given, expected) in enumerate(zip(dims, model_dims)):
        if given <= 0:
            raise ShapeSpecError(f"input '{name}' dim {axis} is {given}; dims must be > 0")
        if isinstance(expected, int) and given != expected:
            raise ShapeSpecError(
                f"input '{name}' dim {axis} is static {expected} in the model, got {given}"
            )
    return dims


def _grid_low(model, symbols) -> dict:
    """Each symbolic dim's smallest value on the model's grid (image sides of a stride-32
    model: 32), as ``inspect`` suggests it from the graph; the value hints suggest."""
    ranges = suggest_dim_ranges(symbols, model.graph)
    return {d: int(r.split("..")[0] or 1) for d, r in ranges.items()}
