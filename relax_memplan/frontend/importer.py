"""Load ONNX models and import them into Relax with concrete input shapes.

This is the first step of every pipeline: :func:`load_onnx` reads and checks a file,
:func:`import_onnx` fixes the dynamic input dimensions (from the user's shapes, else 1:
:mod:`relax_memplan.frontend.input_shapes`), calls TVM's ONNX frontend and, when TVM fails,
names the ONNX node it failed on (:class:`~relax_memplan.errors.UnsupportedOperatorError`).

Locating the failing node relies on two methods of TVM 0.27's ``ONNXGraphImporter``:
``_construct_nodes`` (loops over ``graph.node``, storing each node's outputs in the
importer's ``_nodes`` table) and ``_convert_operator`` (runs one op converter and normalizes
its result).  Both are wrapped only while :func:`import_onnx` runs; see :class:`_ConversionTrace`.
"""

from __future__ import annotations

import contextlib
import io
import os
import tempfile
import threading
from collections.abc import Iterable
from dataclasses import dataclass, field
from pathlib import Path

import onnx
import onnx.version_converter
import tvm
from tvm.relax.frontend.onnx import onnx_frontend

from ..errors import ModelLoadError, UnsupportedOperatorError, summarize_error
from . import prepare as onnx_prepare
from .input_shapes import InputPlan, plan_inputs, with_input_dims, without_negative_dims
from .weightless import save_weightless
from .prepare.converters import added_ops, corrected_converters, describe_usage
from .prepare.loop_facts import attach_loops, collecting_loops
from .prepare.node_names import attach_node_names, name_onnx_nodes

__all__ = [
    "ImportInfo",
    "load_onnx",
    "import_onnx",
    "unsupported_ops",
    "step_converted_ops",
    "UPGRADE_TARGET_OPSET",
]

UPGRADE_TARGET_OPSET = 13
"""Default-domain opset that older models are converted to when TVM fails to import them."""



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
    if not model.graph.output:  # would build an empty library and "run" to an empty .npz
        raise ModelLoadError(f"{path} has no graph outputs: there is nothing to compute")
    try:
        _check_structure(model)
    except onnx.checker.ValidationError as err:
        # the checker writes one sentence over several lines ("... of node:\nname: relu0
        # OpType: Relu\n is not output of ..."): joined, so the line names the node
        sentence = " ".join(str(err).split())
        raise ModelLoadError(f"{path} fails onnx.checker: "
                             f"{summarize_error(ValueError(sentence), max_chars=300)}") from err
    return model


def _check_structure(model: onnx.ModelProto) -> None:
    """``onnx.checker.check_model`` on the model's structure: the checker is given a
    weightless copy (:mod:`.weightless`) saved beside a sparse file of zeros, so that a 500 MB
    model is not serialized for it and parsed again in C++ (GPT-2: 0.9 s and 1 GB of peak
    memory); it checks each external tensor's file exists, not its values.

    Raises
    ------
    onnx.checker.ValidationError
        As ``check_model``.
    """
    with tempfile.TemporaryDirectory() as folder:
        path, largest = save_weightless(model, folder, "structure.onnx")
        onnx.checker.check_model(path if largest else model)  # small: checked as it is


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
        ScatterND, Slice, MatMul, Softmax and LayerNormalization binding came from, in
        ``main``'s attribute ``relax_memplan.onnx_nodes``, so that errors and the fusion
        report name the ONNX node (:mod:`relax_memplan.frontend.prepare.node_names`).  The
        module is otherwise the same.

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
    plan = plan_inputs(model, dict(shapes or {}), keep_dynamic)
    # the steps and TVM see the model as if the chosen shapes were written in it, and a
    # negative dim_value elsewhere (paddle2onnx's -1) as the unknown dim it means
    model, _ = without_negative_dims(with_input_dims(model, plan.input_dims))
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


def _from_onnx_naming_node(model, plan: InputPlan, upgraded_from_opset=None,
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
            _without_a_second_model_check(), contextlib.redirect_stdout(io.StringIO()):
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
    # the dims set to 1 may explain a converter's failure, never a missing converter
    converted = _supported_op_types() | {
        op for op, step in added_ops().items() if step in prepared.converter_steps}
    raise UnsupportedOperatorError(
        node_name=node.name or node.output[0],
        op_type=node.op_type,
        opset=_domain_opset(model, node.domain),
        reason=summarize_error(failure),
        upgraded_from_opset=upgraded_from_opset,
        hint=plan.hint if node.op_type in converted else "",
        domain=node.domain,
        unnamed=not node.name,
    ) from failure


@contextlib.contextmanager
def _without_a_second_model_check():
    """TVM's ``from_onnx`` runs ``onnx.checker.check_model`` on the model it is given and
    only warns on failure. :func:`load_onnx` has checked the model already, and the check
    serializes the whole model (GPT-2: 500 MB, 0.9 s), so it is skipped while
    ``from_onnx`` runs and restored after."""
    check = onnx.checker.check_model
    onnx.checker.check_model = lambda *_args, **_kwargs: None
    try:
        yield
    finally:
        onnx.checker.check_model = check


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


def unsupported_ops(model_or_path, steps: Iterable[str] = ()) -> dict[str, int]:
    """ONNX op types of a model (subgraphs included) that neither TVM's importer nor the
    converter steps ``steps`` have a converter for.

    Parameters
    ----------
    model_or_path : onnx.ModelProto or str or os.PathLike
    steps : iterable of str
        Converter step names (:data:`relax_memplan.frontend.prepare.CONVERTER_STEP_NAMES`) whose
        added ops count as importable (``import_onnx`` runs all of them by default); default
        none, i.e. TVM's importer alone.

    Returns
    -------
    dict of str to int
        Op type -> number of nodes, sorted by op type; empty when every op has a converter
        (a converter may still refuse a node's attributes or shapes at import).
    """
    model = _as_model(model_or_path)
    steps = set(steps)
    supported = _supported_op_types() | {op for op, s in added_ops().items() if s in steps}
    counts: dict[str, int] = {}
    for node in _walk_nodes(model.graph):
        if node.op_type not in supported:
            counts[node.op_type] = counts.get(node.op_type, 0) + 1
    return dict(sorted(counts.items()))


def step_converted_ops(model_or_path, steps: Iterable[str] | None = None) -> dict[str, dict]:
    """ONNX op types of a model that TVM's importer has no converter for but one of our
    converter steps (``recurrent``: LSTM, GRU; ``unroll_loops``: Loop, Scan) converts.

    Parameters
    ----------
    model_or_path : onnx.ModelProto or str or os.PathLike
    steps : iterable of str, optional
        The converter steps that run; default all.

    Returns
    -------
    dict of str to dict
        Op type -> ``{"step": name, "nodes": count}``, sorted by op type.
    """
    model = _as_model(model_or_path)
    chosen = set(onnx_prepare.CONVERTER_STEP_NAMES if steps is None else steps)
    added = {op: step for op, step in added_ops().items() if step in chosen}
    found: dict[str, dict] = {}
    for node in _walk_nodes(model.graph):
        if node.op_type in added:
            entry = found.setdefault(node.op_type, {"step": added[node.op_type], "nodes": 0})
            entry["nodes"] += 1
    return dict(sorted(found.items()))


def _in_chain(error: BaseException, target: BaseException | None) -> bool:
    seen = set()
    while error is not None and id(error) not in seen:
        if error is target:
            return True
        seen.add(id(error))
        error = error.__cause__ or error.__context__
    return False
