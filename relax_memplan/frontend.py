"""Load ONNX models and import them into Relax with concrete input shapes.

This is the first step of every pipeline: :func:`load_onnx` reads and checks a file,
:func:`import_onnx` fixes the dynamic input dimensions (from the user's shapes, else 1),
calls TVM's ONNX frontend and, when TVM fails, names the ONNX node it failed on
(:class:`~relax_memplan.errors.UnsupportedOperatorError`).  :func:`make_random_inputs` and
:func:`run_onnxruntime` give the reference run used to verify a compiled module.

Locating the failing node relies on two methods of TVM 0.27's ``ONNXGraphImporter``:
``_construct_nodes`` (loops over ``graph.node``, storing each node's outputs in the
importer's ``_nodes`` table) and ``_convert_operator`` (runs one op converter and normalizes
its result).  Both are wrapped only while :func:`import_onnx` runs; see :class:`_ConversionTrace`.
"""

from __future__ import annotations

import contextlib
import io
import os
import re
import threading
from collections.abc import Iterable
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
import onnx
import onnx.version_converter
import tvm
from tvm.relax.frontend.onnx import onnx_frontend

from . import onnx_prepare
from .errors import (ModelLoadError, ReferenceRunError, ShapeSpecError, UnsupportedOperatorError,
                     summarize_error)
from .onnx_prepare.converters import corrected_converters, describe_usage
from .onnx_prepare.loop_facts import attach_loops, collecting_loops
from .onnx_prepare.node_names import attach_node_names, name_onnx_nodes

__all__ = [
    "ImportInfo",
    "parse_shape_spec",
    "load_onnx",
    "import_onnx",
    "make_random_inputs",
    "run_onnxruntime",
    "unsupported_ops",
    "UPGRADE_TARGET_OPSET",
    "SAMPLE_RATE_DEFAULT_HZ",
]

UPGRADE_TARGET_OPSET = 13
"""Default-domain opset that older models are converted to when TVM fails to import them."""

SAMPLE_RATE_DEFAULT_HZ = 16000
"""Default value :func:`make_random_inputs` gives an integer scalar input named like a
sample rate (``sr``, ``sample_rate``, ``sampling_rate``)."""

_SAMPLE_RATE_NAME = re.compile(r"^(sr|sample_?rate|sampling_?rate)$", re.IGNORECASE)


# ----------------------------------------------------------------------------- input shapes
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


@dataclass(frozen=True)
class ImportInfo:
    """What :func:`import_onnx` decided while importing a model.

    Attributes
    ----------
    input_shapes : dict of str to tuple of int
        Concrete shape of every graph input (initializers excluded), in graph order: the
        shape imported, or with ``keep_dynamic`` the shape to use for test runs.
    input_dtypes : dict of str to str
        Numpy dtype name of every graph input, e.g. ``"float32"``, ``"int64"``.
    defaulted_dims : dict of str to tuple of (int, str)
        For each input with dynamic dims the user did not fix: ``(axis, symbolic name)``
        pairs of the dims set to 1 (kept symbolic with ``keep_dynamic``).  An unnamed dim
        gets the name ``"<input>_dim<axis>"``.
    opset : int
        Default-domain opset of the imported model, after any upgrade.
    upgraded_from_opset : int or None
        The model's original default-domain opset when the version converter was used.
    notes : tuple of str
        Human-readable notes for the report (defaulted dims, opset upgrade).
    dynamic_dims_kept : bool
        True when defaulted dims stayed symbolic in the module (``keep_dynamic=True``).
    fixed_dims : dict of str to int
        Symbolic dims of the model that ``shapes`` fixed, with their values: named dims
        (``dim_param``) and unnamed ones under their ``"<input>_dim<axis>"`` name.
    """

    input_shapes: dict[str, tuple[int, ...]]
    input_dtypes: dict[str, str]
    defaulted_dims: dict[str, tuple[tuple[int, str], ...]]
    opset: int
    upgraded_from_opset: int | None = None
    notes: tuple[str, ...] = ()
    dynamic_dims_kept: bool = False
    fixed_dims: dict[str, int] = field(default_factory=dict)


@dataclass
class _InputPlan:
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


def _graph_inputs(model: onnx.ModelProto) -> list[onnx.ValueInfoProto]:
    """Graph inputs that are not initializers, in graph order."""
    initializers = {init.name for init in model.graph.initializer}
    return [value for value in model.graph.input if value.name not in initializers]


_UNNAMED_DIMS = frozenset({"", "?"})
"""``dim_param`` values that name no dim: each such dim is unknown and independent."""


