"""Private helpers of :class:`~relax_memplan.transform.plan_static_memory.PlanStaticMemory`
for in-place reuse and concatenation written in place: tensors placed at a fixed byte delta
inside a parent (``member -> (parent, delta)``: delta 0 and the same size for an in-place
chain, the prefix bytes inside the output for a concatenation input) planned as one buffer,
the validation that accepts exactly those placements, and the calls rewritten to the
kernels' in-place variants."""

from __future__ import annotations

from typing import Dict, List, Tuple

import tvm
from tvm import relax

from ..analysis.inplace import InplacePair, inplace_kernel
from ..planner import Buffer, plan, validate

__all__ = ["nesting_from_groups", "absolute_deltas", "merged_buffers", "place_with_sharing",
           "inplace_calls", "inplace_variant_calls", "count_capable"]


def nesting_from_groups(sharing: List[List[str]]) -> Dict[str, Tuple[str, int]]:
    """In-place groups (tensors sharing one storage) as placements at delta 0, as a chain:
    every member but the first -> (the member before it, 0). A chain, not a star, so that
    any two members are ancestor and descendant: a chain's tensors may overlap in time
    (``b`` written over ``a``, ``c`` over ``b``: ``b`` and ``c`` are live together at ``c``'s
    call), and the validator accepts overlaps between ancestors only."""
    return {uid: (group[k], 0) for group in sharing for k, uid in enumerate(group[1:])}


def absolute_deltas(nested: Dict[str, Tuple[str, int]]) -> Dict[str, Tuple[str, int]]:
    """Member -> (its root, byte delta from the root), following the parents.

    Raises
    ------
    ValueError
        If the parents form a cycle (an internal error: never planned).
    """
    out: Dict[str, Tuple[str, int]] = {}
    for member in nested:
        node, delta, seen = member, 0, set()
        while node in nested:
            if node in seen:
                raise ValueError(f"placements inside a parent form a cycle at {node!r}")
            seen.add(node)
            node, step = nested[node]
            delta += step
        out[member] = (node, delta)
    return out


def merged_buffers(buffers: List[Buffer], nested: Dict[str, Tuple[str, int]]) -> List[Buffer]:
    """One buffer per tree of tensors placed inside one another (in-place chains at delta 0,
    concatenation inputs at their prefix bytes inside the output): the live range spanning
    the tree's, the bytes from the root's offset to the end of the furthest member, the id
    of the root. Members absent from ``buffers`` are ignored."""
    by_id = {b.id: b for b in buffers}
    roots: Dict[str, List[Tuple[Buffer, int]]] = {}
    for member, (root, delta) in absolute_deltas(nested).items():
        if member in by_id and root in by_id:
            roots.setdefault(root, [(by_id[root], 0)]).append((by_id[member], delta))
    merged = [Buffer(id=root, start=min(b.start for b, _ in tree), end=max(b.end for b, _ in tree),
                     size_bytes=max(d + b.size_bytes for b, d in tree),
                     alignment_bytes=by_id[root].alignment_bytes)
              for root, tree in roots.items()]
    inside = {b.id for tree in roots.values() for b, _ in tree}
    return merged + [b for b in buffers if b.id not in inside]


def place_with_sharing(buffers, nested, algorithms, time_limit_s):
    """Plan the merged buffers, give every member its root's offset plus its delta, validate
    (``validate(..., nested=nested)``: exactly the declared placements may overlap)."""
    merged = merged_buffers(buffers, nested)
    result = plan(merged, algorithms=algorithms, time_limit_s=time_limit_s)
    offsets = dict(result.offsets)
    for member, (root, delta) in absolute_deltas(nested).items():
        if root in offsets:
            offsets[member] = offsets[root] + delta
    validate(buffers, offsets, nested=nested)
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
