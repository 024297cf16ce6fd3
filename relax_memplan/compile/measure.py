"""Run the builds at one shape and fill a row of each build's report: bytes our build and
TVM's allocate (naive VM allocator), the comparison with onnxruntime, input sensitivity.

The same for a fixed-shape build (one shape, dims ``{}``) and for symbolic dims (each
sampled shape). The reference runs first: onnxruntime refusing the inputs is a clear error,
whereas our build may not check them.
"""

from __future__ import annotations

import os
from dataclasses import dataclass, field
from typing import Dict, List, Mapping, Optional, Sequence

import numpy as np

from ..errors import RelaxMemplanError
from ..frontend.prepare.loop_facts import record_trip_counts
from ..report import CompileReport, ShapeMeasurement
from ..runtime import run_checked
from ..transform.specialize_kernels import dispatch_path
from ..runtime.verify import compare_outputs, input_sensitivity
from .options import CheckOptions
from .shapes import fit_values, shapes_at, with_shapes
from ..report.summary import arena_at, lower_bound_without_inplace_at, tensors_at

__all__ = ["ModelSource", "StrategyBuild", "add_rows", "measure_point", "max_abs_error", "reference_sensitivity",
           "physical_memory_bytes"]


@dataclass
class StrategyBuild:
    """Our build with one strategy (``"static"`` for fixed shapes) and its report."""

    strategy: str
    executable: object
    report: CompileReport
    dyn: Optional[object] = None
    kernels: Optional[object] = None
    outputs: Optional[List[np.ndarray]] = None
    library_path: Optional[str] = None
    plan_pass: Optional[object] = None
    record: Optional[object] = None
    fusion: Optional[list] = None
    hoist: Optional[object] = None
    resident: Optional[object] = None
    notes: List[str] = field(default_factory=list)
    #: the module after the Relax pipeline, kept until the report has read it
    lowered: Optional[object] = None


@dataclass
class ModelSource:
    """The model being compiled and where a shape's inputs and reference outputs come from:
    random inputs (or the given ``values``) for an ONNX model with onnxruntime as reference,
    or arrays given as they are (a Relax module built as it is, with its own inputs).

    ``name`` and ``notes`` (import notes) go into the report."""

    mod: object
    name: str = "module"
    notes: List[str] = field(default_factory=list)
    info: Optional[object] = None
    onnx_model: Optional[object] = None
    values: Dict[str, np.ndarray] = field(default_factory=dict)
    given: Optional[Sequence[np.ndarray]] = None
    given_reference: Optional[Sequence[np.ndarray]] = None

    def info_at(self, dims: Mapping[str, int]):
        """The import info with the input shapes at ``dims`` (fixed shapes: as imported)."""
        return with_shapes(self.info, shapes_at(self.mod, dims)) if dims else self.info

    def feed_at(self, dims: Mapping[str, int], seed: int) -> Dict[str, np.ndarray]:
        """Inputs at ``dims``, by name."""
        if self.given is not None:
            return {f"input{k}": x for k, x in enumerate(self.given)}
        from .. import frontend

        info = self.info_at(dims)
        return frontend.make_random_inputs(self.onnx_model, info, seed=seed,
                                           values=fit_values(self.values, info.input_shapes))

    def reference(self, feed: Dict[str, np.ndarray]) -> Optional[List[np.ndarray]]:
        """onnxruntime's outputs on ``feed`` (or the given reference)."""
        if self.onnx_model is None:
            return self.given_reference
        from .. import frontend

        return frontend.run_onnxruntime(self.onnx_model, feed)

    def sensitivity(self, dims, reference, rtol: float, atol: float, seed: int) -> Optional[Dict]:
        """How much onnxruntime's output moves on a second random input (None without a model)."""
        if self.onnx_model is None:
            return None
        info = self.info_at(dims)
        return reference_sensitivity(self.onnx_model, info, reference, rtol, atol, seed,
                                     fit_values(self.values, info.input_shapes))


def max_abs_error(actual: Sequence[np.ndarray], expected: Sequence[np.ndarray]) -> float:
    """Largest absolute difference over all outputs; ``inf`` when a NaN/Inf of one side
    is not matched by the same value on the other (matching NaN/Inf count as equal).

    Raises
    ------
    VerificationError
        If the number of outputs or a shape differs.
    """
    return compare_outputs(actual, expected, rtol=0.0, atol=0.0).error


