"""Delta debugging over a failing graph's nodes, keeping the failure class.

:func:`minimize` removes sets of top-level nodes (ddmin: halves, then quarters, ...) and keeps
a smaller graph whenever ``still_fails`` says it fails the same way. A tensor a kept node
reads but a removed node made is replaced by a graph input of the same type and shape, else
becomes a graph input itself (its shape from shape inference); every
kept tensor nothing reads becomes a graph output; inputs and initializers nothing reads are
dropped. A candidate the ONNX checker rejects is not tried.
"""

from __future__ import annotations

from typing import Callable, List, Optional, Sequence

import onnx
from onnx import helper

__all__ = ["minimize", "remove_nodes"]


def _reads(node: onnx.NodeProto) -> List[str]:
    names = [i for i in node.input if i]
    for attr in node.attribute:
        if attr.type == onnx.AttributeProto.GRAPH:
            names += [i for m in attr.g.node for i in m.input if i]
    return names


def _rename(node: onnx.NodeProto, names: dict) -> onnx.NodeProto:
    """A copy of ``node`` reading ``names[x]`` for each ``x`` in ``names`` (branches too)."""
    new = onnx.NodeProto()
    new.CopyFrom(node)
    new.input[:] = [names.get(i, i) for i in new.input]
    for attr in new.attribute:
        if attr.type == onnx.AttributeProto.GRAPH:
            for inner in attr.g.node:
                inner.input[:] = [names.get(i, i) for i in inner.input]
    return new


def _reconnect(nodes, made, graph_inputs, types):
    """``nodes`` reading, for each tensor no kept node makes, a graph input of the same type
    and shape instead where there is one (else the tensor will become an input itself)."""
    by_type = {}
    for vi in graph_inputs:
        by_type.setdefault(vi.type.SerializeToString(), vi.name)
    names = {}
    for name in {r for n in nodes for r in _reads(n)} - made:
        vi = types.get(name)
        other = by_type.get(vi.type.SerializeToString()) if vi is not None else None
        if other is not None and other != name and vi not in graph_inputs:
            names[name] = other
    return [_rename(n, names) for n in nodes] if names else nodes


def remove_nodes(model: onnx.ModelProto, keep: Sequence[int]) -> Optional[onnx.ModelProto]:
    """The model with only the top-level nodes at indices ``keep``, or None when not valid.

    Parameters
    ----------
    model : onnx.ModelProto
    keep : sequence of int
        Indices into ``model.graph.node``.

    Returns
    -------
    onnx.ModelProto or None
    """
    inferred = onnx.shape_inference.infer_shapes(model)
    g = inferred.graph
    types = {v.name: v for v in list(g.value_info) + list(g.input) + list(g.output)}
    nodes = [g.node[k] for k in sorted(keep)]
    if not nodes:
        return None
    made = {o for n in nodes for o in n.output}
    nodes = _reconnect(nodes, made, list(g.input), types)
    read = [r for n in nodes for r in _reads(n)]
    inits = [t for t in g.initializer if t.name in read]
    have = made | {t.name for t in inits}
    inputs, seen = [], set()
    for name in read:
        if name not in have and name not in seen and name in types:
            seen.add(name)
            inputs.append(types[name])
        elif name not in have and name not in types:
            return None  # a tensor of unknown type: cannot make it an input
    outputs = [types[o] for n in nodes for o in n.output if o not in read and o in types]
    graph = helper.make_graph(nodes, g.name, inputs, outputs, inits)
    small = helper.make_model(graph, opset_imports=model.opset_import,
                              producer_name=model.producer_name)
    small.ir_version = model.ir_version
    try:
        onnx.checker.check_model(small, full_check=True)
    except Exception:  # noqa: BLE001 - any checker failure: not a valid candidate
        return None
    return small


def minimize(model: onnx.ModelProto, still_fails: Callable[[onnx.ModelProto], bool],
             max_tests: int = 64) -> onnx.ModelProto:
    """The smallest graph found that still fails (ddmin over nodes).

    Parameters
    ----------
    model : onnx.ModelProto
        A failing graph (``still_fails(model)`` is assumed true).
    still_fails : callable
        Whether a candidate fails the same way (same outcome class).
    max_tests : int
        At most this many calls of ``still_fails``.

    Returns
    -------
    onnx.ModelProto
    """
    keep = list(range(len(model.graph.node)))
    best, tests, chunks = model, 0, 2
    while len(keep) > 1 and tests < max_tests:
        size = max(1, len(keep) // chunks)
        reduced = False
        for start in range(0, len(keep), size):
            rest = keep[:start] + keep[start + size:]
            candidate = remove_nodes(model, rest) if rest else None
            if candidate is None:
                continue
            tests += 1
            if still_fails(candidate):
                keep, best, reduced = rest, candidate, True
                chunks = max(chunks - 1, 2)
                break
            if tests >= max_tests:
                break
        if not reduced:
            if size == 1:
                break
            chunks = min(len(keep), chunks * 2)
    return best
