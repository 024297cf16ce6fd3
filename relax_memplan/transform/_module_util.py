"""Small IRModule helper shared by the passes."""

from __future__ import annotations

from typing import Mapping

import tvm

__all__ = ["replace_functions", "rewrite_functions", "before_call_tir_rewrite"]

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
