"""RefuseSelfDefiningCasts: stop a build that TVM 0.27 would crash on, with an error naming the cast.

Where it runs: first in the ``legalize`` phase of our pipeline (before ``ClampEmptySlices``),
for both planners and every target. Reads no attributes; changes nothing.

Why: a ``match_cast`` whose target dim is a bare symbolic var ``H`` while the value's dim on
that axis is an expression of ``H`` itself (``(H - 1) // 4 * 4 + 4``) makes TVM 0.27's
``CanonicalizeBindings`` (run inside ``FuseTIR``) substitute ``H`` into its own definition
without end: the process dies of a stack overflow (SIGSEGV), with TVM's own pipeline too.
Our ONNX import never writes such a cast (it casts the other way, see
:mod:`relax_memplan.frontend.prepare.converters`); a module built by hand or by another
frontend may, and then one line naming the binding is better than a dead process.
"""

from __future__ import annotations

import re

import tvm
from tvm import relax, tirx

from ..errors import CompileError

__all__ = ["RefuseSelfDefiningCasts", "refuse_self_defining_casts", "self_defining_casts"]


def _text(expr) -> str:
    """``expr`` as the report prints dims: ``(n + 3) // 4 * 4``, not ``T.int64(3)``."""
    return re.sub(r"T\.int64\((-?\d+)\)", r"\1", str(expr))


def _dims(ty):
    if isinstance(ty, relax.TensorType) and isinstance(ty.shape, relax.ShapeExpr):
        return list(ty.shape.values)
    return None


def _bindings(expr):
    """Every binding of ``expr``'s SeqExprs, nested ones (If branches, inner functions) too."""
    if isinstance(expr, relax.Function):
        yield from _bindings(expr.body)
    elif isinstance(expr, relax.SeqExpr):
        for block in expr.blocks:
            for binding in block.bindings:
                yield binding
                yield from _bindings(binding.value)
        yield from _bindings(expr.body)
    elif isinstance(expr, relax.If):
        yield from _bindings(expr.true_branch)
        yield from _bindings(expr.false_branch)


def self_defining_casts(func: relax.Function):
    """``(binding, var, value dim)`` for each ``match_cast`` of ``func`` that defines the
    symbolic var ``var`` from an expression of ``var`` itself."""
    found = []
    for binding in _bindings(func):
        if not isinstance(binding, relax.MatchCast):
            continue
        target, value = _dims(binding.ty), _dims(getattr(binding.value, "ty", None))
        if target is None or value is None or len(target) != len(value):
            continue
        for want, have in zip(target, value):
            if isinstance(want, tirx.Var) and not have.same_as(want) and any(
                    v.same_as(want) for v in tirx.analysis.undefined_vars(have)):
                found.append((binding, want, have))
    return found


@tvm.transform.module_pass(opt_level=0, name="RefuseSelfDefiningCasts")
class RefuseSelfDefiningCasts:
    """Raise :class:`~relax_memplan.errors.CompileError` for a ``match_cast`` that defines a
    symbolic var from itself (see the module docstring); the module is returned unchanged.

    Raises
    ------
    CompileError
        Naming the function, the bound var, the symbolic var and the expression.
    """

    def transform_module(self, mod: tvm.IRModule, _ctx) -> tvm.IRModule:
        refuse_self_defining_casts(mod)
        return mod


def refuse_self_defining_casts(mod: tvm.IRModule) -> None:
    """What the pass checks, callable before a build (``build`` does: inside the pipeline,
    TVM's FFI hands the error on as a ``RuntimeError``, and a retry would meet it again).

    Raises
    ------
    CompileError
        Naming the function, the bound var, the symbolic var and the expression.
    """
    for gv, func in mod.functions_items():
        if not isinstance(func, relax.Function):
            continue
        for binding, var, expr in self_defining_casts(func):
            raise CompileError(
                f"{gv.name_hint}: match_cast of {binding.var.name} defines symbolic "
                f"var {var} from an expression of itself ({_text(expr)}); TVM 0.27 crashes on "
                f"such a cast: cast the other operand to the expression instead")
