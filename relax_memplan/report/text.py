"""Text of the compile report: the static plan of each function for a fixed-shape build, a
table with one row per sampled shape for symbolic dims, and the strategies side by side.

The CLI prints these; :meth:`relax_memplan.report.CompileReport.format_text` calls
:func:`format_report`.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Dict, List, Mapping, Optional

from ..analysis.dims import DimRange
from ..runtime.verify import WEAK_VERIFICATION, Comparison
from ..targets import CpuTarget
from .dispatch import dispatch_lines
from .fusion_patterns import pattern_lines
from .not_applied import FEATURE_WORDS
from .tensor_rows import concrete_tensors, live_storage_bytes, storage_rows

if TYPE_CHECKING:  # the records call format_report: their types name the arguments only
    from .records import CompileReport, FunctionMemoryReport, ShapeMeasurement

__all__ = ["format_report", "format_side_by_side"]


def format_report(report: CompileReport) -> str:
    """The text report of one build."""
    return "\n".join(_static_text(report) if report.is_static else _table_text(report))


def _static_text(report: CompileReport) -> List[str]:
    shapes = ", ".join(f"{n}{list(v['shape'])}:{v['dtype']}" for n, v in report.inputs.items())
    lines = [f"relax-memplan memory report: {report.model}",
             f"  target {_target_text(report)}; inputs {shapes}"]
    for f in report.functions.values():
        lines += _format_function(f)
    lines += _resident_lines(report)
    lines.append(_fusion_line(report))
    lines += _loop_lines(report)
    if report.notes:
        lines.append("notes:")
        lines += [f"  - {n}" for n in report.notes]
    return lines


def _resident_lines(report: CompileReport) -> List[str]:
    """Constants + arena and outputs + workspace of a call (:mod:`relax_memplan.analysis.
    resident`), in the report's columns; with symbolic dims, of the row that allocated most."""
    resident = report.resident
    if resident is None:
        return []
    per_call = report.per_call_bytes
    top = resident.largest_workspace
    lines = []
    if per_call is not None:
        label = "our build per call" if report.is_static else "largest run"
        lines.append(f"  {'resident per call':<38}{_fmt_bytes(resident.total_bytes(per_call)):>30}"
                     f"  constants + {label} + workspace")
    lines.append(f"  {'  constants in the library':<38}{_fmt_bytes(resident.constants_bytes):>30}"
                 f"  {resident.num_constants} distinct tensors")
    lines.append(f"  {'  kernel workspace':<38}{_fmt_bytes(resident.workspace_bytes):>30}"
                 + (f"  largest kernel {top.kernel}, {resident.threads} thread(s)" if top else ""))
    return lines


def _target_text(report: CompileReport) -> str:
    """``llvm rocketlake (this machine's CPU; ...)``, ``llvm portable (...)`` or
    ``cuda (sm_80)``."""
    if report.cpu:
        return f"{report.target} {CpuTarget(report.cpu, report.cpu_source or 'given').describe()}"
    return report.target + (f" ({report.arch})" if report.arch else "")


def _fmt_bytes(n: Optional[int]) -> str:
    if n is None:
        return "-"
    for unit, scale in (("TiB", 1 << 40), ("GiB", 1 << 30), ("MiB", 1 << 20), ("KiB", 1 << 10)):
        if n >= scale:
            return f"{n:,} B ({n / scale:.2f} {unit})"
    return f"{n:,} B"


