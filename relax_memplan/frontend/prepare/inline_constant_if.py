"""Step ``inline_constant_if``: replace an ``If`` whose condition is a constant by the
branch it takes.

torch's TorchScript exporter writes an ``If`` for a test on shapes it could not decide
while tracing: ``x.squeeze(d)`` of a dim it cannot prove 1 (``If(Shape(x)[d] == 1,
Squeeze, Identity)``), an LSTM cell's ``input.dim() == 2``.  Once the input shapes are
fixed, ``fold_constants`` makes the condition a constant, but the ``If`` stays: TVM 0.27
imports it as a Relax ``If`` whose result joins branches of different rank (unknown
rank: "size expects a tensor input, but received R.Shape(ndim=-1)", or ops left
unlowered: "CodeGenVM cannot emit this Relax operator"; silero-vad 16k op15, openwakeword's
silero_vad, akiki-vad).  The taken branch's nodes, with its initializers, move into the
enclosing graph, and an ``Identity`` gives each branch output the ``If``'s output name.

After inlining, the branch's own shape tests may become constant in turn (nested
``If``s of an LSTM cell), and a shape that ONNX shape inference could not see through a
reshape target ``fold_constants`` has just folded is static on the next inference
(akiki-vad's ``Squeeze`` test), so in a model with an ``If`` the step alternates inlining
with ``fold_constants`` until neither changes anything, at most ``max_rounds`` times.  ``If``s in subgraphs are
inlined the same way.  An ``If`` on a run-time value (silero's sample rate input ``sr``)
is left alone, and so is a branch that defines a name the enclosing graph already has.

Run after ``fold_constants``.
"""

from __future__ import annotations

import numpy as np
import onnx
from onnx import helper

from ._graph import scope_values, subgraphs
from .fold_constants import FoldConstants

__all__ = ["InlineConstantIf"]


class InlineConstantIf:
    """Inline ``If`` nodes with a constant condition (and fold what that makes constant).

    Parameters
    ----------
    max_rounds : int
        Most rounds of inlining followed by constant folding.
    """

    name = "inline_constant_if"

    def __init__(self, max_rounds: int = 8):
        self.max_rounds = max_rounds

    def __call__(self, model: onnx.ModelProto) -> tuple[onnx.ModelProto, str]:
        if not _has_if(model.graph):
            return model, ""  # unchanged: no copy of the weights
        copy = onnx.ModelProto()
        copy.CopyFrom(model)
        inlined = 0
        for _ in range(self.max_rounds):
            count = _inline_graph(copy.graph, {})
            inlined += count
            copy, folded = FoldConstants()(copy)
            if not count and not folded:
                break
        if not inlined:  # what folding alone changed is fold_constants' to do (or not)
            return model, ""
        return copy, f"inlined {inlined} If node(s) with a constant condition"


def _inline_graph(graph: onnx.GraphProto, outer_known: dict) -> int:
    """Inline the constant ``If`` nodes of ``graph`` and of its subgraphs, in place; the
    number inlined."""
    known = scope_values(graph, outer_known)
    defined = _defined_names(graph)
    count = 0
    nodes = []
    for node in graph.node:
        branch = _taken_branch(node, known)
        if branch is not None and not (_defined_names(branch) & defined):
            nodes.extend(branch.node)
            graph.initializer.extend(branch.initializer)
            nodes.extend(helper.make_node("Identity", [inner.name], [outer],
                                          name=f"{node.name or node.output[0]}/{outer}")
                         for inner, outer in zip(branch.output, node.output) if outer)
            count += 1
            continue
        for body in subgraphs(node):
            count += _inline_graph(body, known)
        nodes.append(node)
    if count:
        del graph.node[:]
        graph.node.extend(nodes)
    return count


def _taken_branch(node: onnx.NodeProto, known: dict) -> onnx.GraphProto | None:
    """The branch a constant-condition ``If`` takes, else None."""
    if node.op_type != "If" or node.domain not in ("", "ai.onnx") or node.input[0] not in known:
        return None
    condition = np.asarray(known[node.input[0]])
    if condition.size != 1:
        return None
    wanted = "then_branch" if bool(condition.reshape(())) else "else_branch"
    return next((attr.g for attr in node.attribute if attr.name == wanted), None)


def _has_if(graph: onnx.GraphProto) -> bool:
    return any(node.op_type == "If" or any(_has_if(body) for body in subgraphs(node))
               for node in graph.node)


def _defined_names(graph: onnx.GraphProto) -> set[str]:
    """Names that nodes and initializers of ``graph`` itself define."""
    names = {init.name for init in graph.initializer}
    for node in graph.node:
        names.update(name for name in node.output if name)
    return names
