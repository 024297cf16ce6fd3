"""Small IRModule helpers shared by the passes, and the base of the passes that rewrite each
Relax function with a mutator and count what they changed (:class:`CountingRewritePass`)."""

from __future__ import annotations

from typing import Dict, Mapping, Optional, Tuple

import tvm
from tvm import relax

__all__ = ["binding_readers", "replace_functions", "rewrite_functions", "before_call_tir_rewrite",
           "CountingRewritePass"]

_DPS_OPS = ("relax.call_tir", "relax.call_tir_inplace", "relax.call_tir_with_grad",
            "relax.call_dps_packed")


def replace_functions(mod: tvm.IRModule, updates: Mapping) -> tvm.IRModule:
    """A copy of ``mod`` (``IRModule.clone``: same attributes and global infos) with
    ``updates`` (GlobalVar -> function) put in; ``mod`` itself when there is nothing to update."""
    if not updates:
        return mod
    new_mod = mod.clone()
    for gv, func in updates.items():
        new_mod[gv] = func
    return new_mod


def rewrite_functions(mod: tvm.IRModule, make_rewriter, count_attr: str):
    """(``mod`` with every Relax function rewritten by a fresh ``make_rewriter(mod)`` (an
    ``ExprMutator``) where its ``count_attr`` attribute says it changed something, unused
    bindings removed; the sum of those counts)."""
    from tvm import relax

    updates, total = {}, 0
    for gv, func in mod.functions_items():
        if not isinstance(func, relax.Function):
            continue
        rewriter = make_rewriter(mod)
        new_func = rewriter.visit_expr(func)
        count = getattr(rewriter, count_attr)
        if count:
            total += count
            updates[gv] = relax.analysis.remove_all_unused(new_func)
    return replace_functions(mod, updates), total


class CountingRewritePass:
    """Base of a module pass class (decorate the subclass with
    ``@tvm.transform.module_pass(opt_level=0, name=...)``) that rewrites every Relax function
    with a fresh mutator and exposes how many rewrites the last run made.

    A subclass sets ``count_attr`` (the name of both the pass's counter and the mutator's, e.g.
    ``"removed"``) and ``make_rewriter`` (``mod`` -> a ``PyExprMutator``); :meth:`rewrite` does
    :func:`rewrite_functions` and may be overridden (a pass whose mutator adds PrimFuncs keeps
    its builder's module).
    """

    count_attr: str = "rewritten"
    #: (pattern name, verb) of :attr:`records`, ``None``: the pass keeps no fusion record.
    pattern: Optional[Tuple[str, str]] = None

    def __init__(self):
        setattr(self, self.count_attr, 0)

    @property
    def records(self):
        """``[PatternRecord]`` of the last run: each rewrite a candidate fused (these passes
        refuse nothing they find); empty without :attr:`pattern`."""
        from .fusion_record import PatternRecord

        if self.pattern is None:
            return []
        record = PatternRecord(*self.pattern)
        record.accept(getattr(self, self.count_attr))
        return [record]

    def make_rewriter(self, mod: tvm.IRModule):
        raise NotImplementedError(f"{type(self).__name__} must set make_rewriter")

    def rewrite(self, mod: tvm.IRModule):
        """(the rewritten module, the number of rewrites)."""
        return rewrite_functions(mod, self.make_rewriter, self.count_attr)

    def transform_module(self, mod: tvm.IRModule, _ctx) -> tvm.IRModule:
        mod, count = self.rewrite(mod)
        setattr(self, self.count_attr, count)
        return mod


def before_call_tir_rewrite(mod: tvm.IRModule) -> bool:
    """True when ``mod``'s Relax functions call kernels in destination-passing style
    (``R.call_tir``, ``R.call_dps_packed``) but allocate no ``R.builtin.alloc_tensor``:
    ``CallTIRRewrite`` has not run yet, so a memory planner finds nothing to plan."""
    from tvm import relax

    found = {"dps": False, "alloc": False}

    def visit(expr):
        if isinstance(expr, relax.Call) and isinstance(expr.op, tvm.ir.Op):
            if expr.op.name in _DPS_OPS:
                found["dps"] = True
            elif expr.op.name == "relax.builtin.alloc_tensor":
                found["alloc"] = True

    for _gv, func in mod.functions_items():
        if isinstance(func, relax.Function):
            relax.analysis.post_order_visit(func, visit)
    return found["dps"] and not found["alloc"]


def binding_readers(func) -> Dict[str, list]:
    """Binding positions reading each var, by name (``1 << 30``: the function's result)."""
    out: Dict[str, list] = {}
    pos = 0

    def note(expr, where):
        def visit(e):
            if isinstance(e, relax.Var):
                out.setdefault(e.name, []).append(where)
        relax.analysis.post_order_visit(expr, visit)

    for block in func.body.blocks:
        for binding in block.bindings:
            note(binding.value, pos)
            pos += 1
    note(func.body.body, 1 << 30)
    return out
