"""The memory report: lower bound vs our arena vs TVM's default plan vs bytes measured at run time.

All sizes are bytes. ``lower_bound_bytes`` is the peak of live bytes over the
tensors our planner placed, each rounded up to the 64-byte offset alignment the
VM needs (no aligned plan of those tensors can use less);
``unaligned_lower_bound_bytes`` is the same peak with exact sizes;
``arena_bytes`` is the size of our arena(s); ``expected_runtime_alloc_bytes``
is what one call of our build allocates according to its static plan, and
``tvm_default_bytes`` the same for the same pipeline with TVM's
``StaticPlanBlockMemory`` alone (both count every constant-size
``alloc_storage`` request: planned storage, outputs and the tensors a planner
leaves, the larger branch of an ``R.If``), so ``saved_bytes`` compares like
with like; ``runtime_alloc_bytes`` is the sum of the ``alloc_storage``
requests the VM made during one call (outputs included). Where our plan would
allocate more than TVM's, the function keeps TVM's plan and ``fallback`` says so.
"""

from __future__ import annotations

import json
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Dict, List, Optional

__all__ = ["FunctionMemoryReport", "MemoryReport"]


def _ratio(a: Optional[int], b: Optional[int]) -> Optional[float]:
    if a is None or not b:
        return None
    return round(a / b, 4)


