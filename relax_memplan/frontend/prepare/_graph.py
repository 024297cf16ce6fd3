"""Small helpers over an ONNX graph shared by the preparation steps (no TVM import)."""

from __future__ import annotations

from collections import ChainMap, defaultdict
from collections.abc import Mapping

import numpy as np
import onnx
from onnx import numpy_helper

INTEGER_TYPES = frozenset(
    {
        onnx.TensorProto.INT8,
        onnx.TensorProto.INT16,
        onnx.TensorProto.INT32,
        onnx.TensorProto.INT64,
        onnx.TensorProto.UINT8,
        onnx.TensorProto.UINT16,
        onnx.TensorProto.UINT32,
        onnx.TensorProto.UINT64,
    }
)


class ConstantValues(Mapping):
    """Name -> value of the constants of a graph, each initializer turned into a NumPy array
    only when it is read: a step that asks for a few small ones (shape arithmetic) does not
    copy every weight of a 500 MB model."""

    def __init__(self, initializers: dict, nodes: dict):
        self._initializers = initializers  # name -> TensorProto, not yet converted
        self._values = nodes  # name -> ndarray (Constant nodes, converted ones)

    def __getitem__(self, name: str) -> np.ndarray:
        if name not in self._values:
            self._values[name] = numpy_helper.to_array(self._initializers[name])
        return self._values[name]

    def __contains__(self, name) -> bool:
        return name in self._values or name in self._initializers

    def __iter__(self):
        return iter({**dict.fromkeys(self._initializers), **dict.fromkeys(self._values)})

    def __len__(self) -> int:
        return len(set(self._initializers) | set(self._values))

    def data_type(self, name: str) -> int:
        """The ``TensorProto`` element type of ``name`` without converting it."""
        if name in self._initializers:
            return self._initializers[name].data_type
        return onnx.helper.np_dtype_to_tensor_dtype(self._values[name].dtype)


def constant_values(graph: onnx.GraphProto) -> ConstantValues:
    """Values known before the graph runs: initializers that are not also graph inputs
    (those are overridable defaults) and outputs of ``Constant`` nodes with a ``value``;
    initializers are converted when first read (:class:`ConstantValues`)."""
    overridable = {value.name for value in graph.input}
    initializers = {init.name: init for init in graph.initializer
                    if init.name not in overridable}
    nodes = {}
    for node in graph.node:
        if node.op_type == "Constant" and node.domain in ("", "ai.onnx"):
            value = _constant_node_value(node)
            if value is not None:
                nodes[node.output[0]] = value
                initializers.pop(node.output[0], None)
    return ConstantValues(initializers, nodes)


class _Without(Mapping):
    """``base`` less ``names`` (a subgraph's own inputs hide the outer values they shadow)."""

    def __init__(self, base: Mapping, names: set):
        self._base, self._names = base, names

    def __getitem__(self, name):
        if name in self._names:
            raise KeyError(name)
        return self._base[name]

    def __contains__(self, name) -> bool:
        return name not in self._names and name in self._base

    def __iter__(self):
        return (name for name in self._base if name not in self._names)

    def __len__(self) -> int:
        return sum(1 for _ in self)


def scope_values(graph: onnx.GraphProto, outer: Mapping) -> ChainMap:
    """The values known in ``graph``: those a step adds (written to the first map), its
    constants (:func:`constant_values`), then ``outer``'s (an enclosing graph's) that its own
    inputs do not shadow; nothing converted before it is read."""
    own_inputs = {value.name for value in graph.input}
    return ChainMap({}, constant_values(graph), _Without(outer, own_inputs))


def _constant_node_value(node: onnx.NodeProto) -> np.ndarray | None:
    for attr in node.attribute:
        if attr.name == "value":
            return numpy_helper.to_array(attr.t)
        if attr.name == "value_int":
            return np.asarray(attr.i, np.int64)
        if attr.name == "value_ints":
            return np.asarray(list(attr.ints), np.int64)
        if attr.name == "value_float":
            return np.asarray(attr.f, np.float32)
        if attr.name == "value_floats":
            return np.asarray(list(attr.floats), np.float32)
    return None  # sparse or string constants: left alone


def consumers(graph: onnx.GraphProto) -> dict[str, list[tuple[onnx.NodeProto, int]]]:
    """Value name to the (node, input index) pairs reading it in ``graph`` itself.

    Names read inside subgraphs (If/Loop bodies) are recorded with index -1, so a value
    used by a subgraph is never treated as unused.
    """
    readers = defaultdict(list)
    for node in graph.node:
        for index, name in enumerate(node.input):
            if name:
                readers[name].append((node, index))
        for name in subgraph_reads(node):
            readers[name].append((node, -1))
    return readers


def subgraph_reads(node: onnx.NodeProto) -> set[str]:
    """Names a node's subgraphs (If/Loop/Scan bodies) read from enclosing scopes."""
    names = set()
    for attr in node.attribute:
        graphs = [attr.g] if attr.type == onnx.AttributeProto.GRAPH else list(attr.graphs)
        for graph in graphs:
            defined = {v.name for v in graph.input} | {i.name for i in graph.initializer}
            for inner in graph.node:
                names.update(n for n in inner.input if n and n not in defined)
                names.update(n for n in subgraph_reads(inner) if n not in defined)
                defined.update(inner.output)
    return names


def subgraphs(node: onnx.NodeProto) -> list[onnx.GraphProto]:
    """The subgraphs (If branches, Loop/Scan bodies) held in a node's attributes."""
    bodies = []
    for attr in node.attribute:
        if attr.type == onnx.AttributeProto.GRAPH:
            bodies.append(attr.g)
        elif attr.type == onnx.AttributeProto.GRAPHS:
            bodies.extend(attr.graphs)
    return bodies


def has_subgraph(node: onnx.NodeProto) -> bool:
    return any(
        attr.type in (onnx.AttributeProto.GRAPH, onnx.AttributeProto.GRAPHS)
        for attr in node.attribute
    )


def default_opset(model: onnx.ModelProto) -> int:
    for entry in model.opset_import:
        if entry.domain in ("", "ai.onnx"):
            return entry.version
    return 1
