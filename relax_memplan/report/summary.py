"""What a build's plan says, before any run: the static plan of each function (fixed
shapes) or the dynamic plan's summary (symbolic dims), written into the report."""

from __future__ import annotations

from typing import Dict, List, Optional, Sequence, Tuple

from ..analysis.dims import evaluate_int, expr_text
from .records import CompileReport, FunctionMemoryReport
from .tensor_rows import _storage_rows, concrete_tensors, peak_of

__all__ = ["static_functions", "summarize_dynamic", "arena_at", "lower_bound_without_inplace_at",
           "planned_tensors", "storage_buffers", "dynamic_tensors", "tensors_at"]


def static_functions(plan_pass, ours_rec, tvm_rec, hoist=None, reorder_pass=None,
                     target=None) -> Tuple[Dict[str, FunctionMemoryReport], List[str]]:
    """One :class:`FunctionMemoryReport` per planned function, and a note per fallback
    (``hoist``: the build's ``HoistLoopStorage``, whose loop storage a caller allocates);
    with ``reorder_pass`` (the build's ``ReorderForMemory``) the lower bound in the importer's
    order is computed again on the module it received; ``tvm_rec`` None: TVM's default build
    was not built (``--no-compare``), its bytes are None."""
    functions: Dict[str, FunctionMemoryReport] = {}
    notes: List[str] = []
    for fname, fplan in plan_pass.plans.items():
        ours = ours_rec.summaries.get(fname)
        theirs = tvm_rec.summaries.get(fname) if tvm_rec is not None else None
        placed = {uid for arena in fplan.arenas for uid in arena.offsets}
        functions[fname] = FunctionMemoryReport(
            name=fname,
            num_tensors=len(fplan.liveness.tensors),
            num_planned=len(placed),
            left_to_tvm=[
                {"tensor": t.uid, "size_bytes": t.size_bytes,
                 "reason": t.reason or "TVM's plan of the function is smaller"}
                for t in fplan.liveness.tensors if t.uid not in placed
            ],
            lower_bound_bytes=fplan.lower_bound_bytes,
            unaligned_lower_bound_bytes=fplan.unaligned_lower_bound_bytes,
            arena_bytes=fplan.arena_bytes,
            planned_bytes=ours.planned_bytes if ours else fplan.arena_bytes,
            unplanned_bytes=ours.unplanned_bytes if ours else 0,
            loop_storage_bytes=hoist.allocated_in.get(fname, 0) if hoist is not None else 0,
            tvm_default_bytes=(theirs.static_total_bytes if theirs
                               else None if tvm_rec is None else 0),
            tvm_default_unplanned_bytes=(theirs.unplanned_bytes if theirs
                                         else None if tvm_rec is None else 0),
            num_runtime_sized_allocs=ours.num_symbolic if ours else 0,
            algorithm=", ".join(sorted({a.algorithm for a in fplan.arenas})),
            fallback=fplan.fallback_reason,
        )
        functions[fname].tensors, functions[fname].peak_step, functions[fname].live_at_peak = \
            planned_tensors(fplan)
        functions[fname].lower_bound_reordered_bytes = fplan.lower_bound_without_inplace_bytes
        functions[fname].lower_bound_importer_order_bytes = _importer_order_bound(
            fplan, reorder_pass, plan_pass.alignment_bytes, target)
        if fplan.inplace_capable_kernels is not None:
            f = functions[fname]
            f.inplace_capable_kernels = fplan.inplace_capable_kernels
            f.inplace_calls = sum(u.in_uid in placed and u.out_uid in placed
                                  for u in fplan.liveness.inplace)
            f.lower_bound_without_inplace_bytes = fplan.lower_bound_without_inplace_bytes
        if fplan.concat_inplace_on:
            f = functions[fname]
            f.concat_inplace, f.concat_refusals = fplan.concat_inplace, fplan.concat_refusals
            f.lower_bound_without_concat_bytes = sum(
                a.lower_bound_without_concat_bytes for a in fplan.arenas or fplan.rejected_arenas)
        if fplan.fallback_reason:
            notes.append(f"function {fname} keeps TVM's memory plan: {fplan.fallback_reason}")
    return functions, notes


