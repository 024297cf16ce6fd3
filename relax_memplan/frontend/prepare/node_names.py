"""Record which ONNX node each guarded Relax binding came from.

TVM 0.27's importer passes ``attr["tvm_custom"]["name"] = node.name`` to every converter and
then forgets it: the Relax bindings get names such as ``lv12``.  Errors found later (an index
out of range, a slice past a dim) should name the ONNX node, so while :func:`name_onnx_nodes`
is active the converters of :data:`~relax_memplan.analysis.onnx_nodes.NAMED_OPS` give the Call
they return a span whose source name is the node (``Gather node 'bert/Gather'``, see
:func:`~relax_memplan.analysis.onnx_nodes.describe_node`).  :func:`attach_node_names` then
finds the bindings of those Calls in ``main`` and writes the attribute
``relax_memplan.onnx_nodes`` (Relax variable name -> node).

Nothing else changes: the Calls are not emitted by the converter (that would move each binding
from its first use to the node and lengthen live ranges), so the module is structurally the
one TVM builds, with the same binding names and order (spans are not compared).  Only Calls of
the recorded op are tagged (not a constant or a shape the converter folded to).

How the node is known: ``ONNXGraphImporter._construct_nodes`` calls
``_parse_value_proto(node)`` for each node right before converting it; that method is wrapped
to remember the node (for its first output when it has no name).  A node inside an ``If``
branch is not seen that way and is tagged only when it has a name.  ``_get_convert_map`` and
``_parse_value_proto`` are restored on exit.
"""

from __future__ import annotations

import contextlib
import threading
from dataclasses import dataclass, field
from typing import Dict, Optional

import onnx
import tvm
from tvm import relax
from tvm.relax.frontend.onnx import onnx_frontend as _tvm_onnx

from ...analysis.onnx_nodes import NAMED_OPS, ONNX_NODES_ATTR, describe_node

__all__ = ["NodeNames", "name_onnx_nodes", "attach_node_names"]

_lock = threading.Lock()


@dataclass
class NodeNames:
    """What :func:`name_onnx_nodes` recorded during one import.

    Attributes
    ----------
    nodes : dict
        Span source name given to a Call -> ``{"op", "onnx_op", "name", "output"}``.
    """

    nodes: Dict[str, Dict[str, str]] = field(default_factory=dict)


class _Naming:
    def __init__(self):
        self.node: Optional[onnx.NodeProto] = None
        self.record = NodeNames()

    def converter(self, base, op_type: str):
        """A stand-in for converter class ``base`` that tags its result with the node."""
        naming = self

        class _Named:
            @classmethod
            def get_converter(cls, opset):
                impl = base.get_converter(opset)

                def convert(bb, inputs, attr, params):
                    node, naming.node = naming.node, None
                    result = impl(bb, inputs, attr, params)
                    return naming.tag(bb, result, op_type, node, attr)

                return convert

        _Named.__name__ = f"Named{base.__name__}"
        return _Named

    def tag(self, bb, result, op_type, node, attr):
        if (not isinstance(result, relax.Call)
                or getattr(result.op, "name", None) != NAMED_OPS[op_type]):
            return result
        name = attr.get("tvm_custom", {}).get("name", "")
        seen = node is not None and node.op_type == op_type and node.name == name
        output = node.output[0] if seen and node.output else ""
        if not name and not output:
            return result  # an unnamed node inside an If branch
        label = describe_node(op_type, name, output)
        self.record.nodes[label] = {"op": NAMED_OPS[op_type], "onnx_op": op_type,
                                    "name": name, "output": output}
        span = tvm.ir.Span(tvm.ir.SourceName(label), 0, 0, 0, 0)
        # Normalized first, as the importer does right after the converter: normalizing a
        # Call whose arguments are not yet bound rebuilds it without its span.
        result = bb.normalize(result)
        return relax.Call(result.op, result.args, result.attrs, result.ty_args, span)


@contextlib.contextmanager
def name_onnx_nodes():
    """Tag the Calls that :data:`NAMED_OPS` converters return with their ONNX node while the
    block imports a model.

    Enter it inside :func:`~relax_memplan.frontend.prepare.converters.corrected_converters`
    (it wraps whatever converter table is installed).  Imports inside the block are
    serialized.

    Yields
    ------
    NodeNames
        Filled while the importer runs; pass it to :func:`attach_node_names`.
    """
    naming = _Naming()
    importer = _tvm_onnx.ONNXGraphImporter
    with _lock:
        get_map, parse_value_proto = _tvm_onnx._get_convert_map, importer._parse_value_proto

        def convert_map():
            converters = get_map()
            for op_type in NAMED_OPS:
                if op_type in converters:
                    converters[op_type] = naming.converter(converters[op_type], op_type)
            return converters

        def remember_node(self, value_proto):
            if isinstance(value_proto, onnx.NodeProto):
                naming.node = value_proto
            return parse_value_proto(self, value_proto)

        _tvm_onnx._get_convert_map, importer._parse_value_proto = convert_map, remember_node
        try:
            yield naming.record
        finally:
            _tvm_onnx._get_convert_map, importer._parse_value_proto = get_map, parse_value_proto


def attach_node_names(mod: tvm.IRModule, record: NodeNames) -> tvm.IRModule:
    """Give ``main`` of ``mod`` (as ``from_onnx`` returned it; changed in place and returned)
    the attribute ``relax_memplan.onnx_nodes``: each variable bound to a Call tagged by
    :func:`name_onnx_nodes` -> its node.  Unchanged when no binding is tagged."""
    func = mod["main"]
    table = {}
    for var, value in _bound_values(func).items():
        span = value.span if isinstance(value, relax.Call) else None
        entry = record.nodes.get(span.source_name.name) if span is not None else None
        if entry is not None and getattr(value.op, "name", None) == entry["op"]:
            table[var.name] = entry
    if table:
        mod["main"] = func.with_attr(ONNX_NODES_ATTR, table)
    return mod


def _bound_values(func: relax.Function) -> Dict[relax.Var, relax.Expr]:
    if not isinstance(func.body, relax.SeqExpr):
        return {}
    return {b.var: b.value for block in func.body.blocks for b in block.bindings
            if isinstance(b, relax.VarBinding)}
