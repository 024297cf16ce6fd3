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

from collections import Counter
from dataclasses import asdict, dataclass, field
from typing import Dict, List, Union

from ..frontend.input_shapes import static_dim
from ..frontend.flags import dim_flag
from ..frontend.suggested_ranges import graph_constants

__all__ = ["InputSummary", "ModelSummary", "inspect_onnx", "loop_forms"]


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
    gives them (:mod:`relax_memplan.frontend.prepare.loops`): ``unrolled`` when the trip count is a
    graph constant (a Scan: a declared static length, forward) of at most
    :data:`~relax_memplan.frontend.prepare.loops.MAX_UNROLLED_ITERATIONS`, else ``recursive``.
    Read from the graph before import: a trip count that constant folding computes counts as
    recursive here (so that inspect does not name ``unroll_loops`` for a loop that takes the
    recursive form)."""
    from ..frontend.prepare.loops import MAX_UNROLLED_ITERATIONS

    graph = onnx_model.graph
    constants = graph_constants(graph)
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

    from ..frontend import importer as frontend
    from ..compile.dim_suggestions import checked_dim_ranges
    from ..frontend.input_shapes import graph_inputs, input_dim_symbols
    from ..frontend.prepare import CONVERTER_STEP_NAMES

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