def _importer_order_bound(fplan, reorder_pass, alignment_bytes: int, target) -> int:
    """The static lower bound without in-place in the importer's binding order: the plan's own
    when ``ReorderForMemory`` did not run or changed nothing in the function."""
    moved = reorder_pass is not None and reorder_pass.input_module is not None and any(
        b.applied for b in reorder_pass.blocks if b.function == fplan.name)
    if not moved or not fplan.arenas:
        return fplan.lower_bound_without_inplace_bytes
    from ..analysis.lowered_peak import planned_lower_bound_bytes

    return planned_lower_bound_bytes(reorder_pass.input_module, fplan.name, alignment_bytes,
                                     target)


def summarize_dynamic(report: CompileReport, dyn, kernels) -> None:
    """The dynamic plan of ``main`` (tensors planned, left to TVM, ratio check, size
    classes) and the specialized kernels, into ``report``."""
    fplan = dyn.plans.get("main")
    if fplan is None or not fplan.planned:
        reason = fplan.fallback_reason if fplan else "main has no symbolic tensors"
        report.notes.append("no symbolic tensor was planned: " + reason)
        report.not_planned_reason = reason.removesuffix("; left to TVM")
    else:
        report.planned_tensors = len(fplan.placed)
        if dyn.inplace and fplan.strategy != "upper_bound":
            report.inplace_calls = len(fplan.inplace)
        report.tensors = dynamic_tensors(fplan)
        report.left_to_tvm = {u: r for u, r in fplan.left_to_tvm.items()
                              if u not in fplan.output_class_bytes}
        report.notes += fplan.notes
        report.checked = dict(fplan.checked)
        if fplan.class_values:
            report.notes.append("size classes: " + "; ".join(
                f"{n} in {v}" for n, v in fplan.class_values.items()))
    if kernels is not None:
        report.specialized = {k: dict(v) for k, v in kernels.specialized.items()}
        report.notes += _summarize_skipped(kernels.skipped)


def lower_bound_without_inplace_at(report: CompileReport, dyn, dims) -> Optional[int]:
    """Lower bound (peak live aligned bytes) of ``main`` at ``dims`` had every kernel written a
    fresh output, in the planned binding order; None if nothing was planned."""
    if report.is_static:
        return report.main.lower_bound_reordered_bytes if report.functions else None
    fplan = dyn.plans.get("main")
    return fplan.lower_bound_without_inplace_at(dims) if fplan is not None and fplan.planned \
        else None


def arena_at(report: CompileReport, dyn, dims) -> Tuple[int, int]:
    """(arena bytes, lower bound bytes) of ``main`` at ``dims``: the static plan's when the
    build is fixed-shape, else the dynamic plan evaluated there (0, 0 if nothing planned)."""
    if report.is_static:
        return (report.main.arena_bytes, report.main.lower_bound_bytes) if report.functions \
            else (0, 0)
    fplan = dyn.plans.get("main")
    return tuple(fplan.bytes_at(dims)[:2]) if fplan is not None and fplan.planned else (0, 0)


def _summarize_skipped(skipped: Sequence[str]) -> List[str]:
    """Kernel-dispatch notes, one line per reason (``"<kernel>: <reason>"`` lines grouped)."""
    reasons: Dict[str, List[str]] = {}
    for note in skipped:
        kernel, _, why = note.partition(": ")
        reasons.setdefault(why or kernel, []).append(kernel)
    return [f"{len(kernels)} kernel(s) {why}" + (f" ({', '.join(kernels[:3])}"
            + (", ..." if len(kernels) > 3 else "") + ")" if why else "")
            for why, kernels in reasons.items()]


def planned_tensors(fplan) -> Tuple[List[Dict], Optional[int], List[str]]:
    """Each tensor placed in an arena (name, producing kernel, shape, bytes, half-open live
    range in program steps, arena and offset; placement groups marked as in
    :func:`_mark_groups`), the step where the arena's storage peaks, and the names of the
    rows holding storage there (a group's root, not its members; largest first)."""
    placed = {uid: (k, offset) for k, arena in enumerate(fplan.arenas)
              for uid, offset in arena.offsets.items()}
    rows = [{"name": t.uid, "producer": t.producer, "shape": list(t.shape), "dtype": t.dtype,
             "size_bytes": t.size_bytes, "live_range": [t.start, t.end],
             "arena": placed[t.uid][0], "offset_bytes": placed[t.uid][1]}
            for t in fplan.liveness.tensors if t.uid in placed]
    _mark_groups(fplan, rows)
    return (rows,) + peak_of(rows)