def _format_function(f: FunctionMemoryReport) -> List[str]:
    lines = [
        f"function {f.name}: {f.num_tensors} intermediate tensors, {f.num_planned} placed in our arena"
        + (f" (best plan: {f.algorithm})" if f.algorithm else "")
    ]
    lb = f.lower_bound_bytes

    def row(label, n, base=lb):
        r = None if n is None or not base else round(n / base, 4)
        return f"  {label:<38}{_fmt_bytes(n):>30}" + (f"  {r:.3f} x LB" if r is not None else "")

    lines.append(row("lower bound (peak live, aligned)", lb))
    if f.unaligned_lower_bound_bytes != lb:
        lines.append(row("  same, exact sizes", f.unaligned_lower_bound_bytes))
    # each "without" row: this build's bound with that feature off, the others as built
    # (so that each feature is credited with its own bytes: yolov8n's 2,457,600 -> 2,048,000 B
    # come from concat in place, not from in-place reuse)
    if f.inplace_capable_kernels is not None:
        lines.append(row("  without in-place reuse" + (" or concat" if f.concat_inplace
                                                        is not None else ""),
                         f.lower_bound_without_inplace_bytes))
        lines.append(f"  in-place: {f.inplace_capable_kernels} kernels capable, "
                     f"{f.inplace_calls} calls write over an input that dies there")
    if f.concat_inplace is not None:
        lines.append(row("  without concat in place" + (" only" if f.inplace_capable_kernels
                                                             is not None else ""),
                         f.lower_bound_without_concat_bytes))
        refused = ", ".join(f"{n} {why}" for why, n in sorted(f.concat_refusals.items()))
        lines.append(f"  concat in place: {f.concat_inplace} concatenations written in place"
                     + (f"; refused: {refused}" if refused else ""))
    lines.append(row("our arena", f.arena_bytes))
    lines += _bound_steps(f)
    if f.fallback:
        lines.append(f"  our arena not used: {f.fallback}; TVM's StaticPlanBlockMemory plans it")
    if f.planned_bytes != f.arena_bytes:
        lines.append(row("our planned total (arena + TVM)", f.planned_bytes))
    lines.append(f"  {'outputs / unplanned, per call':<38}{_fmt_bytes(f.unplanned_bytes):>30}")
    if f.loop_storage_bytes:
        lines.append(row("loop bodies' storage, per call", f.loop_storage_bytes))
    lines.append(row("our build, per call", f.expected_runtime_alloc_bytes))
    if f.tvm_default_bytes is None:
        lines.append(f"  {'TVM default build, per call':<38}{'not built (--no-compare)':>30}")
    else:
        lines.append(row("TVM default build, per call", f.tvm_default_bytes))
    if f.saved_percent is not None:
        label = "saved vs TVM default" if f.saved_bytes >= 0 else "MORE than TVM default"
        lines.append(f"  {label:<38}{_fmt_bytes(abs(f.saved_bytes)):>30}  "
                     f"{abs(f.saved_percent):.1f} %")
    if f.loop_storage_bytes:
        lines.append("  (TVM's figure leaves out what its loop bodies allocate on every "
                     "iteration, so no saving is computed from it: compare the run-time lines)")
    if f.runtime_alloc_bytes is not None:
        agree = "matches the plan" if f.runtime_matches_plan else (
            f"DIFFERS from the plan ({_fmt_bytes(f.expected_runtime_alloc_bytes)})"
        )
        if f.num_runtime_sized_allocs and f.runtime_matches_plan:
            extra = f.runtime_alloc_bytes - f.expected_runtime_alloc_bytes
            agree = (f"the static plan plus {_fmt_bytes(extra)} in {f.num_runtime_sized_allocs} "
                     f"allocation(s) sized at run time")
        lines.append(
            f"  measured at run time (naive VM allocator): ours {_fmt_bytes(f.runtime_alloc_bytes)} in "
            f"{f.runtime_num_allocs} allocations, {agree}"
        )
        if f.tvm_default_runtime_alloc_bytes is not None:
            lines.append(
                f"  measured at run time, TVM default: {_fmt_bytes(f.tvm_default_runtime_alloc_bytes)} in "
                f"{f.tvm_default_runtime_num_allocs} allocations"
            )
    if f.left_to_tvm:
        reasons: Dict[str, int] = {}
        for t in f.left_to_tvm:
            reasons[t["reason"]] = reasons.get(t["reason"], 0) + 1
        summary = ", ".join(f"{n} x {r}" for r, n in sorted(reasons.items()))
        lines.append(f"  left to TVM's planner: {summary}")
    lines += _peak_lines(f.tensors, f.peak_step, f.live_at_peak)
    if f.max_abs_diff_vs_tvm_default is not None:
        lines.append(f"  max abs difference vs TVM default build: {f.max_abs_diff_vs_tvm_default:.3g}")
    if f.max_abs_error is not None:
        comparison = _comparison(f)
        lines.append(f"  verification vs onnxruntime: {comparison.describe()}")
    if f.input_sensitivity and f.input_sensitivity["weak"]:
        lines.append(f"  WARNING: {WEAK_VERIFICATION} (the reference moves by "
                     f"{f.input_sensitivity['max_abs_change']:.3g} on another random input)")
    return lines