@dataclass
class FunctionMemoryReport:
    """Memory of one Relax function, in bytes.

    Attributes
    ----------
    name : str
        Function name.
    num_tensors, num_planned : int
        Allocations found by the liveness analysis, and how many we placed.
    left_to_tvm : list of dict
        ``{"tensor", "size_bytes", "reason"}`` for each allocation left to TVM.
    lower_bound_bytes : int
        Peak live bytes of the tensors we placed, sizes rounded to the alignment.
    unaligned_lower_bound_bytes : int
        The same with exact sizes.
    arena_bytes : int
        Our arena(s).
    planned_bytes : int
        All planned storage with our pipeline: arena(s) plus the storage TVM
        planned for what we left.
    unplanned_bytes : int
        Constant-size tensors no planner takes (function outputs), per call.
    tvm_default_bytes : int
        What one call allocates with TVM's ``StaticPlanBlockMemory`` alone:
        its planned storage plus the tensors it leaves unplanned (outputs,
        ``R.If`` results, values crossing blocks), the larger ``R.If`` branch;
        compare with :attr:`expected_runtime_alloc_bytes`.
    tvm_default_unplanned_bytes : int
        The part of ``tvm_default_bytes`` in tensors TVM's planner leaves.
    num_runtime_sized_allocs : int
        Allocations (with our pipeline) whose size is only known at run time
        (symbolic shapes); they are not in ``planned_bytes``/``unplanned_bytes``.
    algorithm : str
        Placement algorithm that won the best-of selection.
    fallback : str or None
        Why the function keeps TVM's plan instead of ours (ours would allocate
        more per call), e.g. ``"TVM's plan is smaller (288 B vs our 528 B per call)"``.
    runtime_alloc_bytes, runtime_num_allocs : int or None
        Measured with our pipeline (naive VM allocator), one call.
    tvm_default_runtime_alloc_bytes, tvm_default_runtime_num_allocs : int or None
        Measured with TVM's pipeline on the same inputs.
    max_abs_error : float or None
        Against onnxruntime, with ``verify``, over the positions finite on both sides.
    error_tolerance : float or None
        ``rtol * max|finite reference| + atol``.
    nonfinite_mismatches : int or None
        Elements NaN/Inf on one side only (any is a failure), with ``verify``.
    nonfinite_matched : int or None
        Elements NaN/Inf at the same place on both sides (agreement; the inputs
        produced non-finite values).
    input_sensitivity : dict or None
        How much the reference moves on a second random input
        (:func:`relax_memplan.verify.input_sensitivity`), with ``verify``.
    max_abs_diff_vs_tvm_default : float or None
        Our outputs against TVM's default build on the same inputs.
    """

    name: str
    num_tensors: int
    num_planned: int
    left_to_tvm: List[Dict] = field(default_factory=list)
    lower_bound_bytes: int = 0
    unaligned_lower_bound_bytes: int = 0
    arena_bytes: int = 0
    planned_bytes: int = 0
    unplanned_bytes: int = 0
    tvm_default_bytes: int = 0
    tvm_default_unplanned_bytes: int = 0
    num_runtime_sized_allocs: int = 0
    algorithm: str = ""
    fallback: Optional[str] = None
    runtime_alloc_bytes: Optional[int] = None
    runtime_num_allocs: Optional[int] = None
    tvm_default_runtime_alloc_bytes: Optional[int] = None
    tvm_default_runtime_num_allocs: Optional[int] = None
    max_abs_error: Optional[float] = None
    error_tolerance: Optional[float] = None
    max_abs_diff_vs_tvm_default: Optional[float] = None
    nonfinite_mismatches: Optional[int] = None
    nonfinite_matched: Optional[int] = None
    input_sensitivity: Optional[Dict] = None

    @property
    def expected_runtime_alloc_bytes(self) -> int:
        """What the static plan says one call allocates: planned + unplanned bytes."""
        return self.planned_bytes + self.unplanned_bytes

    @property
    def saved_bytes(self) -> int:
        """Bytes per call TVM's default build allocates more than ours (static plans)."""
        return self.tvm_default_bytes - self.expected_runtime_alloc_bytes

    @property
    def saved_percent(self) -> Optional[float]:
        """:attr:`saved_bytes` in percent of ``tvm_default_bytes`` (None if that is 0)."""
        if not self.tvm_default_bytes:
            return None
        return 100.0 * self.saved_bytes / self.tvm_default_bytes

    @property
    def runtime_matches_plan(self) -> Optional[bool]:
        """Whether the bytes measured at run time equal the static plan's."""
        if self.runtime_alloc_bytes is None:
            return None
        if self.num_runtime_sized_allocs:
            # run-time-sized allocations come on top of the static plan
            return self.runtime_alloc_bytes >= self.expected_runtime_alloc_bytes
        return self.runtime_alloc_bytes == self.expected_runtime_alloc_bytes

    @property
    def verified(self) -> Optional[bool]:
        """Whether the error against onnxruntime is within tolerance (None if not run)."""
        if self.max_abs_error is None or self.error_tolerance is None:
            return None
        return not self.nonfinite_mismatches and self.max_abs_error <= self.error_tolerance

    def record_comparison(self, comparison) -> None:
        """Keep a :class:`relax_memplan.verify.Comparison` against the reference."""
        self.max_abs_error, self.error_tolerance = comparison.max_abs_error, comparison.tolerance
        self.nonfinite_mismatches = comparison.nonfinite_mismatches
        self.nonfinite_matched = comparison.nonfinite_matched

    def to_dict(self) -> Dict:
        """JSON-ready dict, with ratios and derived fields added."""
        d = asdict(self)
        d["expected_runtime_alloc_bytes"] = self.expected_runtime_alloc_bytes
        d["runtime_matches_plan"] = self.runtime_matches_plan
        d["verified"] = self.verified
        d["saved_bytes"] = self.saved_bytes
        d["saved_percent"] = None if self.saved_percent is None else round(self.saved_percent, 2)
        d["ratios"] = {
            "arena_over_lower_bound": _ratio(self.arena_bytes, self.lower_bound_bytes),
            "total_over_tvm_default": _ratio(self.expected_runtime_alloc_bytes,
                                             self.tvm_default_bytes),
            "arena_over_tvm_default": _ratio(self.arena_bytes, self.tvm_default_bytes),
            "runtime_over_tvm_default_runtime": _ratio(
                self.runtime_alloc_bytes, self.tvm_default_runtime_alloc_bytes
            ),
        }
        return d