def storage_buffers(fplan, arena) -> List:
    """What occupies ``arena`` over time, exact sizes in bytes: one
    :class:`~relax_memplan.planner.Buffer` per placement group (a concatenation's output
    holding its inputs, an in-place chain; id of the root, live over the group's span, bytes
    from the root's offset to the furthest member's end) and one per tensor outside every
    group. The planner's :func:`~relax_memplan.transform._inplace_plan.merged_buffers`, the
    rule of the lower bound (its peak is ``arena.unaligned_lower_bound_bytes``; the aligned
    lower bound when the sizes are multiples of the alignment)."""
    from ..planner import Buffer
    from ..transform._inplace_plan import merged_buffers

    tensors = {t.uid: t for t in fplan.liveness.tensors}
    buffers = [Buffer(id=u, start=tensors[u].start, end=tensors[u].end,
                      size_bytes=max(1, tensors[u].size_bytes or 0))
               for u in sorted(arena.offsets) if u in tensors]
    return merged_buffers(buffers, getattr(arena, "nested", {}) or {})


def _mark_groups(fplan, rows: List[Dict]) -> None:
    """Placement groups into ``rows``: a member gets ``inside`` (``tensor``: the parent it is
    placed in, ``delta_bytes``: its offset minus the parent's, ``kind``: ``"concat input"``
    or ``"in place"``) and ``group`` (the root's name); a root gets ``group`` (itself),
    ``group_live_range`` (the steps its storage is reserved: the merged buffer's span) and
    ``group_size_bytes`` (the storage it holds)."""
    from ..transform._inplace_plan import absolute_deltas

    by_name = {r["name"]: r for r in rows}
    for arena in fplan.arenas:
        nested = getattr(arena, "nested", {}) or {}
        inplace = getattr(arena, "nested_without_concat", {}) or {}
        roots = {root for root, _ in absolute_deltas(nested).values()}
        for b in storage_buffers(fplan, arena):
            if b.id in roots and b.id in by_name:
                by_name[b.id].update(group=b.id, group_live_range=[b.start, b.end],
                                     group_size_bytes=b.size_bytes)
        for member, (root, _) in absolute_deltas(nested).items():
            parent, delta = nested[member]
            if member in by_name and root in by_name:
                by_name[member].update(inside={"tensor": parent, "delta_bytes": delta,
                                               "kind": "in place" if member in inplace
                                               else "concat input"}, group=root)


def dynamic_tensors(fplan) -> List[Dict]:
    """Each tensor of a dynamic plan's arena: name, producing kernel, shape and bytes as
    expressions of the dims (strings), dtype, half-open live range, ``shares_storage_with``
    (the first tensor of its in-place group, whose offset it has; None if it has its own);
    ``size_bytes_at_shapes`` and ``offset_bytes_at_shapes`` are filled per sampled shape by
    :func:`tensors_at`."""
    tensors = {t.uid: t for t in fplan.liveness.tensors}
    return [{"name": u, "producer": tensors[u].producer,
             "shape": [_dim(d) for d in tensors[u].shape], "dtype": tensors[u].dtype,
             "size_bytes_expr": expr_text(tensors[u].size_expr, simplify=True),
             "live_range": [tensors[u].start, tensors[u].end],
             "shares_storage_with": fplan.shared.get(u),
             "size_bytes_at_shapes": [], "offset_bytes_at_shapes": []}
            for u in fplan.placed]


def tensors_at(report: CompileReport, dyn, dims, row) -> None:
    """At one sampled shape of a dynamic plan: each tensor's bytes and offset appended to
    ``report.tensors``, and the peak step and tensors live there into ``row``."""
    fplan = dyn.plans.get("main") if dyn is not None else None
    if not report.tensors or fplan is None:
        return
    offsets = fplan.layout_at(dims)[0]
    exprs = {t.uid: t.size_expr for t in fplan.liveness.tensors}
    for t in report.tensors:
        t["size_bytes_at_shapes"].append(evaluate_int(exprs[t["name"]], dims))
        t["offset_bytes_at_shapes"].append(offsets[t["name"]])
    row.peak_step, row.live_at_peak = peak_of(_storage_rows(concrete_tensors(report.tensors, -1)))


def _dim(d):
    """A dim of a tensor's shape for the JSON report: an int, or its expression as text."""
    return int(d) if type(d).__name__ == "IntImm" or isinstance(d, int) else expr_text(d)
