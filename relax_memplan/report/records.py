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

One report type for every build (:class:`CompileReport`): one row
(:class:`ShapeMeasurement`) per measured shape. A fixed-shape build is the one-row case
(dims ``{}``, strategy ``"static"``) and also carries the static plan of each function
(:class:`FunctionMemoryReport`); a build with symbolic dims carries the ranges, the
strategy and the dynamic plan's summary. Text formatting: :mod:`relax_memplan.report.text`.
"""

from __future__ import annotations

import json
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Dict, List, Optional, Tuple

from .text import format_report

__all__ = ["CompileReport", "FunctionMemoryReport", "ShapeMeasurement"]


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
        None when TVM's default build was not built (``compile --no-compare``).
    tvm_default_unplanned_bytes : int
        The part of ``tvm_default_bytes`` in tensors TVM's planner leaves.
    loop_storage_bytes : int
        Storage of the recursive loop bodies this function calls, allocated once per call
        by it (:class:`~relax_memplan.transform.hoist_loop_storage.HoistLoopStorage`).
    num_runtime_sized_allocs : int
        Allocations (with our pipeline) whose size is only known at run time
        (symbolic shapes); they are not in ``planned_bytes``/``unplanned_bytes``.
    lower_bound_without_inplace_bytes : int or None
        :attr:`lower_bound_bytes` had every kernel written a fresh output (same binding
        order); ``None`` when in-place reuse is off.
    inplace_capable_kernels : int or None
        Distinct kernels of the function that may write an output over an input.
    inplace_calls : int or None
        Calls that do (their input dies there); ``None`` when in-place reuse is off.
    concat_inplace : int or None
        Concatenations written in place (inputs placed inside the output, concat call
        dropped); ``None`` when concat-in-place is off.
    concat_refusals : dict of str to int or None
        Reason -> concat calls refused for it; ``None`` when concat-in-place is off.
    lower_bound_without_concat_bytes : int or None
        :attr:`lower_bound_bytes` without concatenations written in place.
    lower_bound_importer_order_bytes : int or None
        The lower bound in the importer's binding order without in-place reuse (the number
        reported before reordering and in-place existed), same tensors and alignment.
    lower_bound_reordered_bytes : int or None
        The same after :class:`~relax_memplan.transform.reorder_for_memory.ReorderForMemory`
        (equal to the importer's when it did not run or changed nothing), still without
        in-place reuse; :attr:`lower_bound_bytes` is then the bound with in-place reuse.
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
    nonfinite_only_ours, nonfinite_only_reference : int or None
        Of ``nonfinite_mismatches``: NaN/Inf in our outputs where onnxruntime's are finite,
        and the other way round.
    input_sensitivity : dict or None
        How much the reference moves on a second random input
        (:func:`relax_memplan.runtime.verify.input_sensitivity`), with ``verify``.
    max_abs_diff_vs_tvm_default : float or None
        Our outputs against TVM's default build on the same inputs.
    tensors : list of dict
        Each tensor placed in our arena: ``name``, ``producer`` (the kernel writing it),
        ``shape``, ``dtype``, ``size_bytes``, ``live_range`` (half-open, program steps),
        ``arena`` and ``offset_bytes``. Placement groups (a concatenation's output holding
        its inputs, an in-place chain): a member has ``inside`` (``tensor``: its parent,
        ``delta_bytes``: its offset minus the parent's, ``kind``: ``"concat input"`` or
        ``"in place"``) and ``group`` (the root's name); the root has ``group`` (itself),
        ``group_live_range`` (the steps its storage is reserved, as in the lower bound) and
        ``group_size_bytes``.
    peak_step : int or None
        The step where the arena's storage peaks (the lower bound's rule: a group's root
        holds the group's bytes over ``group_live_range``).
    live_at_peak : list of str
        Names of the rows holding storage at ``peak_step`` (group roots, not their members),
        largest first; their bytes add up to the peak.
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
    tvm_default_bytes: Optional[int] = 0
    tvm_default_unplanned_bytes: Optional[int] = 0
    loop_storage_bytes: int = 0
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
    nonfinite_only_ours: Optional[int] = None
    nonfinite_only_reference: Optional[int] = None
    input_sensitivity: Optional[Dict] = None
    tensors: List[Dict] = field(default_factory=list)
    peak_step: Optional[int] = None
    live_at_peak: List[str] = field(default_factory=list)
    lower_bound_without_inplace_bytes: Optional[int] = None
    inplace_capable_kernels: Optional[int] = None
    inplace_calls: Optional[int] = None
    concat_inplace: Optional[int] = None
    concat_refusals: Optional[Dict[str, int]] = None
    lower_bound_without_concat_bytes: Optional[int] = None
    lower_bound_importer_order_bytes: Optional[int] = None
    lower_bound_reordered_bytes: Optional[int] = None

    @property
    def expected_runtime_alloc_bytes(self) -> int:
        """What the static plan says one call allocates: planned + unplanned bytes, plus the
        storage of the recursive loop bodies it calls (allocated once per call)."""
        return self.planned_bytes + self.unplanned_bytes + self.loop_storage_bytes

    @property
    def saved_bytes(self) -> Optional[int]:
        """Bytes per call TVM's default build allocates more than ours (static plans); None
        when the function runs recursive loop bodies (``loop_storage_bytes``): TVM's static
        figure leaves out what they allocate on every iteration, so only the run-time bytes
        compare (a 20-iteration Loop would read "saved -49,152 B" while TVM's build allocates
        655,360 B at run time against our 49,152 B)."""
        if self.loop_storage_bytes or self.tvm_default_bytes is None:
            return None
        return self.tvm_default_bytes - self.expected_runtime_alloc_bytes

    @property
    def saved_percent(self) -> Optional[float]:
        """:attr:`saved_bytes` in percent of ``tvm_default_bytes`` (None if that is 0 or
        :attr:`saved_bytes` is None)."""
        if not self.tvm_default_bytes or self.saved_bytes is None:
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
        """Keep a :class:`relax_memplan.runtime.verify.Comparison` against the reference."""
        self.max_abs_error, self.error_tolerance = comparison.max_abs_error, comparison.tolerance
        self.nonfinite_mismatches = comparison.nonfinite_mismatches
        self.nonfinite_matched = comparison.nonfinite_matched
        self.nonfinite_only_ours = comparison.nonfinite_only_ours
        self.nonfinite_only_reference = comparison.nonfinite_only_reference

    def record_run(self, row: "ShapeMeasurement") -> None:
        """Keep what was measured at the one shape of a static build."""
        for name in _MEASURED:
            setattr(self, name, getattr(row, name))

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




_MEASURED = ("runtime_alloc_bytes", "runtime_num_allocs", "tvm_default_runtime_alloc_bytes",
             "tvm_default_runtime_num_allocs", "max_abs_error", "error_tolerance",
             "nonfinite_mismatches", "nonfinite_matched", "nonfinite_only_ours",
             "nonfinite_only_reference", "input_sensitivity",
             "max_abs_diff_vs_tvm_default")
"""Fields of a row that a static build's main function report repeats."""