def _bound_steps(f: FunctionMemoryReport) -> List[str]:
    """The lower bound step by step (importer's order, reordered, in-place) beside our arena and
    TVM's default build, on one line; nothing when neither reordering nor in-place changed it."""
    steps = (f.lower_bound_importer_order_bytes, f.lower_bound_reordered_bytes,
             f.lower_bound_bytes)
    if None in steps or len(set(steps)) == 1:
        return []
    last = " + ".join(w for w, on in (("in-place", f.inplace_capable_kernels is not None),
                                      ("concat in place", f.concat_inplace is not None)) if on)
    tvm = ("not built" if f.tvm_default_bytes is None else f"{f.tvm_default_bytes:,} B per call")
    return [f"  lower bound: importer's order {steps[0]:,} B -> reordered {steps[1]:,} B -> "
            f"{last or 'as built'} {steps[2]:,} B; our arena {f.arena_bytes:,} B; TVM default "
            f"{tvm}"]


def _num(value: Optional[int]) -> str:
    return "-" if value is None else f"{value:,}"


def _dims_text(dims: Mapping[str, int]) -> str:
    return ", ".join(f"{k}={v}" for k, v in dims.items())


def _dims_width(shapes: List[ShapeMeasurement]) -> int:
    """Width of the dims column: 28, or the longest dims text and two spaces (long dim names
    would push the cells of their rows out of the columns)."""
    return max([28] + [len(_dims_text(s.dims)) + 2 for s in shapes])


def _bytes_width(shapes: List[ShapeMeasurement]) -> int:
    """Width of each bytes column: 12, or the longest number with its commas and two spaces
    (at batch=1..1000000 the cells would run together, '393,216,000,000393,...')."""
    values = [v for s in shapes for v in (s.lower_bound_bytes, s.arena_bytes,
                                          s.runtime_alloc_bytes, s.tvm_default_runtime_alloc_bytes)
              if v is not None]
    return max([12] + [len(f"{v:,}") + 2 for v in values])


def _ranges_text(report: CompileReport) -> str:
    ranges = ", ".join(f"{n} in {DimRange(*r)}" for n, r in report.dims.items())
    if report.buckets:
        ranges += "; buckets " + ", ".join(f"{n}={','.join(map(str, v))}"
                                           for n, v in report.buckets.items())
    return ranges