def reference_sensitivity(onnx_model, info, reference: Sequence[np.ndarray], rtol: float,
                          atol: float, seed: int, values=None) -> Optional[Dict]:
    """Run onnxruntime on a second random input (seed ``seed + 1``) and measure how much the
    reference moves (:func:`relax_memplan.runtime.verify.input_sensitivity`); None when every input
    is given in ``values`` (nothing to draw)."""
    from .. import frontend

    if set(values or {}) >= set(info.input_shapes):
        return None
    other = frontend.make_random_inputs(onnx_model, info, seed=seed + 1, values=values)
    return input_sensitivity(reference, frontend.run_onnxruntime(onnx_model, other), rtol, atol)


def physical_memory_bytes() -> Optional[int]:
    """RAM of the machine, or None where the OS does not say."""
    try:
        return os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")
    except (ValueError, OSError, AttributeError):
        return None


def add_rows(builds: Sequence[StrategyBuild], dims: Mapping[str, int]) -> None:
    """A row at ``dims`` in each build's report: the plan's arena and lower bound there."""
    for b in builds:
        arena, lower_bound = arena_at(b.report, b.dyn, dims)
        row = ShapeMeasurement(dims=dict(dims), runtime_alloc_bytes=None, arena_bytes=arena,
                               lower_bound_bytes=lower_bound,
                               planned=b.report.not_planned_reason is None)
        row.lower_bound_without_inplace_bytes = lower_bound_without_inplace_at(b.report, b.dyn, dims)
        if b.kernels is not None:
            row.kernel_paths = sorted(set(dispatch_path(b.kernels.specialized, dims).values()))
        b.report.shapes.append(row)
        tensors_at(b.report, b.dyn, dims, row)


def measure_point(dims: Mapping[str, int], builds: Sequence[StrategyBuild], ex_tvm,
                  source: ModelSource, check: CheckOptions, say) -> None:
    """Run every build (and TVM's) at ``dims`` and complete the last row of each report."""
    feed = source.feed_at(dims, check.seed)
    for b in builds:  # a loop's run-time trip count: the value this run used, said when random
        b.report.notes += record_trip_counts(b.report.loops, feed, source.values)
    arrays = list(feed.values())
    _check_fits_in_memory(builds, arrays)
    reference = None
    if check.verify:
        say("running onnxruntime for reference outputs" if source.onnx_model is not None
            else "comparing with the given reference outputs")
        reference = source.reference(feed)
    say("running at " + ", ".join(f"{k}={v}" for k, v in dims.items()) if dims else
        "running our build once (naive allocator, counting alloc_storage)")
    rows = [b.report.shapes[-1] for b in builds]
    for b, row in zip(builds, rows):
        got = _run(b.executable, arrays, dims, "relax_memplan's build")
        row.runtime_alloc_bytes, row.runtime_num_allocs = got.alloc_bytes, got.num_allocs
        b.outputs = got.outputs
    if ex_tvm is not None:
        say("running TVM's default build on the same inputs")
        base = _run(ex_tvm, arrays, dims, "TVM's default build")
        for b, row in zip(builds, rows):
            row.tvm_default_runtime_alloc_bytes = base.alloc_bytes
            row.tvm_default_runtime_num_allocs = base.num_allocs
            row.max_abs_diff_vs_tvm_default = max_abs_error(b.outputs, base.outputs)
    if reference is None:
        return
    for b, row in zip(builds, rows):
        row.record_comparison(compare_outputs(b.outputs, reference, check.rtol, check.atol))
    if source.onnx_model is not None:
        say("running onnxruntime on a second random input (does the output depend on it?)")
        moved = source.sensitivity(dims, reference, check.rtol, check.atol, check.seed)
        for row in rows:
            row.input_sensitivity = moved


_SHAPE_HINT = " (does the model accept this shape? narrow --dim or give a :STEP)"


def _run(ex, arrays, dims, build_name):
    """run_checked; with symbolic dims, a hint about the shape (the likeliest cause), which
    run_checked leaves out for an index value out of range (:class:`IndexValueError`)."""
    if not dims:
        return run_checked(ex, arrays, build_name)
    return run_checked(ex, arrays, build_name, dims=dims, hint=_SHAPE_HINT)


def _check_fits_in_memory(builds: Sequence[StrategyBuild], arrays) -> None:
    """Refuse to run a build whose plan needs more bytes than the machine has."""
    planned = max((b.report.main.expected_runtime_alloc_bytes if b.report.functions
                   else b.report.shapes[-1].arena_bytes) for b in builds)
    need = planned + sum(np.asarray(x).nbytes for x in arrays)
    have = physical_memory_bytes()
    if have is not None and need > have:
        raise RelaxMemplanError(
            f"running this build needs about {need / 2**30:.1f} GiB but the machine has "
            f"{have / 2**30:.1f} GiB; use smaller shapes or --no-measure")
