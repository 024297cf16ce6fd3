"""Symbolic dims of a Relax function: which vars its signature defines and their declared ranges.

Ranges come from the function attributes TVM already uses:
``tir_var_upper_bound`` (``{"seq": 128}``, inclusive) and
``tir_var_lower_bound`` (``{"seq": 1}``, inclusive), plus our
``relax_memplan.dim_step`` (``{"height": 32}``: only ``lower + k * step``). A dim
with no lower bound is taken as >= 0 (a shape dim); a dim with no upper bound is
unbounded.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Callable, Dict, Mapping, Optional

import tvm
from tvm import relax, tirx

__all__ = ["expr_text", "DimRange", "STEP_ATTR", "signature_dims", "declared_ranges", "evaluate_bytes", "evaluate_int",
           "int_evaluator"]


@dataclass(frozen=True)
class DimRange:
    """Declared range of one symbolic dim, inclusive at both ends (elements).

    Attributes
    ----------
    lower : int
        Smallest allowed value (0 when none was declared).
    upper : int or None
        Largest allowed value, ``None`` when unbounded.
    step : int
        Allowed values are ``lower + k * step`` (e.g. image sides that must be
        multiples of 32); 1 allows every integer.
    """

    lower: int = 0
    upper: Optional[int] = None
    step: int = 1

    def __post_init__(self):
        if self.lower < 0:
            raise ValueError(f"a dim's lower bound must be >= 0, got {self.lower}")
        if self.upper is not None and self.upper < max(self.lower, 1):
            raise ValueError(f"upper bound {self.upper} is below lower bound {self.lower} (or < 1)")
        if self.step < 1:
            raise ValueError(f"a dim's step must be >= 1, got {self.step}")

    def __contains__(self, value: int) -> bool:
        return (value >= self.lower and (self.upper is None or value <= self.upper)
                and (value - self.lower) % self.step == 0)

    def values(self, start: Optional[int] = None):
        """Allowed values from ``start`` (default ``max(lower, 1)``, moved onto the grid) to ``upper``."""
        first = max(self.lower, 1) if start is None else start
        first = self.lower + -(-(first - self.lower) // self.step) * self.step
        return range(first, self.upper + 1, self.step)

    def __str__(self) -> str:
        text = f"[{self.lower}, {'inf' if self.upper is None else self.upper}]"
        return text + (f" in steps of {self.step}" if self.step > 1 else "")


#: Function attribute (names to ints) of declared dim steps, written by ``AnnotateDimRanges``.
STEP_ATTR = "relax_memplan.dim_step"


def signature_dims(func: relax.Function) -> Dict[str, tirx.Var]:
    """Symbolic vars defined by the function's parameters, by name."""
    out: Dict[str, tirx.Var] = {}
    for p in func.params:
        for v in relax.analysis.definable_tir_vars_in_type(p.ty):
            out[v.name] = v
    return out


def _int_map(func: relax.Function, key: str) -> Dict[str, int]:
    attrs = func.attrs
    if attrs is None or key not in attrs:
        return {}
    return {str(k): int(v) for k, v in attrs[key].items()}


def declared_ranges(func: relax.Function) -> Dict[str, DimRange]:
    """Declared range of every signature dim (undeclared ones: ``[0, inf]``)."""
    upper = _int_map(func, "tir_var_upper_bound")
    lower = _int_map(func, "tir_var_lower_bound")
    step = _int_map(func, STEP_ATTR)
    return {
        name: DimRange(lower=lower.get(name, 0), upper=upper.get(name), step=step.get(name, 1))
        for name in signature_dims(func)
    }


def evaluate_bytes(expr, values: Mapping[str, int]) -> int:
    """Value of an int64 expression of symbolic dims at concrete dim values.

    Raises
    ------
    ValueError
        If a var of ``expr`` has no value in ``values``.
    """
    free = {} if isinstance(expr, tirx.IntImm) else {v.name: v for v in tirx.analysis.undefined_vars(expr)}
    missing = sorted(set(free) - set(values))
    if missing:
        raise ValueError(f"no value for dim(s) {', '.join(missing)}")
    analyzer = tvm.sym.Analyzer()
    for name, var in free.items():
        analyzer.bind(var, tirx.IntImm("int64", int(values[name])))  # shape vars are int64
    value = analyzer.simplify(expr)
    if not isinstance(value, tirx.IntImm):
        raise ValueError(f"expression {expr} did not evaluate to a constant")
    return int(value)


