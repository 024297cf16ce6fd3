"""Index maps through view operators, for :class:`~relax_memplan.transform.fuse_attention.FuseAttention`.

The fused attention kernel reads q, k, v, the score bias and mask tensors where the graph has
them, not where the matmuls read them: between a projection and the attention matmul,
exporters put reshapes (heads split from the hidden dim, batch and heads merged), transposes,
splits or gathers of one fused QKV projection, ``expand``/``tile`` repeats of the key/value
heads (grouped-query attention) and scalar scales. Every one of them is a function of the
indices, so instead of materializing each intermediate (one copy kernel and one tensor per
transpose), an element of the matmul operand at index ``idx`` is read from the source tensor at
``f(idx)``, where ``f`` is composed backward through the chain (:func:`trace_back`). The
attention output is written the same way, through the views that follow it
(:func:`trace_forward`).

Indices are lists of ``tirx`` expressions over the kernel's canonical index variables
(:class:`IndexSpace`), simplified with their ranges bound, so a chain that transposes and
transposes back, or merges ``batch * heads`` and splits them again, reads the source with
plain indices.

Operators followed backward: ``reshape``, ``permute_dims``, ``expand_dims``, ``squeeze``,
``broadcast_to``, ``strided_slice`` (constant begin and stride), ``take`` of a constant scalar
index, ``tile``, ``repeat``, an item of ``split``, and (with ``scale``) ``multiply``/``divide``
by a scalar constant, whose factor is returned. Forward: ``reshape``, ``permute_dims``,
``expand_dims``, ``squeeze``, each with a single reader.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Callable, Dict, List, Optional, Sequence, Tuple

import numpy as np
import tvm
from tvm import relax, tirx

__all__ = ["IndexSpace", "Traced", "trace_back", "trace_forward", "reindex", "scalar_value",
           "static_shape_values"]

Index = List[tirx.Expr]


class IndexSpace:
    """Canonical index variables of one attention block and an analyzer knowing their ranges.

    Parameters
    ----------
    extents : dict of str to PrimExpr
        Name -> extent: ``lead0``, ``lead1``... (the scores' leading dims), ``i`` (queries),
        ``j`` (keys), ``d`` (q/k head dim), ``e`` (v head dim).
    """

    def __init__(self, extents: Dict[str, tirx.Expr]):
        self.extents = dict(extents)
        self.vars = {n: tirx.Var(n, "int64") for n in extents}
        self.analyzer = tvm.sym.Analyzer()
        for n, v in self.vars.items():
            self.analyzer.bind(v, tvm.ir.Range.from_min_extent(
                tirx.IntImm("int64", 0), _i64(extents[n])))

    def simplify(self, index: Sequence[tirx.Expr]) -> Index:
        return [self.analyzer.simplify(_i64(x)) for x in index]

    def equal(self, a, b) -> bool:
        return self.analyzer.can_prove_equal(_i64(a), _i64(b))


@dataclass
class Traced:
    """Where a tensor's elements are read from: ``source[index]`` (times ``scale``).

    ``bindings``: the vars walked through, nearest first.
    """

    source: relax.Expr
    index: Index
    scale: float = 1.0
    bindings: List[relax.Var] = field(default_factory=list)


def _i64(x) -> tirx.Expr:
    if isinstance(x, int):
        return tirx.IntImm("int64", x)
    return x if x.ty.dtype == "int64" else tirx.Cast("int64", x)


def static_shape_values(expr) -> Optional[List[tirx.Expr]]:
    """The dims of a tensor expression's type, ``None`` when its shape is unknown."""
    ty = expr.ty if hasattr(expr, "ty") else None
    if not isinstance(ty, relax.TensorType) or ty.shape is None or ty.ndim < 0:
        return None
    if not isinstance(ty.shape, relax.ShapeExpr):
        return None
    return list(ty.shape.values)


def scalar_value(expr) -> Optional[float]:
    """The value of a one-element float constant, else ``None``."""
    if isinstance(expr, tvm.ir.GenericConst) and isinstance(expr.value, tvm.runtime.Tensor):
        value = expr.value.numpy()
        if value.size == 1 and value.dtype.kind == "f":
            return float(value.reshape(()))
    return None


def _int_value(expr) -> Optional[int]:
    if isinstance(expr, tvm.ir.GenericConst) and isinstance(expr.value, tvm.runtime.Tensor):
        value = expr.value.numpy()
        if value.ndim == 0 and value.dtype.kind in "iu":
            return int(value)
    return None


def _prod(dims):
    out = tirx.IntImm("int64", 1)
    for d in dims:
        out = out * _i64(d)
    return out


def _is_one(space: IndexSpace, d) -> bool:
    return isinstance(d, tirx.IntImm) and int(d) == 1


def reindex(space: IndexSpace, index: Index, from_shape, to_shape) -> Optional[Index]:
    """Index into a tensor of ``to_shape`` of the element at ``index`` of the same data
    viewed as ``from_shape`` (row-major); ``None`` when the element counts differ.

    Dims are matched in groups of equal products (``(b, s, 768) <-> (b, s, 12, 64)``: three
    groups, no division by a symbolic dim), size-1 dims skipped; without such a grouping the
    whole index is linearized."""
    src = [(x, d) for x, d in zip(index, from_shape) if not _is_one(space, d)]
    dst = [k for k, d in enumerate(to_shape) if not _is_one(space, d)]
    out: Index = [tirx.IntImm("int64", 0)] * len(to_shape)
    groups = _groups(space, [d for _, d in src], [to_shape[k] for k in dst])
    if groups is None:
        if not space.equal(_prod([d for _, d in src]), _prod([to_shape[k] for k in dst])):
            return None
        groups = [(len(src), len(dst))]
    a = b = 0
    for na, nb in groups:
        linear = tirx.IntImm("int64", 0)
        for x, d in src[a:a + na]:
            linear = linear * _i64(d) + _i64(x)
        dims = [to_shape[k] for k in dst[b:b + nb]]
        for m, k in enumerate(dst[b:b + nb]):
            inner = _prod(dims[m + 1:])
            value = tirx.floordiv(linear, inner) if m + 1 < nb else linear
            out[k] = tirx.floormod(value, _i64(dims[m])) if m > 0 else value
        a, b = a + na, b + nb
    return space.simplify(out)


def _groups(space, a, b) -> Optional[List[Tuple[int, int]]]:
    """Split two dim lists into consecutive groups of equal products, smallest groups first."""
    groups, i, j = [], 0, 0
    while i < len(a) and j < len(b):
        ni, nj = 1, 1
        while True:
            pa, pb = _prod(a[i:i + ni]), _prod(b[j:j + nj])
            if space.equal(pa, pb):
                break
            ca = space.analyzer.can_prove(pa < pb) if i + ni < len(a) else False
            if ca:
                ni += 1
            elif j + nj < len(b):
                nj += 1
            elif i + ni < len(a):
                ni += 1
            else:
                return None
        groups.append((ni, nj))
        i, j = i + ni, j + nj
    return groups if i == len(a) and j == len(b) else None


def _op(value) -> str:
    if isinstance(value, relax.Call) and isinstance(value.op, tvm.ir.Op):
        return value.op.name
    return ""


def _axes(values, ndim) -> List[int]:
    return [int(a) % ndim for a in values]


def _back_one(space: IndexSpace, value, index: Index, out_shape, scale: bool):
    """(input expr, its index, scale factor) of one view binding read at ``index``, or None."""
    op = _op(value)
    if not op:
        return None
    x = value.args[0]
    in_shape = static_shape_values(x)
    if in_shape is None:
        return None
    n = len(in_shape)
    if op == "relax.reshape":
        got = reindex(space, index, out_shape, in_shape)
        return None if got is None else (x, got, 1.0)
    if op == "relax.permute_dims":
        axes = (list(range(n))[::-1] if value.attrs.axes is None
                else [int(a) for a in value.attrs.axes])
        out = [None] * n
        for k, a in enumerate(axes):
            out[a] = index[k]
        return x, out, 1.0
    if op == "relax.expand_dims":
        added = set(_axes(value.attrs.axis, n + len(value.attrs.axis)))
        return x, [v for k, v in enumerate(index) if k not in added], 1.0
    if op == "relax.squeeze":
        dropped = ({k for k, d in enumerate(in_shape) if _is_one(space, d)}
                   if value.attrs.axis is None else set(_axes(value.attrs.axis, n)))
        it = iter(index)
        return x, [tirx.IntImm("int64", 0) if k in dropped else next(it) for k in range(n)], 1.0
    if op in ("relax.broadcast_to", "relax.tile", "relax.repeat"):
        return _back_repeat(space, op, value, index, in_shape)
    if op == "relax.strided_slice":
        return _back_slice(space, value, index, in_shape)
    if op == "relax.take":
        k = _int_value(value.args[1])
        if k is None:
            return None
        axis = int(value.attrs.axis) % n if value.attrs.axis is not None else None
        if axis is None or not isinstance(in_shape[axis], tirx.IntImm):
            return None
        k = k + int(in_shape[axis]) if k < 0 else k
        return x, list(index[:axis]) + [tirx.IntImm("int64", k)] + list(index[axis:]), 1.0
    if scale and op in ("relax.multiply", "relax.divide"):
        for a, c in ((0, 1), (1, 0)) if op == "relax.multiply" else ((0, 1),):
            factor = scalar_value(value.args[c])
            if factor is not None and factor != 0.0:
                src = value.args[a]
                if static_shape_values(src) is None or len(static_shape_values(src)) != len(index):
                    return None
                return src, index, factor if op == "relax.multiply" else 1.0 / factor
    return None


def _back_repeat(space, op, value, index, in_shape):
    x = value.args[0]
    n = len(in_shape)
    lead = len(index) - n
    if lead < 0:
        return None
    tail = index[lead:]
    if op == "relax.broadcast_to":
        out = [tirx.IntImm("int64", 0) if _is_one(space, d) else v for v, d in zip(tail, in_shape)]
        return x, out, 1.0
    if op == "relax.tile":
        return x, [tirx.floormod(v, _i64(d)) for v, d in zip(tail, in_shape)], 1.0
    axis = value.attrs.axis
    reps = int(value.attrs.repeats)
    if axis is None:
        return None
    axis = int(axis) % n
    out = list(tail)
    out[axis] = tirx.floordiv(out[axis], reps)
    return x, out, 1.0


def _const_ints(values) -> Optional[List[int]]:
    out = []
    for v in values:
        if isinstance(v, tirx.IntImm):
            out.append(int(v))
        elif isinstance(v, int):
            out.append(v)
        else:
            return None
    return out


def _tuple_ints(expr) -> Optional[List[int]]:
    """The ints of a Relax tuple of constant ``IntImm`` fields (strided_slice's arguments)."""
    fields = list(expr.fields) if isinstance(expr, relax.Tuple) else None
    return None if fields is None else _const_ints(fields)


def _back_slice(space, value, index, in_shape):
    """``strided_slice(x, axes, begin, end[, strides])`` with constant axes, begins, strides."""
    x, args = value.args[0], list(value.args[1:])
    if len(args) < 3:
        return None
    axes, begins = _tuple_ints(args[0]), _tuple_ints(args[1])
    strides = _tuple_ints(args[3]) if len(args) > 3 else [1] * len(axes or [])
    if axes is None or begins is None or strides is None:
        return None
    out = list(index)
    for a, begin, stride in zip(axes, begins, strides):
        a %= len(in_shape)
        if stride <= 0:
            return None
        if begin < 0:
            if not isinstance(in_shape[a], tirx.IntImm):
                return None
            begin += int(in_shape[a])
        out[a] = _i64(begin) + _i64(out[a]) * stride
    return x, out, 1.0


def trace_back(space: IndexSpace, expr, index: Index, lookup: Callable, readers: Callable,
               scale: bool = False, stop: Callable = lambda var: False) -> Traced:
    """Follow ``expr`` read at ``index`` back through view bindings (module docstring).

    Parameters
    ----------
    space : IndexSpace
    expr : relax.Expr
        The tensor read (a var, usually a matmul operand).
    index : list of PrimExpr
        The index read, one entry per dim of ``expr``.
    lookup : callable
        var -> the value bound to it, or ``None`` (a parameter).
    readers : callable
        var -> number of its readers (a scale is folded only from a var with one reader).
    scale : bool
        Fold ``multiply``/``divide`` by a scalar constant into the returned ``scale``.
    stop : callable
        var -> True to stop at it (it is read as it is).
    """
    traced = Traced(expr, space.simplify(index))
    while isinstance(traced.source, relax.Var) and not stop(traced.source):
        value = lookup(traced.source)
        if value is None:
            break
        shape = static_shape_values(traced.source)
        if shape is None:
            break
        if isinstance(value, relax.TupleGetItem):
            got = _split_item(space, value, traced.index, lookup)
        else:
            fold = scale and readers(traced.source) == 1
            got = _back_one(space, value, traced.index, shape, fold)
        if got is None:
            break
        src, idx, factor = got
        traced.bindings.append(traced.source)
        traced.source, traced.index = src, space.simplify(idx)
        traced.scale *= factor
    return traced


def _split_item(space, item, index, lookup):
    tup = item.tuple_value
    value = lookup(tup) if isinstance(tup, relax.Var) else None
    if _op(value) != "relax.split":
        return None
    x = value.args[0]
    shape = static_shape_values(x)
    if shape is None:
        return None
    axis = int(value.attrs.axis) % len(shape)
    sections = value.attrs.indices_or_sections
    if isinstance(sections, (tirx.IntImm, int)):
        n = int(sections)
        if not isinstance(shape[axis], tirx.IntImm) or int(shape[axis]) % n:
            return None
        start = int(shape[axis]) // n * item.index
    else:
        points = _const_ints(list(sections))
        if points is None:
            return None
        start = ([0] + points)[item.index]
    out = list(index)
    out[axis] = _i64(out[axis]) + start
    return x, out, 1.0


def trace_forward(space: IndexSpace, var: relax.Var, index: Index, lookup_users: Callable,
                  ) -> Tuple[relax.Var, Index, List[relax.Var]]:
    """Follow ``var`` written at ``index`` forward through views read only by the next one.

    ``lookup_users(var)`` -> list of (reader var, its value); returns the last var of the
    chain, the index there and the vars walked through (after ``var``)."""
    walked = []
    while True:
        users = lookup_users(var)
        if len(users) != 1:
            break
        user, value = users[0]
        op = _op(value)
        shape = static_shape_values(var)
        out_shape = static_shape_values(user)
        if shape is None or out_shape is None or not op or not value.args[0].same_as(var):
            break
        n = len(shape)
        if op == "relax.reshape":
            got = reindex(space, index, shape, out_shape)
        elif op == "relax.permute_dims":
            axes = (list(range(n))[::-1] if value.attrs.axes is None
                    else [int(a) for a in value.attrs.axes])
            got = [index[a] for a in axes]
        elif op == "relax.expand_dims":
            added = set(_axes(value.attrs.axis, len(out_shape)))
            it = iter(index)
            got = [tirx.IntImm("int64", 0) if k in added else next(it)
                   for k in range(len(out_shape))]
        elif op == "relax.squeeze":
            dropped = ({k for k, d in enumerate(shape) if _is_one(space, d)}
                       if value.attrs.axis is None else set(_axes(value.attrs.axis, n)))
            got = [v for k, v in enumerate(index) if k not in dropped]
        else:
            break
        if got is None:
            break
        walked.append(user)
        var, index = user, space.simplify(got)
    return var, index, walked
