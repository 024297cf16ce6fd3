"""What an ONNX model needs before compiling it (``relax-memplan inspect``).

Inputs with their dtypes and dims (symbolic dims by name; an unnamed one is called
``<input>_dim<axis>``, the name ``--dim`` takes), opsets, op counts, the ops that TVM's
importer has no converter for but one of our preparation steps converts
(:func:`relax_memplan.frontend.step_converted_ops`), the ops neither converts
(:func:`relax_memplan.frontend.unsupported_ops` with every converter step), and
``--dim`` flags to start from, one per symbolic dim. The suggested ranges are placeholders:
replace the upper end with the largest value the deployment will see.
"""

from __future__ import annotations

import re
from collections import Counter
from dataclasses import asdict, dataclass, field
from typing import Dict, List, Mapping, Optional, Sequence, Union

from ..input_shapes import static_dim
from .flags import dim_flag

__all__ = ["InputSummary", "ModelSummary", "inspect_onnx", "suggest_dim_range",
           "suggest_dim_ranges", "dim_locations", "missing_dims_advice", "loop_forms",
           "downsampling_factor"]

_BATCH = re.compile(r"batch|^n$|^b$|^N$", re.IGNORECASE)
_SEQUENCE = re.compile(r"seq|len|token|time|step|position|past|sentence", re.IGNORECASE)
_SPATIAL = re.compile(r"height|width|^h$|^w$", re.IGNORECASE)


@dataclass
class InputSummary:
    """One graph input.

    Attributes
    ----------
    name : str
    dtype : str
        Numpy dtype name (``"float32"``, ``"int64"``).
    dims : list of int or str, or None
        An int per static dim, the dim's name per symbolic one; None for an unknown rank.
    """

    name: str
    dtype: str
    dims: Union[List[Union[int, str]], None]


@dataclass
class ModelSummary:
    """What :func:`inspect_onnx` found.

    Attributes
    ----------
    model : str
    inputs : list of InputSummary
    outputs : list of str
    opsets : dict of str to int
        Opset per domain (``""`` is the default ONNX domain).
    num_nodes : int
        Nodes of the graph and its subgraphs.
    op_counts : dict of str to int
        Nodes per op type, most frequent first.
    unsupported_ops : dict of str to int
        Op types that neither TVM's importer nor a preparation step converts, with their
        node counts.
    converted_ops : dict of str to dict
        Op types TVM's importer has no converter for that a preparation step converts
        (``{"LSTM": {"step": "recurrent", "nodes": 1}}``); the step's converter may still
        refuse a node's attributes at import. ``Loop``/``Scan`` also have ``forms``
        (``{"recursive": 1}``, :func:`loop_forms`).
    symbolic_dims : list of str
        Names of the symbolic dims, in the order they first appear.
    suggested_dims : dict of str to str
        A placeholder range per symbolic dim (``"1..8"``), for ``--dim NAME=RANGE``.
    """

    model: str
    inputs: List[InputSummary]
    outputs: List[str]
    opsets: Dict[str, int]
    num_nodes: int
    op_counts: Dict[str, int]
    unsupported_ops: Dict[str, int]
    converted_ops: Dict[str, Dict] = field(default_factory=dict)
    symbolic_dims: List[str] = field(default_factory=list)
    suggested_dims: Dict[str, str] = field(default_factory=dict)

    def to_dict(self) -> Dict:
        """JSON-ready dict (``relax-memplan inspect --json``)."""
        return asdict(self)

    def dim_flags(self) -> str:
        """The suggested ``--dim`` flags on one line (empty when every dim is static)."""
        return " ".join(dim_flag(n, r) for n, r in self.suggested_dims.items())

    def format_text(self) -> str:
        """The summary as text, for the terminal."""
        lines = [f"model: {self.model}",
                 "opsets: " + ", ".join(f"{d or 'ai.onnx'} {v}" for d, v in self.opsets.items()),
                 "inputs:"]
        for inp in self.inputs:
            dims = "unknown rank" if inp.dims is None else "[" + ", ".join(map(str, inp.dims)) + "]"
            lines.append(f"  {inp.name}: {inp.dtype} {dims}")
        lines.append("outputs: " + ", ".join(self.outputs))
        lines.append(f"ops ({self.num_nodes} nodes): "
                     + ", ".join(f"{op} {n}" for op, n in self.op_counts.items()))
        if self.converted_ops:
            lines.append("ops imported through relax_memplan's converters: " + ", ".join(
                f"{op} ({c['nodes']} node{'s' if c['nodes'] > 1 else ''}, step {c['step']}"
                + _forms_text(c.get("forms")) + ")" for op, c in self.converted_ops.items()))
        if self.unsupported_ops:
            lines.append("ops TVM cannot import: " + ", ".join(
                f"{op} ({n} node{'s' if n > 1 else ''})" for op, n in self.unsupported_ops.items()))
        else:
            lines.append("ops TVM cannot import: none (every op has a converter)"
                         if not self.converted_ops else
                         "ops TVM cannot import: none (with relax_memplan's converters)")
        if self.suggested_dims:
            lines.append("symbolic dims: " + ", ".join(self.symbolic_dims))
            lines.append(f"suggested flags (placeholder ranges: set the upper ends to the largest "
                         f"values you will run): {self.dim_flags()}")
        else:
            lines.append("symbolic dims: none (every input shape is static)")
        return "\n".join(lines)


