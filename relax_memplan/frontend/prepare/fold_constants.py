"""Step ``fold_constants``: replace nodes whose value is known before the model runs.

A node is folded when every input is a constant (an initializer that is not a graph
input, a ``Constant`` output, or an output folded earlier), when it is a ``Shape``
of a tensor whose selected dims are all static after ONNX shape inference, or when it is
a ``Constant`` given by ``value_int(s)``/``value_float(s)`` (TVM reads only ``value``).  Its outputs
become initializers, evaluated with ``onnx.reference.ReferenceEvaluator``.

Why: TVM 0.27's converters have gaps on constant inputs that a folded model never
reaches, e.g. ``ConstantOfShape`` of an empty shape (a scalar: "broadcast_to expects
the input shape to have the number of ndim at least ..."), and shape arithmetic on static
dims is cheaper as a constant.  Dynamic dims are never folded.

Nodes inside ``If``/``Loop``/``Scan`` bodies are folded the same way (a body also sees
the constants of the graphs around it; its folded values become the body's
initializers): TVM reads e.g. ``Pad``'s ``pads`` only as a constant, in a branch too
("Dynamic pads are not supported yet").

Run it first: later steps see fewer nodes.  Random ops, nodes with subgraphs (their
bodies are folded inside), nodes of other domains and nodes producing (sub)graph
outputs are left alone, and so is any node whose outputs would exceed
``max_folded_bytes``.
"""

from __future__ import annotations

from collections import Counter

import numpy as np
import onnx
from onnx import helper, numpy_helper
from onnx.reference import ReferenceEvaluator

from ..input_shapes import static_dim
from ..weightless import weightless_copy
from ._graph import consumers, has_subgraph, scope_values, subgraph_reads, subgraphs

__all__ = ["FoldConstants"]

_NONDETERMINISTIC = frozenset(
    {"RandomNormal", "RandomNormalLike", "RandomUniform", "RandomUniformLike", "Multinomial",
     "Bernoulli"}
)


class FoldConstants:
    """Fold constant nodes and ``Shape`` of static dims into initializers.

    Parameters
    ----------
    max_folded_bytes : int
        Largest total size, in bytes, of one node's folded outputs; bigger ones stay nodes
        (a folded ``Expand`` of a weight would otherwise duplicate it).
    """

    name = "fold_constants"

    def __init__(self, max_folded_bytes: int = 1 << 20):
        self.max_folded_bytes = max_folded_bytes

    def __call__(self, model: onnx.ModelProto) -> tuple[onnx.ModelProto, str]:
        model = _copy(model)
        folded = Counter()
        removed = self._fold_graph(
            model.graph, {}, _static_shapes(model), list(model.opset_import), folded
        )
        if not folded:
            return model, ""
        counts = ", ".join(f"{op} {n}" for op, n in sorted(folded.items()))
        return model, (
            f"folded {sum(folded.values())} nodes into constants ({counts}); "
            f"removed {removed} unused constants"
        )

    def _fold_graph(self, graph, outer_known, static_shapes, opsets, folded: Counter) -> int:
        """Fold the nodes of ``graph`` and, recursively, of its nodes' subgraphs (If/Loop
        bodies, which also see ``outer_known``), in place; count folds in ``folded``.

        Returns
        -------
        int
            The number of constants that folding left unused and that were removed.
        """
        known = scope_values(graph, outer_known)
        graph_outputs = {value.name for value in graph.output}
        before = sum(folded.values())
        kept_nodes, new_initializers, removed = [], [], 0
        for node in graph.node:
            values = None
            if _foldable(node, graph_outputs):
                if node.op_type == "Shape":
                    values = _static_shape_value(node, static_shapes)
                elif node.op_type == "Constant":
                    values = _attribute_constant(node, known)
                elif all(
                    name in known for name in node.input if name
                ) and not _surely_too_large(node, static_shapes, self.max_folded_bytes):
                    values = _evaluate(node, known, opsets)
            if values is None or sum(v.nbytes for v in values) > self.max_folded_bytes:
                for body in subgraphs(node):
                    removed += self._fold_graph(body, known, static_shapes, opsets, folded)
                kept_nodes.append(node)
                continue
            folded[node.op_type] += 1
            for name, value in zip(node.output, values):
                known[name] = value
                new_initializers.append(numpy_helper.from_array(value, name))
        if sum(folded.values()) == before:
            return removed
        del graph.node[:]
        graph.node.extend(kept_nodes)
        graph.initializer.extend(new_initializers)
        return removed + _drop_unused_constants(graph)


def _copy(model: onnx.ModelProto) -> onnx.ModelProto:
    copy = onnx.ModelProto()
    copy.CopyFrom(model)
    return copy


