"""Which ONNX node a Relax binding came from, as :func:`~relax_memplan.frontend.import_onnx`
recorded it.

TVM's ONNX importer keeps no node names.  While :func:`import_onnx` runs, the results of the
converters of the ops whose errors we report and of the fusion report's anchors
(:data:`NAMED_OPS`) are traced to their bindings
(:mod:`relax_memplan.frontend.prepare.node_names`), and the function ``main`` gets the attribute
:data:`ONNX_NODES_ATTR`:

``{var name: {"op": Relax op, "onnx_op": ONNX op type, "name": node name, "output": first output}}``

Variable names are unique in a function built by one ``BlockBuilder`` (its name supply appends
``1``, ``2``... to a repeated name).  An entry is used only where the binding's op is the
recorded one, so a module changed since the import, or not imported from ONNX, falls back to
the Relax name.
"""

from __future__ import annotations

from typing import Optional

from tvm import relax

__all__ = ["ONNX_NODES_ATTR", "NAMED_OPS", "onnx_node_label", "describe_node"]

ONNX_NODES_ATTR = "relax_memplan.onnx_nodes"
"""Function attribute: Relax variable name -> the ONNX node bound to it."""

NAMED_OPS = {
    "Gather": "relax.take",
    "GatherElements": "relax.gather_elements",
    "GatherND": "relax.gather_nd",
    "ScatterElements": "relax.scatter_elements",
    "ScatterND": "relax.scatter_nd",
    "Slice": "relax.strided_slice",
    # the anchors of fusion candidates, named in the fusion report's refusals
    "MatMul": "relax.matmul",
    "Softmax": "relax.nn.softmax",
    "LayerNormalization": "relax.nn.layer_norm",
    # the other ends of candidates: residual adds, masks, scales, norm decompositions
    "Add": "relax.add",
    "Mul": "relax.multiply",
    "Div": "relax.divide",
    "Where": "relax.where",
    "ReduceMean": "relax.mean",
}
"""ONNX op type -> the Relax op its converter returns whose binding is named after the node."""


def describe_node(op_type: str, name: str, output: str) -> str:
    """``Gather node 'bert/Gather'``; ``Gather node with output 'ids'`` for an unnamed node."""
    if name:
        return f"{op_type} node '{name}'"
    return f"{op_type} node with output '{output}'"


def onnx_node_label(func: relax.Function, var: relax.Var, call: relax.Call) -> Optional[str]:
    """The ONNX node ``var = call`` came from (see :func:`describe_node`), or ``None`` when
    ``func`` carries no record of it."""
    table = func.attrs.get(ONNX_NODES_ATTR) if func.attrs is not None else None
    if table is None or var.name not in table:
        return None
    entry = table[var.name]
    if getattr(call.op, "name", None) != str(entry["op"]):
        return None
    return describe_node(str(entry["onnx_op"]), str(entry["name"]), str(entry["output"]))