def _table_text(report: CompileReport) -> List[str]:
    """One row per sampled shape: LB, arena, ratio, bytes of both builds, error, verdict."""
    lines = [f"relax-memplan dynamic report: {report.model}"]
    width, cell = _dims_width(report.shapes), _bytes_width(report.shapes)
    if report.not_planned_reason is not None:
        lines.append(f"  NOT PLANNED: every tensor left to TVM's planner "
                     f"({report.not_planned_reason}); no arena, no ratio to the lower bound")
        if any(loop.form == "recursive" and loop.body_arena_bytes >= 0 for loop in report.loops):
            lines.append("  (that is main's symbolic tensors: the bodies of recursive loops have "
                         "their own static plans, see 'loops and recurrences')")
    lines += [f"  target {_target_text(report)}; strategy {report.strategy}; "
              f"{_ranges_text(report)}; {report.planned_tensors} tensors in the arena",
              f"  {'dims':<{width}}{'LB':>{cell}}{'arena':>{cell}}{'x LB':>9}"
              f"{'run ours':>{cell}}{'run TVM':>{cell}}{'max err':>10}"]
    compared = report.verified is not None
    if compared:
        lines[-1] += f"{'tol':>10}  verify"
    for s in report.shapes:
        row = (f"  {_dims_text(s.dims):<{width}}{_plan_cells(s, cell)}"
               f"{_num(s.runtime_alloc_bytes):>{cell}}"
               f"{_num(s.tvm_default_runtime_alloc_bytes):>{cell}}{_error(s):>10}")
        lines.append(row + (_verdict(s) if compared else ""))
    lines += _check_lines(report.shapes)
    lines += _dynamic_inplace_lines(report)
    lines += _not_applied_lines(report)
    lines += _plan_lines(report, prefix="")
    lines += _dynamic_peak_lines(report)
    lines += dispatch_lines(report)
    lines += _resident_lines(report)
    lines.append(_fusion_line(report))
    lines += _loop_lines(report)
    lines += [f"  note: {n}" for n in report.notes]
    return lines


def _dynamic_inplace_lines(report: CompileReport) -> List[str]:
    """With in-place reuse on: how many calls write over an input, and the lower bound at each
    shape without it (the binding order is the importer's: symbolic blocks are not reordered)."""
    if report.inplace_calls is None:
        return []
    shapes = [s for s in report.shapes if s.planned and s.lower_bound_without_inplace_bytes]
    return [f"  in-place: {report.inplace_calls} calls write over an input that dies there; "
            "lower bound without -> with in-place: "
            + "; ".join(f"{_dims_text(s.dims)}: {s.lower_bound_without_inplace_bytes:,} -> "
                        f"{s.lower_bound_bytes:,} B" for s in shapes)]


def _not_applied_lines(report: CompileReport) -> List[str]:
    """Each memory feature a fixed-shape build would apply that this one did not, and why."""
    return [f"  {FEATURE_WORDS.get(k, k)}: not applied, {why}"
            for k, why in report.not_applied.items()]


def _plan_cells(s: ShapeMeasurement, cell: int = 12) -> str:
    """The LB, arena and x LB cells of a row (``2 * cell + 9`` characters), or that nothing was
    planned."""
    if not s.planned:
        return f"{'not planned (left to TVM)':>{2 * cell + 9}}"
    return (f"{s.lower_bound_bytes:>{cell},}{s.arena_bytes:>{cell},}"
            f"{s.arena_over_lower_bound:>9.3f}")


def _ratio_cell(s: ShapeMeasurement, lower_bound: Optional[int]) -> str:
    """The x LB cell of the side-by-side table (9 characters): the strategy's arena over
    ``lower_bound``, the row's LB column (the lowest bound of any strategy there)."""
    if not s.planned or not lower_bound or s.arena_bytes is None:
        return f"{'-':>9}"
    return f"{s.arena_bytes / lower_bound:>9.3f}"


_LOOP_FORMS = {"kernel": "time loop inside one kernel", "unrolled": "unrolled",
               "recursive": "recursive (a body function per iteration)"}


def _loop_lines(report: CompileReport) -> List[str]:
    """Each loop/recurrence: form, then iterations and bytes at every measured shape."""
    if not report.loops:
        return []
    lines = ["  loops and recurrences (iterations, carried-state bytes, body/scratch bytes "
             "per iteration):"]
    rows = [s.dims for s in report.shapes] or [{}]
    for loop in report.loops:
        lines.append(f"    {loop.op} '{loop.node}': {_LOOP_FORMS.get(loop.form, loop.form)}")
        if loop.form == "recursive" and loop.body_arena_bytes >= 0:
            lines.append(f"      body {loop.function}: arena {loop.body_arena_bytes:,} B "
                         f"(lower bound {loop.body_lower_bound_bytes:,} B)")
        for k, dims in enumerate(rows):
            at = loop.at(dims, k)
            where = f"at {_dims_text(dims)}: " if dims else ""
            count = (f"{at['iterations']:,} iterations" if at["iterations"] >= 0
                     else "run-time trip count")
            lines.append(f"      {where}{count}, carried state "
                         f"{at['carried_state_bytes']:,} B, body/scratch {at['body_bytes']:,} B")
    return lines