_BINARY = {
    "Add": lambda a, b: a + b,
    "Sub": lambda a, b: a - b,
    "Mul": lambda a, b: a * b,
    "FloorDiv": lambda a, b: a // b,
    "FloorMod": lambda a, b: a % b,
    "Max": max,
    "Min": min,
    "LE": lambda a, b: a <= b,
    "LT": lambda a, b: a < b,
    "GE": lambda a, b: a >= b,
    "GT": lambda a, b: a > b,
    "EQ": lambda a, b: a == b,
    "NE": lambda a, b: a != b,
    "And": lambda a, b: a and b,
    "Or": lambda a, b: a or b,
}


def evaluate_int(expr, values: Mapping[str, int]) -> int:
    """Fast evaluation of an integer expression (shape arithmetic) at concrete dims.

    Handles the node kinds shape arithmetic uses (``+ - * // % max min``,
    comparisons, ``and``/``or``, ``Select``, casts) in plain Python, which is
    much faster than :func:`evaluate_bytes` for many small evaluations; any
    other node falls back to the arithmetic analyzer.

    Raises
    ------
    ValueError
        If a var has no value in ``values``.
    """
    kind = type(expr).__name__
    if kind == "IntImm":
        return int(expr)
    if kind == "Var":
        if expr.name not in values:
            raise ValueError(f"no value for dim {expr.name}")
        return int(values[expr.name])
    if kind in _BINARY:
        return _BINARY[kind](evaluate_int(expr.a, values), evaluate_int(expr.b, values))
    if kind == "Select":
        cond = evaluate_int(expr.condition, values)
        return evaluate_int(expr.true_value if cond else expr.false_value, values)
    if kind == "Cast":
        return evaluate_int(expr.value, values)
    if kind == "Not":
        return not evaluate_int(expr.a, values)
    return evaluate_bytes(expr, values)


def int_evaluator(expr) -> Callable[[Mapping[str, int]], int]:
    """``expr`` compiled once into a Python closure: ``f(dims) == evaluate_int(expr, dims)``.

    For the many evaluations of the same size expressions at different shapes
    (enumerating a declared range); node kinds outside shape arithmetic fall
    back to :func:`evaluate_int` at call time.
    """
    kind = type(expr).__name__
    if kind == "IntImm":
        value = int(expr)
        return lambda _dims: value
    if kind == "Var":
        name = expr.name
        return lambda dims: int(dims[name])
    if kind in _BINARY:
        op, a, b = _BINARY[kind], int_evaluator(expr.a), int_evaluator(expr.b)
        return lambda dims: op(a(dims), b(dims))
    if kind == "Select":
        c, t, f = (int_evaluator(e) for e in (expr.condition, expr.true_value, expr.false_value))
        return lambda dims: t(dims) if c(dims) else f(dims)
    if kind == "Cast":
        return int_evaluator(expr.value)
    if kind == "Not":
        a = int_evaluator(expr.a)
        return lambda dims: not a(dims)
    return lambda dims: evaluate_int(expr, dims)


_TIR_INT_LITERAL = re.compile(r"T\.u?int(?:8|16|32|64)\((-?\d+)\)")


def expr_text(expr, simplify: bool = False) -> str:
    """A shape or size expression as a user reads it: ``seq - 1`` rather than TVMScript's
    ``seq - T.int64(1)``; an int as itself. ``simplify``: through ``tvm.sym.Analyzer`` first
    (``batch * seq * 512`` for ``4 * batch * 2 * seq * 64``). A dim is named as the model
    and ``--dim`` name it (``p2o.DynamicDimension.1``, not TVMScript's ``p2o_DynamicDimension_1``)."""
    if isinstance(expr, int):
        return str(expr)
    if simplify:
        expr = tvm.sym.Analyzer().simplify(expr)
    text = _TIR_INT_LITERAL.sub(r"\1", str(expr))
    for name in {v.name for v in _expr_vars(expr)}:  # TVMScript prints a.b as a_b
        printed = re.sub(r"\W", "_", name)
        if printed != name:
            text = re.sub(rf"(?<![\w.]){re.escape(printed)}(?!\w)", name, text)
    return text


def _expr_vars(expr):
    """The vars of a shape expression (the node kinds :func:`evaluate_int` knows)."""
    if type(expr).__name__ == "Var":
        yield expr
        return
    for field in ("a", "b", "value", "condition", "true_value", "false_value"):
        child = getattr(expr, field, None)
        if child is not None and not isinstance(child, (int, float)):
            yield from _expr_vars(child)