def _input_dim_symbols(inputs) -> dict[str, list[int | str] | None]:
    """Each input's dims: an int for a static dim, the ``dim_param`` for a named dynamic
    dim, and a fresh unique name ``<input>_dim<axis>`` for an unnamed one (``dim_param``
    empty or ``?``), so that only a name shared in the model ties two dims together.
    None for an input of unknown rank."""
    taken = {
        dim.dim_param
        for value in inputs
        for dim in value.type.tensor_type.shape.dim
        if dim.dim_value <= 0 and dim.dim_param not in _UNNAMED_DIMS
    }
    symbols = {}
    for value in inputs:
        tensor_type = value.type.tensor_type
        if not tensor_type.HasField("shape"):
            symbols[value.name] = None
            continue
        dims = []
        for axis, dim in enumerate(tensor_type.shape.dim):
            if dim.dim_value > 0:
                dims.append(dim.dim_value)
            elif dim.dim_param not in _UNNAMED_DIMS:
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


def _plan_inputs(model, shapes: dict, keep_dynamic: bool) -> _InputPlan:
    """Validate ``shapes`` against the model's inputs and choose every input's shape."""
    inputs = _graph_inputs(model)
    names = [value.name for value in inputs]
    unknown = sorted(set(shapes) - set(names))
    if unknown:
        raise ShapeSpecError(
            f"unknown input name(s) {', '.join(map(repr, unknown))}; "
            f"the model's inputs are: {', '.join(map(repr, names))}"
        )
    plan = _InputPlan()
    symbols = _input_dim_symbols(inputs)
    plan.fixed = _named_dims_from_shapes(symbols, shapes)
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
        if name in shapes:
            shape = _check_user_shape(name, shapes[name], model_dims)
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
            template = ",".join("1" if isinstance(d, str) else str(d) for d in model_dims)
            action = "kept symbolic; test inputs use 1" if keep_dynamic else "using 1"
            for axis, symbol in defaulted:
                plan.notes.append(
                    f"input '{name}' dim {axis} '{symbol}' not fixed; {action} "
                    f"(fix it with e.g. --shape {name}={template})"
                )
    if plan.defaulted and not keep_dynamic:
        symbols = dict.fromkeys(s for pairs in plan.defaulted.values() for _, s in pairs)
        plan.hint = f"dynamic dims {', '.join(symbols)} were set to 1"
    return plan


