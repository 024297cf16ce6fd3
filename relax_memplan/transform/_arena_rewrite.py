"""Shared rewriting of planned ``R.builtin.alloc_tensor`` bindings into arena placements.

Private helper of the planning passes: given prologue bindings (the arena
``alloc_storage`` and, for symbolic plans, the bindings that compute offsets)
and a placement per allocation variable, rebuild a function body (recursing
into ``R.If`` branches) where each placed tensor is
``R.memory.alloc_tensor(arena, offset, shape, dtype)`` followed, unless the
offset is the constant 0, by ``R.memory.ensure_zero_offset`` (lowered by
``LowerRuntimeBuiltin`` to ``vm.builtin.ensure_zero_offset``: a zero-copy view when
the offset is 64-byte aligned; kernels assert ``byte_offset == 0``). The op, not a
``call_packed`` of the builtin, so that CUDA's ``RewriteCUDAGraph`` (which treats any
``vm.builtin.*`` call as dynamic) still captures the kernels that use the views.
"""

from __future__ import annotations

from typing import Dict, List, Optional, Sequence, Tuple

from tvm import relax

__all__ = ["ArenaRewriter", "alloc_arena"]


def alloc_arena(size_bytes, device_index: int, storage_scope: str):
    """``R.memory.alloc_storage`` of ``size_bytes`` (int or int64 PrimExpr) uint8."""
    return relax.op.memory.alloc_storage(
        relax.ShapeExpr([size_bytes]), device_index, storage_scope, "uint8"
    )


class ArenaRewriter:
    """Rebuild a function with planned allocations placed in arenas.

    Parameters
    ----------
    prologue : sequence of relax.Binding
        Bound first in the function body (arenas, offset computations).
    placement : dict
        Allocation variable -> ``(arena var, offset, TensorLiveness)``; the
        offset is an int or an int64 PrimExpr, in bytes.
    calls : dict, optional
        Variable of a kernel-call binding -> the call that replaces it (in-place variants
        of kernels).
    """

    def __init__(self, prologue: Sequence, placement: Dict[relax.Var, Tuple],
                 calls: Optional[Dict] = None):
        self._prologue = list(prologue)
        self._placement = placement
        self._calls = calls or {}

    def rewrite_function(self, func: relax.Function) -> relax.Function:
        """The function with the prologue first and placed allocations rewritten."""
        body = self._rewrite_seq(func.body, top=True)
        return relax.Function(func.params, body, func.ret_ty, func.is_pure, func.attrs, func.span)

    def _rewrite_seq(self, seq: relax.SeqExpr, top: bool = False) -> relax.SeqExpr:
        blocks = []
        if top and self._prologue:
            blocks.append(relax.BindingBlock(list(self._prologue)))
        for block in seq.blocks:
            bindings: List = []
            for binding in block.bindings:
                bindings.extend(self._rewrite_binding(binding))
            blocks.append(type(block)(bindings, block.span))
        return relax.SeqExpr(blocks, seq.body, seq.span)

    def _rewrite_binding(self, binding) -> List:
        value = binding.value
        if isinstance(value, relax.If):
            new_if = relax.If(
                value.cond,
                self._rewrite_seq(value.true_branch),
                self._rewrite_seq(value.false_branch),
                value.span,
            )
            return [relax.VarBinding(binding.var, new_if, binding.span)]
        if binding.var in self._calls:
            return [relax.VarBinding(binding.var, self._calls[binding.var], binding.span)]
        placed = self._placement.get(binding.var)
        if placed is None:
            return [binding]
        arena_var, offset, t = placed
        shape_expr, dtype, _dev, _scope = value.args
        alloc = relax.op.memory.alloc_tensor(arena_var, offset, shape_expr, dtype.value, t.device_index)
        if isinstance(offset, int) and offset == 0:
            return [relax.VarBinding(binding.var, alloc, binding.span)]
        label = offset if isinstance(offset, int) else "dyn"
        raw = relax.Var(f"{t.name}_at{label}", binding.var.ty)
        view = relax.op.memory.ensure_zero_offset(raw)
        return [relax.VarBinding(raw, alloc), relax.VarBinding(binding.var, view, binding.span)]