@dataclass
class ShapeMeasurement:
    """Bytes at one shape (all sizes in bytes), and the check against onnxruntime there
    (``max_abs_error`` and the other fields of :class:`~relax_memplan.runtime.verify.Comparison`,
    ``input_sensitivity``; ``nonfinite_only_ours``/``nonfinite_only_reference``: the side of a
    NaN/Inf mismatch). ``dims`` is ``{}`` for a fixed-shape build. With a dynamic plan,
    ``peak_step`` and ``live_at_peak`` (names, largest first) say where the arena's tensors'
    live bytes peak at this shape (see :attr:`CompileReport.tensors`).
    ``lower_bound_without_inplace_bytes``: the lower bound at this shape had every kernel
    written a fresh output (same binding order; equal to ``lower_bound_bytes`` when in-place
    reuse is off or found nothing); None when nothing was planned."""

    dims: Dict[str, int]
    runtime_alloc_bytes: Optional[int]
    arena_bytes: int
    lower_bound_bytes: int
    tvm_default_runtime_alloc_bytes: Optional[int] = None
    max_abs_error: Optional[float] = None
    kernel_paths: Optional[List[str]] = None
    error_tolerance: Optional[float] = None
    nonfinite_mismatches: Optional[int] = None
    nonfinite_matched: Optional[int] = None
    input_sensitivity: Optional[Dict] = None
    runtime_num_allocs: Optional[int] = None
    tvm_default_runtime_num_allocs: Optional[int] = None
    max_abs_diff_vs_tvm_default: Optional[float] = None
    peak_step: Optional[int] = None
    live_at_peak: Optional[List[str]] = None
    planned: bool = True
    lower_bound_without_inplace_bytes: Optional[int] = None
    nonfinite_only_ours: Optional[int] = None
    nonfinite_only_reference: Optional[int] = None

    def record_comparison(self, comparison) -> None:
        """Keep a :class:`relax_memplan.runtime.verify.Comparison` with the reference at this shape."""
        self.max_abs_error, self.error_tolerance = comparison.max_abs_error, comparison.tolerance
        self.nonfinite_mismatches = comparison.nonfinite_mismatches
        self.nonfinite_matched = comparison.nonfinite_matched
        self.nonfinite_only_ours = comparison.nonfinite_only_ours
        self.nonfinite_only_reference = comparison.nonfinite_only_reference

    @property
    def verified(self) -> Optional[bool]:
        """Whether our outputs match onnxruntime's at this shape (None if not compared)."""
        if self.max_abs_error is None or self.error_tolerance is None:
            return None
        return not self.nonfinite_mismatches and self.max_abs_error <= self.error_tolerance

    @property
    def arena_over_lower_bound(self) -> Optional[float]:
        """Our arena at this shape / the lower bound at this shape; None when our plan placed
        nothing (``planned`` false: every tensor left to TVM, no arena to compare)."""
        if not self.planned:
            return None
        return self.arena_bytes / self.lower_bound_bytes if self.lower_bound_bytes else 1.0

    def to_dict(self) -> Dict:
        """JSON-ready dict, with the ratio and the verdict; ``arena_bytes``,
        ``lower_bound_bytes`` and the ratio are null when ``planned`` is false."""
        ratio = self.arena_over_lower_bound
        out = dict(vars(self), arena_over_lower_bound=None if ratio is None else round(ratio, 4),
                   verified=self.verified)
        if not self.planned:
            out.update(arena_bytes=None, lower_bound_bytes=None)
        return out