def _foldable(node: onnx.NodeProto, graph_outputs: set[str]) -> bool:
    return (
        node.domain in ("", "ai.onnx")
        and node.op_type not in _NONDETERMINISTIC
        and not has_subgraph(node)
        and not any(name in graph_outputs for name in node.output)
    )


def _static_shapes(model: onnx.ModelProto) -> dict[str, list[int | None]]:
    """Value name to its inferred dims (None where dynamic), from ONNX shape inference."""
    # the weights' bytes are not sent: inference reads their dims (and small constants' values)
    lean, _ = weightless_copy(model)
    try:
        inferred = onnx.shape_inference.infer_shapes(lean, data_prop=True)
    except Exception:  # inference is best effort; without it only constants fold
        inferred = lean
    shapes = {}
    _collect_static_shapes(inferred.graph, shapes)
    return shapes


def _collect_static_shapes(graph: onnx.GraphProto, shapes: dict) -> None:
    """Add the typed values of ``graph`` and of its subgraphs to ``shapes`` (ONNX names
    are unique across a model's nested graphs)."""
    for value in list(graph.input) + list(graph.value_info) + list(graph.output):
        tensor_type = value.type.tensor_type
        if value.type.HasField("tensor_type") and tensor_type.HasField("shape"):
            shapes[value.name] = [static_dim(d) for d in tensor_type.shape.dim]
    for init in graph.initializer:
        shapes[init.name] = list(init.dims)
    for node in graph.node:
        for body in subgraphs(node):
            _collect_static_shapes(body, shapes)


def _static_shape_value(node, static_shapes) -> list[np.ndarray] | None:
    dims = static_shapes.get(node.input[0])
    if dims is None:
        return None
    attrs = {a.name: a.i for a in node.attribute}
    rank = len(dims)
    start, end = attrs.get("start", 0), attrs.get("end", rank)
    start, end = (max(0, min(rank, i + rank if i < 0 else i)) for i in (start, end))
    selected = dims[start:end]
    if any(d is None for d in selected):
        return None
    return [np.asarray(selected, np.int64)]


def _attribute_constant(node, known) -> list[np.ndarray] | None:
    """The value of a ``Constant`` given as ``value_int(s)``/``value_float(s)``, which TVM
    0.27 cannot read ("no value in Constant"); None for one with a ``value`` tensor."""
    if any(attr.name == "value" for attr in node.attribute) or node.output[0] not in known:
        return None
    return [known[node.output[0]]]


def _surely_too_large(node, static_shapes, max_bytes: int) -> bool:
    """Whether shape inference says an output has more than ``max_bytes`` elements (so more
    bytes, whatever its type): evaluating it (a Transpose of a tied embedding) would only
    be thrown away."""
    for name in node.output:
        dims = static_shapes.get(name)
        if dims and all(d is not None for d in dims) and int(np.prod(dims, dtype=np.float64)) > max_bytes:
            return True
    return False


def _evaluate(node, known, opsets) -> list[np.ndarray] | None:
    """Run one node on constant inputs with the ONNX reference evaluator."""
    inputs = [name for name in node.input if name]
    graph = helper.make_graph(
        [node],
        "fold",
        [
            helper.make_tensor_value_info(
                name, helper.np_dtype_to_tensor_dtype(known[name].dtype), known[name].shape
            )
            for name in dict.fromkeys(inputs)
        ],
        [helper.make_value_info(name, onnx.TypeProto()) for name in node.output if name],
    )
    model = helper.make_model(graph, opset_imports=opsets)
    try:
        evaluator = ReferenceEvaluator(model)
        outputs = evaluator.run(None, {name: known[name] for name in inputs})
    except Exception:  # an op the reference evaluator lacks: keep the node
        return None
    if not all(isinstance(out, np.ndarray) for out in outputs):
        return None  # sequences, optionals
    return [np.asarray(out) for out in outputs]


def _drop_unused_constants(graph: onnx.GraphProto) -> int:
    """Remove initializers and Constant nodes nothing reads any more."""
    used = set(consumers(graph)) | {value.name for value in graph.output}
    for node in graph.node:
        used |= subgraph_reads(node)
    inputs = {value.name for value in graph.input}
    # deleted where they stand: rebuilding the list would copy every kept weight
    dead_inits = [k for k, i in enumerate(graph.initializer)
                  if i.name not in used and i.name not in inputs]
    dead_nodes = [k for k, n in enumerate(graph.node)
                  if n.op_type == "Constant" and not any(o in used for o in n.output)]
    for field, dead in ((graph.initializer, dead_inits), (graph.node, dead_nodes)):
        for k in reversed(dead):
            del field[k]
    return len(dead_inits) + len(dead_nodes)