def _fusion_line(report: CompileReport) -> str:
    """``fusion: off``, or ``fusion: on`` and a line per pattern (``attention: 12 of 12
    fused``, with each refusal reason: :mod:`relax_memplan.report.fusion_patterns`)."""
    if report.fusion is None:
        return "  fusion: off"
    off = ["conv_chain"] if report.fusion.get("conv_chain") == "off" else []
    lines = pattern_lines(report.fusion_patterns, off)
    line = "  fusion: on" + "".join("\n" + x for x in lines) if lines else \
        "  fusion: on (no pattern for this target)"
    summary = report.fusion_summary
    if summary is not None:
        ort = summary["ort_nodes"]
        same = summary.get("planner_settings")
        line += (f"\n    kernels per call: {summary['kernels_ours']} (TVM FuseOps alone "
                 f"{summary['kernels_tvm']}; onnxruntime optimized graph: "
                 f"{'-' if ort is None else ort} nodes"
                 + (f", {summary['ort_subgraph_nodes']} of them in If/Loop bodies"
                    if summary.get("ort_subgraph_nodes") else "") + ")\n"
                 f"    intermediates: {_fmt_bytes(summary['intermediate_bytes_ours'])} per call, "
                 f"{_fmt_bytes(summary['intermediate_bytes_removed'])} removed; lower bound "
                 f"{_fmt_bytes(summary['lower_bound_bytes_tvm'])} without our fusion -> "
                 f"{_fmt_bytes(summary['lower_bound_bytes_ours'])}"
                 + (f" (both with this build's planner: {same})" if same else "")
                 + _build_bound_words(summary))
        if summary.get("conv_chain_scratch_bytes"):
            line += (f"\n    conv chain kernels: scratch "
                     f"{_fmt_bytes(summary['conv_chain_scratch_bytes'])} per running thread "
                     f"(TVM workspace, not in the lower bound)")
    return line


def _build_bound_words(summary) -> str:
    """Empty when the fusion comparison's fused bound is this build's lower bound, else words
    saying both (the "-> X B" would otherwise read as this build's figure)."""
    build = summary.get("lower_bound_bytes_build")
    if build is None or build == summary["lower_bound_bytes_ours"]:
        return ""
    return (f"; NOT this build's lower bound, {_fmt_bytes(build)}: the comparison's rebuild "
            f"planned differently")


def _error(s: ShapeMeasurement) -> str:
    return "-" if s.max_abs_error is None else f"{s.max_abs_error:.2g}"


def _verdict(s: ShapeMeasurement) -> str:
    if s.verified is None:
        return ""
    return f"{s.error_tolerance:>10.2g}  {'OK' if s.verified else 'FAILED'}"


def _comparison(r) -> Comparison:
    """The :class:`~relax_memplan.runtime.verify.Comparison` kept in a function report or a row."""
    return Comparison(r.max_abs_error, r.error_tolerance, r.nonfinite_mismatches or 0,
                      r.nonfinite_matched or 0,
                      nonfinite_only_ours=r.nonfinite_only_ours or 0,
                      nonfinite_only_reference=r.nonfinite_only_reference or 0)