@dataclass
class CompileReport:
    """The report of one build: a row per measured shape.

    Attributes
    ----------
    model, target : str
    arch : str, optional
        The CUDA arch of a ``cuda`` build (``sm_80``); None for other targets.
    cpu, cpu_source : str, optional
        The LLVM CPU of an ``llvm`` build (``znver3``; ``generic`` for a portable one) and
        where it came from (``host``, ``given``, ``portable``:
        :class:`relax_memplan.targets.CpuTarget`); None for other targets.
    inputs : dict
        Input name -> ``{"shape": [...], "dtype": str}`` (fixed-shape builds).
    functions : dict of str to FunctionMemoryReport
        The static plan of each function (fixed-shape builds; empty with symbolic dims).
    notes : list of str
    strategy : str
        ``"static"`` for a fixed-shape build, else the dynamic strategy.
    dims : dict of str to tuple
        Declared ranges of the symbolic dims (``{}`` when fixed).
    shapes : list of ShapeMeasurement
        One row per measured shape (one row, dims ``{}``, for a fixed-shape build).
    planned_tensors : int
        Symbolic tensors in the dynamic arena.
    not_planned_reason : str, optional
        Symbolic dims: why the dynamic plan placed nothing (every tensor left to TVM's
        planner; the rows then have ``planned`` false and no arena); None when it placed some.
        In the JSON as ``planned`` (bool) and ``not_planned_reason``.
    left_to_tvm : dict of str to str
        Symbolic tensors left to TVM, with the reason.
    checked : dict
        Where the exact plan's ratio was checked (``ratio_check``).
    specialized : dict
        Kernels specialized per dim value (``--dispatch``).
    buckets : dict of str to list of int
        Bucket values of the ``buckets`` strategy.
    tensors : list of dict
        Symbolic dims: each tensor of the dynamic arena, ``name``, ``producer`` (kernel),
        ``shape`` (each dim an expression string, ``"seq"``, ``"seq * 2"``), ``dtype``,
        ``size_bytes_expr`` (bytes as an expression of the dims), ``live_range`` (half-open,
        program steps), and per row of :attr:`shapes` ``size_bytes_at_shapes`` and
        ``offset_bytes_at_shapes`` (bytes). Fixed shapes: per function, in
        :attr:`FunctionMemoryReport.tensors`.
    fusion : dict of str to int, optional
        ``None`` when our fusion did not run; else pattern -> times fused in this build
        (``attention``: attention blocks made one kernel, ``dropout``: dropouts removed,
        ``layer_norm``/``rms_norm``: norms written as element-wise steps made one op,
        ``add_layer_norm``/``add_rms_norm``: residual add + norm pairs made one kernel;
        :func:`~relax_memplan.pipeline.fusion_counts`).
    fusion_skipped : dict of str to int
        Patterns found but left unfused by the build's mode, by reason in words
        (``{"dense consumer under --schedule": 1}``,
        :func:`~relax_memplan.report.fusion_summary.fusion_skips`); JSON ``fusion.skipped``.
    fusion_patterns : dict of str to dict
        Per pattern (``attention``, ``add_layer_norm``, ``conv_chain``...): ``verb``,
        ``candidates``, ``fused`` and ``refused`` (each with its ``reason``, ``bindings``,
        ``function`` and ``onnx_nodes``), :func:`~relax_memplan.report.fusion_patterns.pattern_dicts`;
        JSON ``fusion.patterns``.
    fusion_summary : dict, optional
        Fixed shapes with fusion on: kernels per call, intermediate bytes and lower bound of
        ``main`` with TVM's FuseOps alone and with ours, and onnxruntime's optimized-graph node
        count (:class:`~relax_memplan.report.fusion_summary.FusionSummary`).
    inplace_calls : int, optional
        Symbolic dims with in-place reuse on: kernel calls of ``main`` whose output shares
        the storage of an input that dies there (byte sizes proved equal as expressions);
        None when in-place reuse is off. Such tensors have ``shares_storage_with`` in
        :attr:`tensors`, and :attr:`planned_tensors` counts every tensor at an arena offset.
    not_applied : dict of str to str
        Symbolic dims: memory features a fixed-shape build would apply that this one did not,
        and why (``inplace``, ``concat_inplace``, ``conv_chain`` ->
        ``"static shapes only (...)"``; :mod:`relax_memplan.report.not_applied`); ``{}`` for
        fixed shapes.
    loops : list of LoopFacts
        Each ONNX loop or recurrence (LSTM, GRU, Loop, Scan) the import converted
        (:class:`relax_memplan.frontend.prepare.loop_facts.LoopFacts`): its form, iterations,
        carried-state and body/scratch bytes, evaluated at every row of ``shapes``.
    resident : ResidentBytes, optional
        The build's distinct constants and largest kernel workspace
        (:mod:`relax_memplan.analysis.resident`); in the JSON as ``resident`` with
        ``per_call_bytes`` (:attr:`per_call_bytes`) and ``resident_bytes`` (constants + per
        call + workspace).
    """

    model: str
    target: str = "llvm"
    inputs: Dict[str, Dict] = field(default_factory=dict)
    functions: Dict[str, FunctionMemoryReport] = field(default_factory=dict)
    notes: List[str] = field(default_factory=list)
    strategy: str = "static"
    dims: Dict[str, Tuple] = field(default_factory=dict)
    shapes: List[ShapeMeasurement] = field(default_factory=list)
    planned_tensors: int = 0
    left_to_tvm: Dict[str, str] = field(default_factory=dict)
    checked: Dict = field(default_factory=dict)
    specialized: Dict[str, Dict[str, List[int]]] = field(default_factory=dict)
    buckets: Dict[str, List[int]] = field(default_factory=dict)
    fusion: Optional[Dict[str, int]] = None
    arch: Optional[str] = None
    cpu: Optional[str] = None
    cpu_source: Optional[str] = None
    tensors: List[Dict] = field(default_factory=list)
    fusion_summary: Optional[Dict[str, int]] = None
    loops: List = field(default_factory=list)
    not_planned_reason: Optional[str] = None
    inplace_calls: Optional[int] = None
    not_applied: Dict[str, str] = field(default_factory=dict)
    fusion_skipped: Dict[str, int] = field(default_factory=dict)
    fusion_patterns: Dict[str, Dict] = field(default_factory=dict)
    resident: Optional[object] = None

    @property
    def per_call_bytes(self) -> Optional[int]:
        """Arena and outputs of one call: the static plan of ``main`` (fixed shapes), else
        the most any measured row allocated; None when unknown."""
        if self.is_static and "main" in self.functions:
            return self.main.expected_runtime_alloc_bytes
        measured = [s.runtime_alloc_bytes for s in self.shapes if s.runtime_alloc_bytes]
        return max(measured) if measured else None

    @property
    def is_static(self) -> bool:
        """A fixed-shape build (no symbolic dim)."""
        return self.strategy == "static"

    @property
    def main(self) -> FunctionMemoryReport:
        """The static plan of ``main`` (or the first function) of a fixed-shape build."""
        return self.functions.get("main") or next(iter(self.functions.values()))

    @property
    def verified(self) -> Optional[bool]:
        """Whether every compared shape matched onnxruntime (None if none was compared)."""
        verdicts = [s.verified for s in self.shapes if s.verified is not None]
        if not verdicts and self.functions:
            return self.main.verified
        return all(verdicts) if verdicts else None

    def to_dict(self) -> Dict:
        """JSON-ready dict. Fixed shape: ``main``'s fields at top level, every function under
        ``functions``; symbolic dims: ``strategy``, ``dims``, ``ratio_check``, ... Both have
        ``shapes`` (the rows) and ``verified``."""
        out = {"model": self.model, "target": self.target, "arch": self.arch, "cpu": self.cpu,
               "cpu_source": self.cpu_source,
               "inputs": self.inputs,
               "notes": self.notes, "strategy": self.strategy,
               "dims": {n: list(r) for n, r in self.dims.items()}}
        if self.is_static and self.functions:
            out.update({k: v for k, v in self.main.to_dict().items()
                        if k not in ("name", "left_to_tvm")})
            out["functions"] = {name: f.to_dict() for name, f in self.functions.items()}
        else:
            out.update({"planned": self.not_planned_reason is None,
                        "not_planned_reason": self.not_planned_reason,
                        "planned_tensors": self.planned_tensors, "left_to_tvm": self.left_to_tvm,
                        "inplace_calls": self.inplace_calls,
                        "not_applied": dict(self.not_applied),
                        "ratio_check": self.checked, "specialized_kernels": self.specialized,
                        "buckets": {n: list(v) for n, v in self.buckets.items()},
                        "tensors": self.tensors})
        out["fusion"] = {"enabled": self.fusion is not None, "fused": dict(self.fusion or {}),
                         "skipped": dict(self.fusion_skipped),
                         "patterns": dict(self.fusion_patterns)}
        if self.fusion_summary is not None:
            out["fusion"].update(self.fusion_summary)
        out["verified"] = self.verified
        out["resident"] = (self.resident.to_dict(self.per_call_bytes)
                           if self.resident is not None else None)
        out["loops"] = [loop.to_dict([s.dims for s in self.shapes]) for loop in self.loops]
        out["shapes"] = [s.to_dict() for s in self.shapes]
        return out

    def write_json(self, path) -> None:
        """Write :meth:`to_dict` as indented JSON (parent folders created)."""
        p = Path(path)
        p.parent.mkdir(parents=True, exist_ok=True)
        p.write_text(json.dumps(self.to_dict(), indent=2) + "\n", encoding="utf-8")

    def format_text(self) -> str:
        """The text report: the static plan of each function, or a table of the rows."""
        return format_report(self)

