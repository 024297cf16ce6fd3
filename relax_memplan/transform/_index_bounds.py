"""Value ranges of integer tensors in a Relax function, from constants and declared dims.

A small forward analysis for :class:`~relax_memplan.transform.CheckIndexBounds`: each tensor
gets an interval ``[lo, hi]`` of PrimExprs in the function's symbolic dims (or none when it
depends on an input's values). ``tight`` says ``hi`` is reached (e.g. ``arange(0, seq)`` reaches
``seq - 1``), so an ``hi`` past the table is a certain out-of-bounds read, not a loose bound.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Dict, Optional

import numpy as np
import tvm
from tvm import relax, tirx

__all__ = ["ValueRange", "ValueRanges"]

_SAME_VALUES = {"relax.expand_dims", "relax.reshape", "relax.broadcast_to", "relax.permute_dims",
                "relax.squeeze", "relax.flatten", "relax.astype"}
_SUBSET_OF_DATA = {"relax.take", "relax.strided_slice", "relax.dynamic_strided_slice",
                   "relax.gather_elements", "relax.gather_nd"}


@dataclass(frozen=True)
class ValueRange:
    """Every element lies in ``[lo, hi]``; ``tight``: some element equals ``hi``."""

    lo: tvm.ir.Expr
    hi: tvm.ir.Expr
    tight: bool


def _i64(value) -> tvm.ir.Expr:
    if isinstance(value, tirx.IntImm):
        return tirx.IntImm("int64", value.value)
    if tvm.ir.is_prim_expr(value):
        return value if str(value.ty) == "int64" else tirx.Cast("int64", value)
    return tirx.IntImm("int64", int(value))


def _prim(arg) -> Optional[tvm.ir.Expr]:
    """A scalar Relax argument as a PrimExpr (PrimValue or a PrimExpr passed directly)."""
    if tvm.ir.is_prim_expr(arg):
        return arg
    value = getattr(arg, "value", None)
    return value if value is not None and tvm.ir.is_prim_expr(value) else None


class ValueRanges:
    """Value ranges of the variables bound in one Relax function (computed on demand).

    Parameters
    ----------
    func : relax.Function
    analyzer : tvm.sym.Analyzer
        With the declared dim ranges bound; used to simplify.
    """

    def __init__(self, func: relax.Function, analyzer):
        self.analyzer = analyzer
        self.bindings: Dict[relax.Var, relax.Expr] = {}
        for block in func.body.blocks:
            for b in block.bindings:
                if isinstance(b, relax.VarBinding):
                    self.bindings[b.var] = b.value
        self._memo: Dict[relax.Var, Optional[ValueRange]] = {}

    def of(self, expr) -> Optional[ValueRange]:
        """The range of a tensor expression, or ``None`` if unknown."""
        if isinstance(expr, relax.Var) and not tvm.ir.is_prim_expr(expr):
            if expr not in self._memo:
                self._memo[expr] = None  # cycles cannot occur in SSA; guards deep recursion
                value = self.bindings.get(expr)
                self._memo[expr] = self._of_value(value) if value is not None else None
            return self._memo[expr]
        return self._of_value(expr)

    def _simplify(self, lo, hi, tight) -> ValueRange:
        return ValueRange(self.analyzer.simplify(lo), self.analyzer.simplify(hi), tight)

    def _of_value(self, value) -> Optional[ValueRange]:
        if isinstance(value, tvm.ir.GenericConst):
            array = value.value.numpy()
            if array.size == 0 or not np.issubdtype(array.dtype, np.integer):
                return None
            return ValueRange(_i64(array.min()), _i64(array.max()), True)
        if not isinstance(value, relax.Call) or not isinstance(value.op, tvm.ir.Op):
            return None
        name, args = value.op.name, value.args
        if name == "relax.arange":
            return self._arange(args)
        if name == "relax.shape_to_tensor":
            dims = getattr(args[0].ty, "values", None)
            if not dims:
                return None
            return self._simplify(_min(dims), _max(dims), True)
        if name in _SAME_VALUES:
            return self.of(args[0])
        if name in _SUBSET_OF_DATA:
            return self._subset(name, value)
        if name in ("relax.add", "relax.subtract", "relax.multiply"):
            return self._arith(name, args)
        if name == "relax.where":
            return self._where(args)
        return None

    def _arange(self, args) -> Optional[ValueRange]:
        start, end, step = (_prim(a) for a in args[:3])
        if start is None or end is None or not isinstance(step, tirx.IntImm) or step.value < 1:
            return None
        start, end = _i64(start), _i64(end)
        last = start + (tirx.ceildiv(end - start, _i64(step)) - 1) * _i64(step)
        return self._simplify(start, last, True)

    def _subset(self, name, call) -> Optional[ValueRange]:
        data = self.of(call.args[0])
        if data is None:
            return None
        if name == "relax.take":
            # a scalar index into shape_to_tensor(shape): exactly that dim
            src = self.bindings.get(call.args[0]) if isinstance(call.args[0], relax.Var) else None
            idx = self.of(call.args[1])
            if (isinstance(src, relax.Call) and getattr(src.op, "name", "") == "relax.shape_to_tensor"
                    and idx is not None and isinstance(idx.lo, tirx.IntImm)
                    and self.analyzer.can_prove(idx.lo == idx.hi)):
                dims = getattr(src.args[0].ty, "values", None)
                if dims and 0 <= idx.lo.value < len(dims):
                    dim = _i64(dims[idx.lo.value])
                    return ValueRange(dim, dim, True)
        return ValueRange(data.lo, data.hi, False)

    def _arith(self, name, args) -> Optional[ValueRange]:
        a, b = self.of(args[0]), self.of(args[1])
        if a is None or b is None:
            return None
        scalar = self.analyzer.can_prove(a.lo == a.hi) or self.analyzer.can_prove(b.lo == b.hi)
        tight = a.tight and b.tight and scalar
        if name == "relax.add":
            return self._simplify(a.lo + b.lo, a.hi + b.hi, tight)
        if name == "relax.subtract":
            return self._simplify(a.lo - b.hi, a.hi - b.lo, tight and self.analyzer.can_prove(b.lo == b.hi))
        nonneg = all(self.analyzer.can_prove(x >= 0) for x in (a.lo, b.lo))
        return self._simplify(a.lo * b.lo, a.hi * b.hi, tight) if nonneg else None

    def _where(self, args) -> Optional[ValueRange]:
        """``where(x < 0, x + s, x)`` (the importer's negative-index mapping) is ``x`` when
        ``x >= 0`` is proved; any other ``where`` is the union of its branches."""
        cond = self.bindings.get(args[0]) if isinstance(args[0], relax.Var) else args[0]
        if (isinstance(cond, relax.Call) and getattr(cond.op, "name", "") == "relax.less"
                and cond.args[0].same_as(args[2])):
            x = self.of(args[2])
            if x is not None and self.analyzer.can_prove(x.lo >= 0):
                return x
        a, b = self.of(args[1]), self.of(args[2])
        if a is None or b is None:
            return None
        return self._simplify(tirx.min(a.lo, b.lo), tirx.max(a.hi, b.hi), False)


def _min(dims):
    out = _i64(dims[0])
    for d in dims[1:]:
        out = tirx.min(out, _i64(d))
    return out


def _max(dims):
    out = _i64(dims[0])
    for d in dims[1:]:
        out = tirx.max(out, _i64(d))
    return out