def _named_dims_from_shapes(symbols: dict, shapes: dict) -> dict[str, int]:
    """Symbolic dims (from :func:`_input_dim_symbols`) -> the value a user shape gives them.

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
            continue  # _check_user_shape reports the rank mismatch
        for dim, v in zip(dims, given):
            if not isinstance(dim, str) or not isinstance(v, (int, np.integer)):
                continue  # static dims and non-integers: _check_user_shape reports them
            seen = named.setdefault(dim, (int(v), name))
            if seen[0] != int(v):
                raise ShapeSpecError(
                    f"dim '{dim}' is {seen[0]} in --shape {seen[1]} but {v} in "
                    f"--shape {name}; the model declares them equal")
    return {k: v for k, (v, _) in named.items()}


def _with_input_dims(model: onnx.ModelProto, input_dims: dict) -> onnx.ModelProto:
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


def _check_user_shape(name: str, shape, model_dims: list | None) -> tuple[int, ...]:
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


# ----------------------------------------------------------------------------- loading
def load_onnx(path: str | os.PathLike) -> onnx.ModelProto:
    """Read an ONNX file and check it with ``onnx.checker``.

    Parameters
    ----------
    path : str or os.PathLike
        Path of a ``.onnx`` file (external data, if any, next to it).

    Returns
    -------
    onnx.ModelProto
        The parsed model.

    Raises
    ------
    ModelLoadError
        When the path does not exist or is a directory, the bytes are not an ONNX model
        (protobuf decoding fails, or no graph), or ``onnx.checker.check_model`` rejects it.
        The message names the path and says which of these happened.
    """
    path = Path(path)
    if not path.exists():
        raise ModelLoadError(f"ONNX file not found: {path}")
    if path.is_dir():
        raise ModelLoadError(f"expected an ONNX file, got a directory: {path}")
    try:
        model = onnx.load(str(path))
    except Exception as err:  # protobuf DecodeError, external-data errors, ...
        raise ModelLoadError(
            f"{path} is not a readable ONNX model: {summarize_error(err)}"
        ) from err
    if model.ir_version == 0 or not model.HasField("graph"):
        raise ModelLoadError(f"{path} is not an ONNX model (no ir_version or no graph)")
    try:
        onnx.checker.check_model(model)
    except onnx.checker.ValidationError as err:
        raise ModelLoadError(f"{path} fails onnx.checker: {summarize_error(err)}") from err
    return model


def _as_model(model_or_path) -> onnx.ModelProto:
    if isinstance(model_or_path, onnx.ModelProto):
        return model_or_path
    return load_onnx(model_or_path)


def _default_opset(model: onnx.ModelProto) -> int:
    return _domain_opset(model, "")


def _domain_opset(model: onnx.ModelProto, domain: str) -> int:
    domains = {"", "ai.onnx"} if domain in ("", "ai.onnx") else {domain}
    for entry in model.opset_import:
        if entry.domain in domains:
            return entry.version
    return 1


# ----------------------------------------------------------------------------- import
def import_onnx(
    model_or_path,
    shapes: dict[str, tuple[int, ...]] | None = None,
    *,
    keep_dynamic: bool = False,
    prepare_steps: Iterable[str] | None = None,
    disable_steps: Iterable[str] = (),
    node_names: bool = True,
) -> tuple[tvm.IRModule, ImportInfo]:
    """Import an ONNX model into a Relax module with weights as constants.

    Parameters
    ----------
    model_or_path : onnx.ModelProto or str or os.PathLike
        The model, or a path given to :func:`load_onnx`.
    shapes : dict of str to sequence of int, optional
        Full shape per graph input name (same meaning as ``--shape``).  The shapes are
        written into the model's input types before the preparation steps run, so the
        import is the one of the model with these shapes declared.  A named dynamic dim
        (``dim_param``) fixed here takes that value in every input; an unnamed one
        (``dim_param`` empty or ``?``) is independent of every other dim.  Dynamic dims
        still free are set to 1, each recorded in ``ImportInfo.defaulted_dims`` and a note.
    keep_dynamic : bool
        Keep the dynamic dims that ``shapes`` leaves free symbolic instead of setting them
        to 1: a named dim becomes the symbolic var of that name, an unnamed one its own var
        ``<input>_dim<axis>``.
    prepare_steps : iterable of str, optional
        Names of the preparation steps to run (see ``onnx_prepare.STEP_NAMES``), in
        their fixed order.  Default: all of them, as ``relax-memplan compile`` does;
        ``()`` runs none (TVM's importer on the model as it is).  What each step changed is added to ``ImportInfo.notes``.
    disable_steps : iterable of str
        Names of preparation steps not to run.
    node_names : bool
        Record which ONNX node each Gather, GatherElements, GatherND, ScatterElements,
        ScatterND and Slice binding came from, in ``main``'s attribute
        ``relax_memplan.onnx_nodes``, so that errors name the ONNX node
        (:mod:`relax_memplan.onnx_prepare.node_names`).  The module is otherwise the same.

    Returns
    -------
    mod : tvm.IRModule
        The module with function ``main`` taking the graph inputs in graph order.
    info : ImportInfo
        Shapes, dtypes, defaulted dims, opset and notes.

    Raises
    ------
    ShapeSpecError
        An unknown input name in ``shapes`` (the message lists the valid names), a wrong
        rank, a non-positive dim, or a dim contradicting a static dim of the model, or
        two values for one named dim.
    UnsupportedOperatorError
        When TVM cannot convert a node, also after upgrading a model whose default-domain
        opset is below :data:`UPGRADE_TARGET_OPSET` to that opset.
    ModelLoadError
        When the file cannot be loaded, or TVM fails outside any node's conversion.
    PrepareStepError
        When ``prepare_steps`` or ``disable_steps`` names an unknown step.
    """
    model = _as_model(model_or_path)
    plan = _plan_inputs(model, dict(shapes or {}), keep_dynamic)
    # the steps and TVM see the model as if the chosen shapes were written in it
    model = _with_input_dims(model, plan.input_dims)
    if prepare_steps is None:
        prepare_steps = onnx_prepare.STEP_NAMES
    plan.steps = onnx_prepare.select_steps(prepare_steps, disable_steps)
    opset = _default_opset(model)
    upgraded_from = None
    try:
        mod = _from_onnx_naming_node(model, plan, node_names=node_names)
    except ModelLoadError as first_error:
        if opset >= UPGRADE_TARGET_OPSET:
            raise
        try:
            upgraded = onnx.version_converter.convert_version(model, UPGRADE_TARGET_OPSET)
        except Exception:  # the converter cannot upgrade it: report TVM's original failure
            raise first_error from None
        mod = _from_onnx_naming_node(upgraded, plan, upgraded_from_opset=opset,
                                     node_names=node_names)
        upgraded_from, opset = opset, UPGRADE_TARGET_OPSET
        plan.notes.append(
            f"ONNX opset upgraded {upgraded_from} -> {opset} for import; "
            f"TVM failed on the original: {first_error}"
        )
    info = ImportInfo(
        input_shapes=plan.run_shapes,
        input_dtypes=plan.dtypes,
        defaulted_dims=plan.defaulted,
        opset=opset,
        upgraded_from_opset=upgraded_from,
        notes=tuple(plan.notes),
        dynamic_dims_kept=keep_dynamic and bool(plan.defaulted),
        fixed_dims=dict(plan.fixed),
    )
    return mod, info


def _from_onnx_naming_node(model, plan: _InputPlan, upgraded_from_opset=None,
                           node_names: bool = True) -> tvm.IRModule:
    """Prepare the model with ``plan.steps`` and run TVM's ``from_onnx``; on failure raise
    an error naming the node TVM failed on.  Notes of the steps go to ``plan.notes``.
    With ``node_names``, bindings of the guarded ops are named after their ONNX node."""
    prepared = onnx_prepare.prepare(model, plan.steps)
    model = prepared.model
    trace = _ConversionTrace()
    converters = corrected_converters(prepared.converter_steps)
    naming = name_onnx_nodes() if node_names else contextlib.nullcontext()
    # TVM prints every failing converter's inputs (whole constants) to stdout: swallow it.
    # The node naming wraps the corrected converter table, so it is entered after it.
    with converters as usage, collecting_loops() as loops, naming as named, trace, \
            contextlib.redirect_stdout(io.StringIO()):
        try:
            mod = onnx_frontend.from_onnx(
                model, shape_dict=plan.tvm_shapes, dtype_dict=plan.dtypes
            )
        except Exception as err:  # any converter failure; re-raised with the node named
            failure = err
        else:
            failure = None
    if failure is None:
        plan.notes.extend(prepared.notes)
        plan.notes.extend(describe_usage(usage))
        mod = attach_loops(mod, loops)
        return attach_node_names(mod, named) if node_names else mod
    node = trace.failing_node(model.graph, failure)
    if node is None:
        raise ModelLoadError(f"cannot import ONNX model: {summarize_error(failure)}") from failure
    raise UnsupportedOperatorError(
        node_name=node.name or node.output[0],
        op_type=node.op_type,
        opset=_domain_opset(model, node.domain),
        reason=summarize_error(failure),
        upgraded_from_opset=upgraded_from_opset,
        hint=plan.hint,
    ) from failure


class _ConversionTrace:
    """Context manager recording which ONNX node TVM 0.27's importer is converting.

    While active, ``ONNXGraphImporter._construct_nodes`` is wrapped to remember the importer
    (its ``_nodes`` table holds the outputs of every node converted so far), and
    ``ONNXGraphImporter._convert_operator`` is wrapped to remember the op type, node name,
    input expressions and ``_nodes`` table of the call that raised.  Both methods are
    restored on exit, also on error.  A lock serializes concurrent imports.
    """

    _lock = threading.Lock()

    def __init__(self):
        self.importer = None
        self.failed_call = None  # (op_type, node_name, inputs, nodes table)
        self.failed_error = None

    def __enter__(self):
        self._lock.acquire()
        importer_cls = onnx_frontend.ONNXGraphImporter
        self._saved = (importer_cls._construct_nodes, importer_cls._convert_operator)
        construct_nodes, convert_operator = self._saved
        trace = self

        def traced_construct_nodes(importer, graph):
            trace.importer = importer
            return construct_nodes(importer, graph)

        def traced_convert_operator(importer, op_name, inputs, attrs, opset):
            given_inputs = list(inputs)
            try:
                return convert_operator(importer, op_name, inputs, attrs, opset)
            except Exception as err:
                if trace.failed_error is not err:  # innermost call that raised it
                    trace.failed_error = err
                    name = attrs.get("tvm_custom", {}).get("name", "")
                    trace.failed_call = (op_name, name, given_inputs, importer._nodes)
                raise

        importer_cls._construct_nodes = traced_construct_nodes
        importer_cls._convert_operator = traced_convert_operator
        return self

    def __exit__(self, *exc_info):
        importer_cls = onnx_frontend.ONNXGraphImporter
        importer_cls._construct_nodes, importer_cls._convert_operator = self._saved
        self._lock.release()
        return False

    def failing_node(self, graph: onnx.GraphProto, error: Exception) -> onnx.NodeProto | None:
        """The node whose conversion raised ``error``, or None if no node was at fault."""
        if self.failed_call is not None and _in_chain(error, self.failed_error):
            node = _match_call(graph, *self.failed_call)
            if node is not None:
                return node
        if self.importer is not None:  # failed in _construct_nodes around a converter call
            converted = self.importer._nodes
            for node in graph.node:
                if any(name and name not in converted for name in node.output):
                    return node
            return None  # every node converted: failed while emitting the outputs
        if not isinstance(error, tvm.error.OpNotImplemented):
            return None  # failed before the node loop, e.g. while reading the inputs
        supported = _supported_op_types()
        return next((n for n in graph.node if n.op_type not in supported), None)


def _match_call(graph, op_type, name, inputs, nodes) -> onnx.NodeProto | None:
    """Find the node of a converter call by op type and name, then by input identity."""
    candidates = [n for n in _walk_nodes(graph) if n.op_type == op_type and n.name == name]
    if len(candidates) <= 1:
        return candidates[0] if candidates else None
    for node in candidates:  # unnamed nodes: same input expressions, outputs not yet made
        same_inputs = all(
            nodes.get(i) is given for i, given in zip(node.input, inputs) if i
        ) and len(node.input) == len(inputs)
        if same_inputs and not all(o in nodes for o in node.output if o):
            return node
    return candidates[0]


def _walk_nodes(graph: onnx.GraphProto):
    """Yield the nodes of ``graph`` and of its subgraphs (If/Loop bodies), depth first."""
    for node in graph.node:
        yield node
        for attr in node.attribute:
            if attr.type == onnx.AttributeProto.GRAPH:
                yield from _walk_nodes(attr.g)
            elif attr.type == onnx.AttributeProto.GRAPHS:
                for subgraph in attr.graphs:
                    yield from _walk_nodes(subgraph)


def _supported_op_types() -> set[str]:
    """ONNX op types TVM 0.27's importer converts (its converter map, plus the ops its node
    loop handles itself)."""
    return set(onnx_frontend._get_convert_map()) | {"If", "Constant"}


def unsupported_ops(model_or_path) -> dict[str, int]:
    """ONNX op types of a model (subgraphs included) that TVM's importer has no converter for.

    Parameters
    ----------
    model_or_path : onnx.ModelProto or str or os.PathLike

    Returns
    -------
    dict of str to int
        Op type -> number of nodes, sorted by op type; empty when every op has a converter
        (a converter may still refuse a node's attributes or shapes at import).
    """
    model = _as_model(model_or_path)
    supported = _supported_op_types()
    counts: dict[str, int] = {}
    for node in _walk_nodes(model.graph):
        if node.op_type not in supported:
            counts[node.op_type] = counts.get(node.op_type, 0) + 1
    return dict(sorted(counts.items()))


def _in_chain(error: BaseException, target: BaseException | None) -> bool:
    seen = set()
    while error is not None and id(error) not in seen:
        if error is target:
            return True
        seen.add(id(error))
        error = error.__cause__ or error.__context__
    return False


# ----------------------------------------------------------------------------- reference runs
def make_random_inputs(
    model, info: ImportInfo, seed: int = 0, values: dict[str, np.ndarray] | None = None
) -> dict[str, np.ndarray]:
    """Draw one array per graph input, with the shapes and dtypes in ``info``.

    Float inputs are standard normal; bool inputs are uniform in {False, True}; integer
    inputs are uniform in {0, 1} (valid token ids, masks and indices for most models),
    except an integer scalar named like a sample rate (``sr``, ``sample_rate``,
    ``sampling_rate``), which gets :data:`SAMPLE_RATE_DEFAULT_HZ`.  Models whose inputs
    need other values (e.g. silero-vad's ``sr`` selects the 16 kHz branch only when it is
    16000, else the 8 kHz one) take them from ``values``.

    Parameters
    ----------
    model : onnx.ModelProto or str or os.PathLike
        The model ``info`` came from; gives the input order.
    info : ImportInfo
        From :func:`import_onnx`.
    seed : int
        Seed of ``numpy.random.default_rng``.
    values : dict of str to numpy.ndarray, optional
        Arrays used as given (cast to the input's dtype) instead of random ones.

    Returns
    -------
    dict of str to numpy.ndarray
        Input name to array, in graph input order.

    Raises
    ------
    ShapeSpecError
        When ``values`` names an unknown input or has a shape other than
        ``info.input_shapes``.
    """
    model = _as_model(model)
    values = dict(values or {})
    names = [value.name for value in _graph_inputs(model)]
    unknown = sorted(set(values) - set(names))
    if unknown:
        raise ShapeSpecError(f"values given for unknown input(s) {unknown}; inputs: {names}")
    rng = np.random.default_rng(seed)
    arrays = {}
    for name in names:
        shape, dtype = info.input_shapes[name], np.dtype(info.input_dtypes[name])
        if name in values:
            given = np.asarray(values[name])
            try:
                array = given.astype(dtype)
            except (OverflowError, ValueError, TypeError) as err:
                raise ShapeSpecError(f"value for input '{name}' does not fit {dtype}: {err}") from None
            if given.dtype.kind in "fiub" and not np.array_equal(
                    array.astype(given.dtype), given, equal_nan=given.dtype.kind == "f"):
                raise ShapeSpecError(f"value for input '{name}' changes when cast to {dtype}")
            if array.shape != shape:
                raise ShapeSpecError(
                    f"value for input '{name}' has shape {array.shape}, expected {shape}"
                )
        elif dtype.kind == "f":
            # drawn in float32 (no float64 copy twice the size)
            array = rng.standard_normal(shape, dtype=np.float32).astype(dtype, copy=False)
        elif dtype.kind == "b":
            array = rng.integers(0, 2, size=shape).astype(dtype)
        elif dtype.kind in "iu" and shape == () and _SAMPLE_RATE_NAME.match(name):
            array = np.asarray(SAMPLE_RATE_DEFAULT_HZ, dtype=dtype)
        elif dtype.kind in "iu":
            array = rng.integers(0, 2, size=shape).astype(dtype)
        else:
            raise ShapeSpecError(f"cannot draw random values for input '{name}' of dtype {dtype}")
        arrays[name] = array
    return arrays


def run_onnxruntime(model, inputs: dict[str, np.ndarray]) -> list[np.ndarray]:
    """Run the model with onnxruntime's CPUExecutionProvider (the numerical reference).

    Pass the original model, not the opset-upgraded one: onnxruntime runs old opsets.

    Parameters
    ----------
    model : onnx.ModelProto or str or os.PathLike
        The model.
    inputs : dict of str to numpy.ndarray
        One array per graph input, e.g. from :func:`make_random_inputs`.

    Returns
    -------
    list of numpy.ndarray
        The graph outputs in graph order.

    Raises
    ------
    ImportError
        When onnxruntime is not installed.
    ReferenceRunError
        When onnxruntime cannot load the model or refuses the inputs (e.g. a token id
        beyond the vocabulary); onnxruntime's message on one line.
    """
    try:
        import onnxruntime  # pylint: disable=import-outside-toplevel
    except ImportError as err:
        raise ImportError(
            "onnxruntime is needed for reference runs: pip install 'relax_memplan[test]'"
        ) from err
    options = onnxruntime.SessionOptions()
    # fatal only: its errors reach us as exceptions (one line below), its log would repeat
    # them with colour codes, and its warnings (unused initializers) are noise here
    options.log_severity_level = 4
    source = model.SerializeToString() if isinstance(model, onnx.ModelProto) else str(model)
    try:
        session = onnxruntime.InferenceSession(
            source, sess_options=options, providers=["CPUExecutionProvider"]
        )
    except Exception as err:  # onnxruntime's own error types; one clear line
        raise ReferenceRunError(
            f"onnxruntime (the reference) cannot load the model: {_ort_message(err)}"
        ) from None
    try:
        run_options = onnxruntime.RunOptions()
        run_options.log_severity_level = 4
        return [np.asarray(out) for out in session.run(None, dict(inputs), run_options)]
    except Exception as err:  # e.g. INVALID_ARGUMENT: an index beyond the data
        at = ", ".join(f"{n}{tuple(np.shape(v))}" for n, v in inputs.items())
        raise ReferenceRunError(
            f"onnxruntime (the reference) refused the inputs ({at}): {_ort_message(err)}"
        ) from None


def _ort_message(err: BaseException) -> str:
    """onnxruntime's message without its ``[ONNXRuntimeError] : 2 : INVALID_ARGUMENT :`` prefix."""
    return re.sub(r"^\[ONNXRuntimeError\]\s*:\s*\d+\s*:\s*", "", summarize_error(err))
