"""The scores' element-wise steps of an attention block, for
:mod:`~relax_memplan.transform._attention_match`.

Between the scores matmul and the softmax, exporters put scales, additive biases and masks
(padding, causal, relative position), boolean masks through ``where``, casts, a softcap
(``tanh``), and reshapes of the scores into windows and back. :func:`score_steps` turns that
chain (each step read by the next only, found by the matcher) into :class:`ScoreStep` entries
whose tensor operands are read at the scores' index broadcast into their shape, traced back
through views (:mod:`~relax_memplan.transform._attention_views`); or says why not
(:class:`Refusal`).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import List, Optional, Union

import tvm
from tvm import relax, tirx

from ._attention_views import (Traced, reindex, scalar_value, static_shape_values,
                               trace_back)

__all__ = ["Refusal", "ScoreStep", "score_steps", "side_read", "unread", "fmt_shape"]

_FLOATS = ("float32", "float16")


@dataclass
class Refusal:
    """A candidate left as it is: ``reason`` in words, ``bindings`` (var names) of the block."""

    reason: str
    bindings: List[str] = field(default_factory=list)


@dataclass
class ScoreStep:
    """One element-wise step applied to the scores before the softmax.

    ``op``: ``add``, ``subtract``, ``multiply``, ``divide``, ``maximum``, ``minimum`` (with
    ``operand``, scores on the left unless ``swapped``), ``where`` (``cond`` true: scores when
    not ``swapped``, else ``operand``), ``cast`` (to ``dtype``), ``tanh``. ``operand``: a float or a
    :class:`~relax_memplan.transform._attention_views.Traced` read over ``(lead, i, j)``."""

    op: str
    operand: Union[float, Traced, None] = None
    cond: Optional[Traced] = None
    swapped: bool = False
    dtype: str = "float32"


def score_steps(graph, space, lead_vars, s_shape, steps_raw):
    """The score steps with their operands' reads, or a refusal. ``steps_raw``: ((value,
    position of the scores among its arguments), var) from the matmul to the softmax."""
    index = lead_vars + [space.vars["i"], space.vars["j"]]
    shape = list(s_shape)
    steps = []
    for (value, pos), var in steps_raw:
        op = _op(value)
        out_shape = static_shape_values(var)
        if out_shape is None:
            return Refusal("scores of unknown shape")
        if op == "relax.reshape":
            index = reindex(space, index, shape, out_shape) if space.equal(
                out_shape[-1], shape[-1]) else None
            if index is None:
                return Refusal("a reshape of the scores moves the key axis")
            shape = out_shape
            continue
        if len(out_shape) != len(shape) or not all(space.equal(x, y)
                                                   for x, y in zip(out_shape, shape)):
            return Refusal(f"{_side_name(value, pos)} {_dims(value, pos)} widens the scores "
                           f"{fmt_shape(shape)}")
        if op == "relax.astype":
            steps.append(ScoreStep("cast", dtype=str(value.attrs.dtype)))
            continue
        if op == "relax.tanh":
            steps.append(ScoreStep("tanh"))
            continue
        if op == "relax.where":
            other = value.args[3 - pos]
            cond = side_read(graph, space, value.args[0], index, shape)
            operand = side_read(graph, space, other, index, shape)
            if cond is None or operand is None:
                return Refusal(unread("mask", value.args[0] if cond is None else other, shape))
            steps.append(ScoreStep("where", operand, cond, swapped=(pos == 2)))
            continue
        other = value.args[1 - pos]
        operand = side_read(graph, space, other, index, shape)
        if operand is None:
            return Refusal(unread("bias", other, shape))
        steps.append(ScoreStep(op.split(".")[-1], operand, swapped=(pos == 1)))
    return steps


def side_read(graph, space, expr, index, shape):
    """A float for a scalar constant, else the read of ``expr`` broadcast over the scores."""
    c = scalar_value(expr)
    if c is not None:
        return c
    s = static_shape_values(expr)
    if s is None or _dtype(expr) not in _FLOATS + ("bool",):
        return None
    idx = _broadcast_index(space, index, shape, s)
    if idx is None:
        return None
    return _trace(graph, space, expr, idx)


def unread(name, expr, shape) -> str:
    """Why the operand ``expr`` of a score step cannot be read by the kernel."""
    return (f"{name} {fmt_shape(static_shape_values(expr))} {_dtype(expr) or 'of unknown dtype'} "
            f"is not a float or bool tensor broadcast over the scores {fmt_shape(shape)}")


def _side_name(value, pos) -> str:
    return "mask" if _op(value) == "relax.where" else "bias"


def _dims(value, pos) -> str:
    args = value.args
    other = args[1 - pos] if len(args) == 2 else args[3 - pos]
    return fmt_shape(static_shape_values(other))


def fmt_shape(shape) -> str:
    """``(1, 12, seq, 64)``."""
    if shape is None:
        return "(?)"
    return "(" + ", ".join(str(int(d)) if isinstance(d, tirx.IntImm) else str(d)
                           for d in shape) + ")"


def _broadcast_index(space, index, chain_shape, shape):
    """Index into an operand of ``shape`` broadcast to ``chain_shape`` (right-aligned)."""
    if len(shape) > len(chain_shape):
        return None
    offs = len(chain_shape) - len(shape)
    out = []
    for k, d in enumerate(shape):
        full = chain_shape[offs + k]
        if isinstance(d, tirx.IntImm) and int(d) == 1:
            out.append(tirx.IntImm("int64", 0))
        elif space.equal(d, full):
            out.append(index[offs + k])
        else:
            return None
    return out


def _op(value) -> str:
    if isinstance(value, relax.Call) and isinstance(value.op, tvm.ir.Op):
        return value.op.name
    return ""


def _dtype(expr) -> str:
    ty = getattr(expr, "ty", None)
    return ty.dtype if isinstance(ty, relax.TensorType) else ""


def _trace(graph, space, x, index):
    return trace_back(space, x, index, graph.lookup, graph.readers,
                      stop=lambda var: var in graph.barrier)