_FORM_WORDS = {"unrolled": "unrolled", "recursive": "recursive: a body function per iteration"}


def _forms_text(forms) -> str:
    """``": 1 recursive: a body function per iteration"`` for a loop op's forms; ``""``."""
    if not forms:
        return ""
    return ": " + ", ".join(f"{n} {_FORM_WORDS.get(form, form)}" for form, n in forms.items())


def _constants(graph) -> Dict[str, object]:
    """Name -> numpy value of the graph's initializers and Constant node outputs."""
    from onnx import numpy_helper

    values = {t.name: numpy_helper.to_array(t) for t in graph.initializer}
    for node in graph.node:
        if node.op_type == "Constant":
            for attr in node.attribute:
                if attr.name == "value":
                    values[node.output[0]] = numpy_helper.to_array(attr.t)
    return values


def _static_dim(graph, name: str, axis: int):
    """The int extent of ``name`` at ``axis`` from the graph's declared shapes, else None."""
    for value in list(graph.input) + list(graph.value_info) + list(graph.output):
        if value.name == name:
            dims = value.type.tensor_type.shape.dim
            if axis < len(dims) and static_dim(dims[axis]) is not None:
                return int(dims[axis].dim_value)
    return None


def loop_forms(onnx_model) -> Dict[str, Dict[str, int]]:
    """``Loop``/``Scan`` of the main graph -> form -> nodes, the form the ``unroll_loops`` step
    gives them (:mod:`relax_memplan.onnx_prepare.loops`): ``unrolled`` when the trip count is a
    graph constant (a Scan: a declared static length, forward) of at most
    :data:`~relax_memplan.onnx_prepare.loops.MAX_UNROLLED_ITERATIONS`, else ``recursive``.
    Read from the graph before import: a trip count that constant folding computes counts as
    recursive here (newcomer trial: inspect named ``unroll_loops`` for a loop that takes the
    recursive form)."""
    from ..onnx_prepare.loops import MAX_UNROLLED_ITERATIONS

    graph = onnx_model.graph
    constants = _constants(graph)
    forms: Dict[str, Dict[str, int]] = {}
    for node in graph.node:
        attrs = {a.name: a for a in node.attribute}
        if node.op_type == "Loop":
            trip = constants.get(node.input[0]) if node.input and node.input[0] else None
            count = int(trip.reshape(-1)[0]) if trip is not None and trip.size else None
        elif node.op_type == "Scan":
            num_scan = attrs["num_scan_inputs"].i if "num_scan_inputs" in attrs else 0
            axes = list(attrs["scan_input_axes"].ints) if "scan_input_axes" in attrs else []
            reverse = any(v for k in ("scan_input_directions", "scan_output_directions")
                          if k in attrs for v in attrs[k].ints)
            first = node.input[len(node.input) - num_scan] if num_scan else ""
            count = None if reverse or not first else _static_dim(graph, first,
                                                                   axes[0] if axes else 0)
        else:
            continue
        form = "unrolled" if count is not None and count <= MAX_UNROLLED_ITERATIONS \
            else "recursive"
        entry = forms.setdefault(node.op_type, {})
        entry[form] = entry.get(form, 0) + 1
    return forms