def _check_lines(rows: List[ShapeMeasurement]) -> List[str]:
    """Non-finite values met at a shape, and the weak-verification warning."""
    lines = []
    for s in rows:
        if s.verified is not None and (s.nonfinite_mismatches or s.nonfinite_matched):
            comparison = _comparison(s)
            lines.append(f"  at {_dims_text(s.dims)}: {comparison.describe()}")
    weak = [s for s in rows if s.input_sensitivity and s.input_sensitivity["weak"]]
    if weak:
        moved = max(s.input_sensitivity["max_abs_change"] for s in weak)
        lines.append(f"  WARNING: {WEAK_VERIFICATION} (at {len(weak)} of {len(rows)} "
                     f"shapes the reference moves by at most {moved:.3g} on another random "
                     f"input)")
    return lines


def _plan_lines(report: CompileReport, prefix: str) -> List[str]:
    """What the dynamic plan left to TVM and where its ratio was checked."""
    lines = []
    if report.left_to_tvm:
        reasons: Dict[str, int] = {}
        for why in report.left_to_tvm.values():
            reasons[why] = reasons.get(why, 0) + 1
        lines.append(f"  {prefix}left to TVM: "
                     + ", ".join(f"{n} x {r}" for r, n in sorted(reasons.items())))
    checked = report.checked
    if checked:
        where = (f"every one of the {checked['shapes']} shapes in range" if checked["enumerated"]
                 else f"{checked['shapes']} sampled shapes")
        classes = any("size classes" in n for n in report.notes)
        lines.append(f"  {prefix}exact layout / lower bound checked at {where}: worst "
                     f"{checked['max_ratio']:.3f} ({checked['pinned']} shapes pinned to their "
                     f"own plan)" + ("; size classes then round the arena up" if classes else ""))
    return lines


def format_side_by_side(reports: Mapping[str, CompileReport]) -> str:
    """Several strategies of one model at the same shapes: one table, a column group per
    strategy (arena / lower bound, bytes our build allocated), TVM's build once."""
    names = list(reports)
    first = reports[names[0]]
    with_buckets = next((r for r in reports.values() if r.buckets), first)
    lines = [f"relax-memplan dynamic report: {first.model} (strategies side by side)",
             f"  {_ranges_text(with_buckets)}; tensors in the arena: "
             + ", ".join(f"{n} {r.planned_tensors}" for n, r in reports.items())]
    width = _dims_width(first.shapes)
    cell = _bytes_width([s for r in reports.values() for s in r.shapes])
    head = f"  {'':<{width}}{'':>{cell}}" + "".join(f"{n:>{9 + cell}}" for n in names)
    lines.append(head)
    compared = any(r.verified is not None for r in reports.values())
    cols = f"  {'dims':<{width}}{'LB':>{cell}}" + f"{'x LB':>9}{'run':>{cell}}" * len(names)
    lines.append(cols + f"{'run TVM':>{cell}}{'max err':>10}" + ("  verify" if compared else ""))
    for k, row in enumerate(first.shapes):
        same = [reports[n].shapes[k] for n in names]
        # one LB column: the lowest bound of any strategy (in-place reuse lowers exact's
        # and buckets' bound, not upper_bound's), every x LB against it
        lbs = [s.lower_bound_bytes for s in same if s.planned and s.lower_bound_bytes]
        lb = min(lbs) if lbs else None
        text = f"  {_dims_text(row.dims):<{width}}{_num(lb):>{cell}}"
        text += "".join(f"{_ratio_cell(s, lb)}{_num(s.runtime_alloc_bytes):>{cell}}"
                        for s in same)
        errors = [s.max_abs_error for s in same if s.max_abs_error is not None]
        text += f"{_num(row.tvm_default_runtime_alloc_bytes):>{cell}}"
        text += f"{max(errors):>10.2g}" if errors else f"{'-':>10}"
        if compared:
            verdicts = [s.verified for s in same if s.verified is not None]
            text += "  " + ("-" if not verdicts else "OK" if all(verdicts) else "FAILED")
        lines.append(text)
    lines += _strategy_lines(reports)
    return "\n".join(lines)


