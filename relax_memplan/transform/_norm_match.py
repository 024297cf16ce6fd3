"""Layer norms and RMS norms found by their structure, for
:class:`~relax_memplan.transform.fuse_normalization.FuseNormalization`.

A candidate is a ``mean`` of a square (``t * t`` or ``power(t, 2)``): the variance of a layer
norm when ``t = x - mean(x)``, else the mean square of an RMS norm of ``t``. Walking forward
from it, the normalization is

* ``v + eps`` (either order, ``eps`` a one-element float constant), then
* ``t / sqrt(v + eps)``, ``t * rsqrt(v + eps)``, ``t * (1 / sqrt(v + eps))``
  (ONNX ``Reciprocal`` imports as ``1 / x``) or ``t * power(v + eps, -0.5)``, the product in
  either order;
* optionally a cast to the same dtype, then ``* gamma`` (either order) and, for a layer norm,
  ``+ beta`` (either order), where gamma and beta hold ``hidden`` values (shape ``(hidden,)``
  or with leading ones) and give the same shape as ``x``;
* or, for a layer norm, TensorFlow's batch-norm formula (Keras ``LayerNormalization`` through
  tf2onnx), where the centred values are only squared: ``inv = rsqrt(v + eps) [* gamma]``,
  ``y = x * inv + (beta - m * inv)`` (``+ -(m * inv)`` or ``- m * inv`` without beta).

Both means reduce the last axis alone with ``keepdims``; a cast to the same dtype (what
``x.to(torch.float32)`` exports for a float32 model) between ``t`` and the product is looked
through. Every intermediate is read inside the chain only; gamma and beta are taken only where
the product before them has no other reader (else the norm ends before them and they stay
element-wise operations after it).

The result is a :class:`NormMatch` (``anchor``: the last var of the chain, whose binding the
norm op replaces), or a :class:`NormRefusal` with a reason code (:data:`REASONS`).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import List, Optional

import tvm
from tvm import relax

from ._attention_match import FunctionGraph
from ._attention_views import scalar_value

__all__ = ["NormMatch", "NormRefusal", "REASONS", "candidates", "find_norm", "FunctionGraph"]

#: refusal code -> the words of the fusion report
REASONS = {
    "read": "an intermediate (mean, centred values, variance) is read outside the norm",
    "axes": "not reduced over the last axis alone with keepdims",
    "eps": "epsilon is not a one-element float constant",
    "dtype": "not a float32/float16 tensor of known rank",
    "form": "the mean square is not followed by + eps, sqrt and a division or product",
}

_FLOATS = ("float32", "float16")


@dataclass
class NormMatch:
    """``anchor = norm(x) [* gamma] [+ beta]`` over the last axis (module docstring)."""

    kind: str  # "layer_norm" or "rms_norm"
    x: relax.Expr
    anchor: relax.Var
    eps: float
    gamma: Optional[relax.Expr] = None
    beta: Optional[relax.Expr] = None
    bindings: List[str] = field(default_factory=list)


@dataclass
class NormRefusal:
    """A candidate left as it is: ``code`` (a key of :data:`REASONS`) and its bindings."""

    kind: str
    code: str
    bindings: List[str] = field(default_factory=list)


def _call(value, *ops) -> bool:
    return (isinstance(value, relax.Call) and isinstance(value.op, tvm.ir.Op)
            and value.op.name in ops)


def _readers(graph: FunctionGraph, var) -> int:
    """Distinct bindings (and the function's result) reading ``var``: ``d * d`` is one."""
    return len(set(graph.users.get(var, []))) + (1 if var in graph.returned else 0)


def _sole(graph: FunctionGraph, var) -> Optional[relax.Var]:
    """The one binding reading ``var``, None when there are more or it is returned."""
    users = set(graph.users.get(var, []))
    return next(iter(users)) if len(users) == 1 and var not in graph.returned else None


def _value(graph: FunctionGraph, expr):
    return graph.lookup(expr) if isinstance(expr, relax.Var) else None


def _same(a, b) -> bool:
    return a is not None and b is not None and a.same_as(b)


def _uncast(graph, expr):
    """``expr`` without a cast to its own dtype (``x.to(torch.float32)`` of a float32 x)."""
    value = _value(graph, expr)
    if _call(value, "relax.astype"):
        src = value.args[0]
        if isinstance(src.ty, relax.TensorType) and src.ty.dtype == expr.ty.dtype:
            return src
    return expr


def _square_of(graph, expr):
    """``t`` when ``expr`` is bound to ``t * t`` or ``power(t, 2)``, else None."""
    value = _value(graph, expr)
    if _call(value, "relax.multiply") and value.args[0].same_as(value.args[1]):
        return value.args[0]
    if _call(value, "relax.power") and scalar_value(value.args[1]) == 2.0:
        return value.args[0]
    return None


def _last_axis_mean(value) -> bool:
    """For a ``mean`` call: whether it reduces the last axis alone with keepdims."""
    ty = value.args[0].ty
    if not isinstance(ty, relax.TensorType) or ty.ndim < 1 or value.attrs.axis is None:
        return False
    axes = [int(a) for a in value.attrs.axis]
    return bool(value.attrs.keepdims) and axes in ([-1], [ty.ndim - 1])


def candidates(graph: FunctionGraph) -> List[relax.Var]:
    """The vars bound to a ``mean`` of a square, in program order."""
    return [v for v in graph.order if _call(graph.lookup(v), "relax.mean")
            and _square_of(graph, graph.lookup(v).args[0]) is not None]


def _other_operand(value, var):
    """The operand of a binary call other than ``var`` (None when ``var`` is not one)."""
    a, b = value.args[0], value.args[1]
    if a.same_as(var):
        return b
    if b.same_as(var):
        return a
    return None


def _hidden_param(p, x, hidden) -> bool:
    """``p`` holds ``hidden`` values of x's dtype (shape ``(hidden,)`` or leading ones)."""
    ty = p.ty
    if not isinstance(ty, relax.TensorType) or ty.shape is None or ty.dtype != x.ty.dtype:
        return False
    dims = list(ty.shape.values)
    if not dims or not tvm.sym.Analyzer().can_prove_equal(dims[-1], hidden):
        return False
    return all(isinstance(d, tvm.tirx.IntImm) and int(d) == 1 for d in dims[:-1]) \
        and len(dims) <= x.ty.ndim


def _same_shape(a, b) -> bool:
    if not (isinstance(a.ty, relax.TensorType) and isinstance(b.ty, relax.TensorType)):
        return False
    if a.ty.shape is None or b.ty.shape is None or a.ty.ndim != b.ty.ndim:
        return False
    analyzer = tvm.sym.Analyzer()
    return all(analyzer.can_prove_equal(p, q) for p, q in zip(a.ty.shape.values,
                                                              b.ty.shape.values))


def _inv_sqrt(graph, ve):
    """(``1 / sqrt(ve)`` var, [bindings]) of ``rsqrt(ve)``, ``1 / sqrt(ve)`` or
    ``power(ve, -0.5)``, each step read once; else None."""
    step = _sole(graph, ve)
    value = _value(graph, step)
    if _call(value, "relax.rsqrt") or (_call(value, "relax.power")
                                       and scalar_value(value.args[1]) == -0.5):
        return step, [step]
    if _call(value, "relax.sqrt"):
        nxt = _sole(graph, step)
        nval = _value(graph, nxt)
        if _call(nval, "relax.divide") and nval.args[1].same_as(step) and \
                scalar_value(nval.args[0]) == 1.0:
            return nxt, [step, nxt]
    return None


def _normalized(graph, ve, t):
    """(normalized var, [bindings]) of ``t / sqrt(ve)`` or ``t * r`` with ``r`` an
    :func:`_inv_sqrt` of ``ve``, each step read once; else None."""
    step = _sole(graph, ve)
    value = _value(graph, step)
    if _call(value, "relax.sqrt"):
        nxt = _sole(graph, step)
        nval = _value(graph, nxt)
        if _call(nval, "relax.divide") and nval.args[1].same_as(step) and \
                _same(_uncast(graph, nval.args[0]), _uncast(graph, t)):
            return nxt, [step, nxt]
    got = _inv_sqrt(graph, ve)
    return _times(graph, got[0], t, got[1]) if got is not None else None


def _folded(graph, ve, x, mean, hidden):
    """TensorFlow's batch-norm formula of a layer norm (Keras ``LayerNormalization`` through
    tf2onnx): ``inv = rsqrt(ve) [* gamma]``, ``y = x * inv + (beta - mean * inv)`` (or
    ``+ -(mean * inv)``, or ``x * inv - mean * inv`` without beta). (y, gamma, beta,
    [bindings]) or None."""
    got = _inv_sqrt(graph, ve)
    if got is None:
        return None
    inv, steps = got
    gamma = None
    user = _sole(graph, inv)
    if user is not None and _call(_value(graph, user), "relax.multiply"):
        gamma = _other_operand(_value(graph, user), inv)
        if gamma is None or not _hidden_param(gamma, x, hidden):
            return None
        inv, steps = user, steps + [user]
    users = set(graph.users.get(inv, []))
    if len(users) != 2 or inv in graph.returned:
        return None
    by_operand = {}
    for u in users:
        value = _value(graph, u)
        other = _other_operand(value, inv) if _call(value, "relax.multiply") else None
        if other is not None:
            by_operand["x" if _same(_uncast(graph, other), _uncast(graph, x)) else
                       "mean" if _same(other, mean) else "other"] = u
    xi, mi = by_operand.get("x"), by_operand.get("mean")
    if xi is None or mi is None:
        return None
    y, beta, shift = _sole(graph, xi), None, _sole(graph, mi)
    sval = _value(graph, shift)
    if shift is not None and shift.same_as(y) and _call(sval, "relax.subtract") and \
            sval.args[0].same_as(xi):
        return y, gamma, None, steps + [xi, mi, y]
    if _call(sval, "relax.subtract") and sval.args[1].same_as(mi):
        beta = sval.args[0]
        if not _hidden_param(beta, x, hidden):
            return None
    elif not _call(sval, "relax.negative"):
        return None
    yval = _value(graph, y)
    if not _call(yval, "relax.add") or _sole(graph, shift) is None or \
            not _sole(graph, shift).same_as(y) or _other_operand(yval, xi) is None:
        return None
    return y, gamma, beta, steps + [xi, mi, shift, y]


def _times(graph, r, t, seen):
    """(``t * r`` var, bindings) where ``r`` is read once by that product, else None."""
    nxt = _sole(graph, r)
    nval = _value(graph, nxt)
    if _call(nval, "relax.multiply"):
        other = _other_operand(nval, r)
        if other is not None and _same(_uncast(graph, other), _uncast(graph, t)):
            return nxt, seen + [nxt]
    return None


def _affine(graph, normed, x, kind):
    """(anchor, gamma, beta, extra bindings) after taking ``* gamma`` and ``+ beta``."""
    hidden = x.ty.shape.values[-1]
    through = []
    nxt = _sole(graph, normed)
    value = _value(graph, nxt)
    if _call(value, "relax.astype") and value.attrs.dtype == normed.ty.dtype:
        through = [nxt]
        nxt = _sole(graph, nxt)
        value = _value(graph, nxt)
    last = through[-1] if through else normed
    g = _other_operand(value, last) if _call(value, "relax.multiply") else None
    if g is None or not _hidden_param(g, x, hidden) or not _same_shape(nxt, x):
        return normed, None, None, []
    anchor, extra = nxt, through + [nxt]
    beta = None
    if kind == "layer_norm":
        nxt = _sole(graph, anchor)
        value = _value(graph, nxt)
        b = _other_operand(value, anchor) if _call(value, "relax.add") else None
        if b is not None and _hidden_param(b, x, hidden) and _same_shape(nxt, x):
            anchor, beta = nxt, b
            extra.append(nxt)
    return anchor, g, beta, extra


def find_norm(graph: FunctionGraph, var: relax.Var):
    """The :class:`NormMatch` whose mean square is ``var`` (a :func:`candidates` var), or a
    :class:`NormRefusal`."""
    mean = graph.lookup(var)
    square = mean.args[0]
    t = _square_of(graph, square)
    tval = _value(graph, t)
    kind, x, inner = "rms_norm", t, []
    if _call(tval, "relax.subtract"):
        first = _value(graph, tval.args[1])
        if _call(first, "relax.mean") and _same(_uncast(graph, first.args[0]),
                                                _uncast(graph, tval.args[0])):
            kind, x, inner = "layer_norm", tval.args[0], [tval.args[1], t]
    names = [v.name for v in inner + [square, var]]

    def refuse(code, more=()):
        return NormRefusal(kind, code, names + [v.name for v in more])

    if not isinstance(x.ty, relax.TensorType) or x.ty.dtype not in _FLOATS or \
            x.ty.shape is None or x.ty.ndim < 1:
        return refuse("dtype")
    if not _last_axis_mean(mean) or (kind == "layer_norm"
                                     and not _last_axis_mean(graph.lookup(inner[0]))):
        return refuse("axes")
    # TensorFlow's formula reads the mean again and the centred values only squared
    folded = kind == "layer_norm" and _readers(graph, t) == 1 and \
        _readers(graph, inner[0]) == 2
    if _readers(graph, var) != 1 or _readers(graph, square) != 1 or (
            kind == "layer_norm" and not folded and (_readers(graph, inner[0]) != 1
                                                     or _readers(graph, t) != 2)):
        return refuse("read")
    ve = _sole(graph, var)
    veval = _value(graph, ve)
    if not _call(veval, "relax.add"):
        return refuse("form")
    eps = scalar_value(_other_operand(veval, var))
    if eps is None:
        return refuse("eps", [ve])
    if _readers(graph, ve) != 1:
        return refuse("read", [ve])
    if folded:
        got = _folded(graph, ve, x, inner[0], x.ty.shape.values[-1])
        if got is None or not _same_shape(got[0], x):
            return refuse("form", [ve])
        anchor, gamma, beta, steps = got
        return NormMatch(kind, _uncast(graph, x), anchor, eps, gamma, beta,
                         names + [v.name for v in [ve] + steps])
    got = _normalized(graph, ve, t)
    if got is None:
        return refuse("form", [ve])
    normed, steps = got
    if not _same_shape(normed, x):
        return refuse("form", [ve] + steps)
    anchor, gamma, beta, extra = _affine(graph, normed, x, kind)
    # the norm reads x itself, not its cast to its own dtype: a residual add before the cast
    # then meets the norm (FuseAddLayerNorm)
    return NormMatch(kind, _uncast(graph, x), anchor, eps, gamma, beta,
                     names + [v.name for v in [ve] + steps + extra])
