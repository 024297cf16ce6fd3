"""Private helpers of :class:`~relax_memplan.transform.plan_static_memory.PlanStaticMemory`
for in-place reuse: tensors that share storage planned as one buffer, the validation that
accepts exactly those sharings, and the calls rewritten to the kernels' in-place variants."""

from __future__ import annotations

from typing import Dict, List

import tvm
from tvm import relax

from ..analysis.inplace import InplacePair, inplace_kernel
from ..planner import Buffer, plan, validate

__all__ = ["merged_buffers", "place_with_sharing", "inplace_calls", "inplace_variant_calls",
           "count_capable"]


def merged_buffers(buffers: List[Buffer], sharing: List[List[str]]) -> List[Buffer]:
    """One buffer per group of tensors that share storage (in-place chains): the live range
    spanning the group's, the largest size, the id of its first tensor."""
    by_id = {b.id: b for b in buffers}
    merged_ids = set()
    out = []
    for group in sharing:
        members = [by_id[u] for u in group if u in by_id]
        if len(members) < 2:
            continue
        merged_ids.update(b.id for b in members)
        out.append(Buffer(id=members[0].id, start=min(b.start for b in members),
                          end=max(b.end for b in members),
                          size_bytes=max(b.size_bytes for b in members),
                          alignment_bytes=members[0].alignment_bytes))
    return out + [b for b in buffers if b.id not in merged_ids]


def place_with_sharing(buffers, sharing, algorithms, time_limit_s):
    """Plan the merged buffers, give every member of a group its group's offset, validate."""
    merged = merged_buffers(buffers, sharing)
    result = plan(merged, algorithms=algorithms, time_limit_s=time_limit_s)
    offsets = dict(result.offsets)
    for group in sharing:
        for uid in group[1:]:
            if group[0] in offsets:
                offsets[uid] = offsets[group[0]]
    validate(buffers, offsets, shared=sharing)
    return result, offsets


def inplace_calls(mod: tvm.IRModule, fplan, kernels: Dict,
                   builder: relax.BlockBuilder) -> Dict:
    """Binding var of a kernel call -> the call of its in-place variant, for the in-place
    uses of ``fplan`` whose two tensors both got arena offsets; the new PrimFuncs go into
    ``builder``'s module, one per (kernel, pair), and ``kernels`` maps their names to
    GlobalVars."""
    placed = {uid for a in fplan.arenas for uid in a.offsets}
    return inplace_variant_calls(mod, [u for u in fplan.liveness.inplace
                                       if u.in_uid in placed and u.out_uid in placed],
                                 kernels, builder)


def inplace_variant_calls(mod: tvm.IRModule, uses, kernels: Dict,
                          builder: relax.BlockBuilder) -> Dict:
    """Binding var of each kernel call of ``uses`` (:class:`InplaceUse`) -> the call of its
    in-place variant; new PrimFuncs go into ``builder``'s module (see :func:`inplace_calls`)."""
    calls = {}
    for use in uses:
        name = f"{use.kernel}_inplace_o{use.out_index}_i{use.in_index}"
        if name not in kernels:
            func = inplace_kernel(mod[use.kernel], InplacePair(use.out_index, use.in_index))
            kernels[name] = builder.add_func(func, name)
        gv = kernels[name]
        args = [a for k, a in enumerate(use.call.args) if k != use.out_index]
        calls[use.binding_var] = relax.Call(gv, args, use.call.attrs, use.call.ty_args)
    return calls


def count_capable(func: relax.Function, table: Dict) -> int:
    """Distinct PrimFuncs called by ``func`` with at least one in-place pair in ``table``."""
    names = set()

    def visit(expr):
        if isinstance(expr, tvm.ir.Call) and isinstance(expr.op, tvm.ir.GlobalVar) \
                and table.get(expr.op.name_hint):
            names.add(expr.op.name_hint)

    relax.analysis.post_order_visit(func, visit)
    return len(names)