@dataclass
class MemoryReport:
    """The report of one compilation.

    Attributes
    ----------
    model : str
        Model path or name.
    target : str
        Compilation target.
    inputs : dict
        Input name -> ``{"shape": [...], "dtype": str}``.
    functions : dict of str to FunctionMemoryReport
    notes : list of str
        Import and fallback notes (defaulted dims, opset upgrade, ...).
    """

    model: str
    target: str
    inputs: Dict[str, Dict]
    functions: Dict[str, FunctionMemoryReport]
    notes: List[str] = field(default_factory=list)

    @property
    def main(self) -> FunctionMemoryReport:
        """The report of ``main`` (or the first function)."""
        return self.functions.get("main") or next(iter(self.functions.values()))

    def to_dict(self) -> Dict:
        """JSON-ready dict: the main function's fields at top level, all functions under ``functions``."""
        main = self.main.to_dict()
        out = {"model": self.model, "target": self.target, "inputs": self.inputs, "notes": self.notes}
        out.update({k: v for k, v in main.items() if k not in ("name", "left_to_tvm")})
        out["functions"] = {name: f.to_dict() for name, f in self.functions.items()}
        return out

    def write_json(self, path) -> None:
        """Write :meth:`to_dict` as indented JSON (parent folders created)."""
        p = Path(path)
        p.parent.mkdir(parents=True, exist_ok=True)
        p.write_text(json.dumps(self.to_dict(), indent=2) + "\n", encoding="utf-8")

    def format_text(self) -> str:
        """A human-readable report."""
        shapes = ", ".join(f"{n}{list(v['shape'])}:{v['dtype']}" for n, v in self.inputs.items())
        lines = [f"relax-memplan memory report: {self.model}", f"  target {self.target}; inputs {shapes}"]
        for f in self.functions.values():
            lines += _format_function(f)
        if self.notes:
            lines.append("notes:")
            lines += [f"  - {n}" for n in self.notes]
        return "\n".join(lines)


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
        r = _ratio(n, base)
        return f"  {label:<38}{_fmt_bytes(n):>30}" + (f"  {r:.3f} x LB" if r is not None else "")

    lines.append(row("lower bound (peak live, aligned)", lb))
    if f.unaligned_lower_bound_bytes != lb:
        lines.append(row("  same, exact sizes", f.unaligned_lower_bound_bytes))
    lines.append(row("our arena", f.arena_bytes))
    if f.fallback:
        lines.append(f"  our arena not used: {f.fallback}; TVM's StaticPlanBlockMemory plans it")
    if f.planned_bytes != f.arena_bytes:
        lines.append(row("our planned total (arena + TVM)", f.planned_bytes))
    lines.append(f"  {'outputs / unplanned, per call':<38}{_fmt_bytes(f.unplanned_bytes):>30}")
    lines.append(row("our build, per call", f.expected_runtime_alloc_bytes))
    lines.append(row("TVM default build, per call", f.tvm_default_bytes))
    if f.saved_percent is not None:
        label = "saved vs TVM default" if f.saved_bytes >= 0 else "MORE than TVM default"
        lines.append(f"  {label:<38}{_fmt_bytes(abs(f.saved_bytes)):>30}  "
                     f"{abs(f.saved_percent):.1f} %")
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
    if f.max_abs_diff_vs_tvm_default is not None:
        lines.append(f"  max abs difference vs TVM default build: {f.max_abs_diff_vs_tvm_default:.3g}")
    if f.max_abs_error is not None:
        from .verify import Comparison

        comparison = Comparison(f.max_abs_error, f.error_tolerance, f.nonfinite_mismatches or 0,
                                f.nonfinite_matched or 0)
        lines.append(f"  verification vs onnxruntime: {comparison.describe()}")
    if f.input_sensitivity and f.input_sensitivity["weak"]:
        from .verify import WEAK_VERIFICATION

        lines.append(f"  WARNING: {WEAK_VERIFICATION} (the reference moves by "
                     f"{f.input_sensitivity['max_abs_change']:.3g} on another random input)")
    return lines