def _strategy_lines(reports: Mapping[str, CompileReport]) -> List[str]:
    """Warnings and notes under the side-by-side table: once when every strategy has them,
    else prefixed with the strategy."""
    per_strategy = {name: _check_lines(r.shapes) + _not_applied_lines(r) + _plan_lines(r, prefix="")
                    + [_fusion_line(r)] + [f"  note: {n}" for n in r.notes] for name, r in reports.items()}
    common = [line for line in next(iter(per_strategy.values()))
              if all(line in lines for lines in per_strategy.values())]
    out = list(common)
    for name, lines in per_strategy.items():
        out += [f"  {name}: {line.strip()}" for line in lines if line not in common]
    return out


def _dynamic_peak_lines(report: CompileReport) -> List[str]:
    """The top of :func:`_peak_lines` at the sampled shape with the largest lower bound."""
    if not report.tensors or not report.shapes or report.shapes[0].peak_step is None:
        return []
    k = max(range(len(report.shapes)), key=lambda i: report.shapes[i].lower_bound_bytes)
    row = report.shapes[k]
    return _peak_lines(concrete_tensors(report.tensors, k), row.peak_step, row.live_at_peak,
                       where=f" at {_dims_text(row.dims)}")


def _peak_lines(tensors: List[Dict], peak_step: Optional[int], live_at_peak: List[str],
                top: int = 10, where: str = "") -> List[str]:
    """The largest storages live at the peak of the arena's live bytes (rows with
    ``size_bytes`` and ``offset_bytes`` at one shape): a placement group's root with the bytes
    and span of its group and a line naming the tensors placed inside it, so that the listed
    bytes add up to the total."""
    if peak_step is None or not live_at_peak:
        return []
    by_name = {t["name"]: t for t in storage_rows(tensors)}
    live = [by_name[n] for n in live_at_peak]
    total = live_storage_bytes(live)  # tensors placed inside one another count once
    rows = []
    for t in live[:top]:
        shape = "x".join(f"({d})" if " " in str(d) else str(d) for d in t["shape"]) + f" {t['dtype']}"
        kernel = t["producer"] or "-"
        kernel = kernel if len(kernel) <= 34 else kernel[:31] + "..."
        rows.append((t, (t["name"], kernel, shape, f"{t['size_bytes']:,}", f"{t['offset_bytes']:,}")))
    # each column widened to its content plus a space (a long shape would run into the
    # bytes, 'float328,847,360,000,000')
    w = [max([width] + [len(cells[i]) + 1 for _, cells in rows])
         for i, width in enumerate((16, 36, 22, 12, 12))]
    lines = [f"  live at the peak{where} (step {peak_step}): {len(live)} tensors, {total:,} B"
             + (f"; the {top} largest:" if len(live) > top else ":"),
             f"    {'tensor':<{w[0]}}{'kernel':<{w[1]}}{'shape':<{w[2]}}{'bytes':>{w[3]}}"
             f"{'offset':>{w[4]}}  live"]
    for t, (name, kernel, shape, size, offset) in rows:
        lines.append(f"    {name:<{w[0]}}{kernel:<{w[1]}}{shape:<{w[2]}}{size:>{w[3]}}"
                     f"{offset:>{w[4]}}  [{t['live_range'][0]}, {t['live_range'][1]})")
        lines += _group_line(t, tensors)
    return lines


def _group_line(root: Dict, tensors: List[Dict], most: int = 6) -> List[str]:
    """For a placement group's root: its own live range and the tensors placed inside it."""
    members = [m for m in tensors if m.get("group") == root["name"] and "inside" in m]
    if not members:
        return []
    start, end = next(t["live_range"] for t in tensors if t["name"] == root["name"])
    held = [f"{m['name']} ({m['inside']['kind']}, offset +{m['offset_bytes'] - root['offset_bytes']:,},"
            f" [{m['live_range'][0]}, {m['live_range'][1]}))" for m in members[:most]]
    more = f", ... ({len(members) - most} more)" if len(members) > most else ""
    return [f"      group of {len(members) + 1}, its own range [{start}, {end}); holds "
            + ", ".join(held) + more]