def suggest_dim_range(name: str) -> str:
    """A placeholder ``LO..HI[:STEP]`` for a symbolic dim, from its name: ``1..8`` for a batch,
    ``1..128`` for a sequence length or the like, ``32..320:32`` for an image height or width
    (CNNs with stride 32 take multiples of 32), ``1..64`` otherwise."""
    if _BATCH.search(name):
        return "1..8"
    if _SPATIAL.search(name):
        return "32..320:32"
    if _SEQUENCE.search(name):
        return "1..128"
    return "1..64"


_STRIDED = ("Conv", "ConvInteger", "QLinearConv", "MaxPool", "AveragePool", "LpPool")


def downsampling_factor(graph) -> int:
    """The largest product of spatial strides on a path from the graph's inputs (``Conv``
    and pooling ``strides``); an image side must be a multiple of it for the feature maps
    of different scales to line up again (FPN/YOLO necks: a ``Resize`` or strided conv
    output added or concatenated to a finer map). A strided op multiplies the factor of its
    data input, an upsampling (``Resize``/``Upsample`` with constant scales,
    ``ConvTranspose``) divides it, other ops take the largest of their inputs'. 32 for
    ppocrv4-det and yolov8n; 1 without strided ops.
    """
    constants = _constants(graph)
    factor: Dict[str, int] = {}
    for node in graph.node:
        f = max((factor.get(name, 1) for name in node.input[:1] if name), default=1)
        if node.op_type not in _STRIDED + _UPSAMPLING:  # elementwise, Concat, ...: the max
            f = max((factor.get(name, 1) for name in node.input if name), default=1)
        elif node.op_type in _STRIDED:
            f *= _stride(node)
        elif node.op_type == "ConvTranspose":
            f = max(1, f // _stride(node))
        else:  # Resize / Upsample with constant scales
            scales = [constants.get(name) for name in node.input[1:] if name]
            scales = [x for x in scales if x is not None and x.dtype.kind == "f" and x.size]
            f = max(1, f // max(1, int(max(scales[0].reshape(-1))))) if scales else f
        for name in node.output:
            factor[name] = f
    return max(factor.values(), default=1)


_UPSAMPLING = ("ConvTranspose", "Resize", "Upsample")


def _stride(node) -> int:
    """The largest of a node's ``strides`` (1 without)."""
    strides = [list(a.ints) for a in node.attribute if a.name == "strides"]
    return max(strides[0], default=1) if strides else 1


def _image_dims(input_dims: Mapping[str, Optional[Sequence]], factor: int) -> Dict[str, str]:
    """Suggested ranges for the symbolic N, H and W of 4-D inputs (NCHW) when the model has
    strides: ``1..8`` for N, H and W on the downsampling grid (``32..320:32`` for 32)."""
    if factor <= 1:
        return {}
    images = [dims for dims in input_dims.values() if dims is not None and len(dims) == 4]
    batch = {dims[0]: "1..8" for dims in images if isinstance(dims[0], str)}
    return {**batch, **{d: f"{factor}..{10 * factor}:{factor}" for dims in images
                        for d in dims[2:] if isinstance(d, str)}}


def suggest_dim_ranges(input_dims: Mapping[str, Optional[Sequence]], graph) -> Dict[str, str]:
    """A placeholder ``--dim`` range per symbolic dim of the inputs, in order of appearance:
    by the dim's name (:func:`suggest_dim_range`), and for the N, H, W of an image input on
    the model's downsampling grid (:func:`downsampling_factor`), whatever their names.

    Parameters
    ----------
    input_dims : mapping of str to sequence of (int or str), or None
        Each input's dims (a name per symbolic dim), by input name.
    graph : onnx.GraphProto
    """
    symbolic = list(dict.fromkeys(d for dims in input_dims.values() for d in dims or ()
                                  if isinstance(d, str)))
    return {**{name: suggest_dim_range(name) for name in symbolic},
            **_image_dims(input_dims, downsampling_factor(graph))}


def dim_locations(input_dims: Mapping[str, Optional[Sequence]]) -> Dict[str, str]:
    """Where each symbolic dim first appears: ``{"s27": "axis 1 of input_ids"}`` (a name like
    ``s27`` says nothing; the input and axis say what it is)."""
    where: Dict[str, str] = {}
    for name, dims in input_dims.items():
        for axis, d in enumerate(dims or ()):
            if isinstance(d, str) and d not in where:
                where[d] = f"axis {axis} of {name}"
    return where


def missing_dims_advice(missing: Sequence[str], input_dims: Mapping[str, Optional[Sequence]],
                        graph=None, model=None) -> str:
    """What to type for symbolic dims given no ``--dim`` range: ``"missing --dim for s27 (axis 1
    of input_ids); add --dim s27=1..64 (placeholder range: ...), or --dim s27=1..1 to keep it
    fixed"``. Ranges as ``inspect`` suggests them with the ONNX ``model``
    (:func:`~relax_memplan.compile.dim_suggestions.checked_dim_ranges`), else from
    :func:`suggest_dim_ranges` (the model's grid) with ``graph``, else by name; the fixed value
    is the range's lower end (an image side on a stride-32 grid: 32)."""
    where = dim_locations(input_dims)
    if model is not None:
        from ..compile.dim_suggestions import checked_dim_ranges

        ranges = checked_dim_ranges(model, input_dims, missing)
    else:
        ranges = suggest_dim_ranges(input_dims, graph) if graph is not None else {}
    ranges = {n: ranges.get(n) or suggest_dim_range(n) for n in missing}
    them = "it" if len(missing) == 1 else "them"
    keep = " ".join(dim_flag(n, f"{r.split('..')[0]}..{r.split('..')[0]}") for n, r in ranges.items())
    return ("missing --dim for "
            + ", ".join(f"{n} ({where[n]})" if n in where else n for n in missing)
            + f"; add {' '.join(dim_flag(n, r) for n, r in ranges.items())} (placeholder "
            f"range{'s' if len(missing) > 1 else ''}: set {them} to the values you will run), "
            f"or {keep} to keep {them} fixed")


def inspect_onnx(model) -> ModelSummary:
    """Summarize an ONNX model for compiling: inputs, dims, opsets, ops, the ops our
    preparation steps convert, and the ops nothing converts.

    Parameters
    ----------
    model : onnx.ModelProto or str or os.PathLike

    Returns
    -------
    ModelSummary

    Raises
    ------
    ModelLoadError
        The file is missing or not a valid ONNX model.
    """
    import onnx

    from .. import frontend
    from ..compile.dim_suggestions import checked_dim_ranges
    from ..input_shapes import graph_inputs, input_dim_symbols
    from ..onnx_prepare import CONVERTER_STEP_NAMES

    onnx_model = model if hasattr(model, "graph") else frontend.load_onnx(model)
    graph_inputs = graph_inputs(onnx_model)
    symbols = input_dim_symbols(graph_inputs)
    inputs = []
    symbolic: List[str] = []
    for value in graph_inputs:
        elem = value.type.tensor_type.elem_type
        dtype = onnx.helper.tensor_dtype_to_np_dtype(elem).name if elem else "unknown"
        dims = symbols[value.name]
        inputs.append(InputSummary(value.name, dtype, dims))
        symbolic += [d for d in dims or () if isinstance(d, str) and d not in symbolic]
    ops = Counter(node.op_type for node in frontend._walk_nodes(onnx_model.graph))
    converted = frontend.step_converted_ops(onnx_model)
    for op, forms in loop_forms(onnx_model).items():
        if op in converted:
            converted[op]["forms"] = forms
    return ModelSummary(
        model=str(model) if not hasattr(model, "graph") else (onnx_model.graph.name or "model"),
        inputs=inputs,
        outputs=[o.name for o in onnx_model.graph.output],
        opsets={entry.domain: entry.version for entry in onnx_model.opset_import},
        num_nodes=sum(ops.values()),
        op_counts=dict(ops.most_common()),
        unsupported_ops=frontend.unsupported_ops(onnx_model, CONVERTER_STEP_NAMES),
        converted_ops=converted,
        symbolic_dims=symbolic,
        suggested_dims=checked_dim_ranges(onnx_model, {i.name: i.dims for i in inputs})
        if symbolic else {},
    )
