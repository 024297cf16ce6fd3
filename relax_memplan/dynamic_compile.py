"""Compile an ONNX model once with symbolic dims and measure it at several shapes.

The library behind ``relax-memplan compile --dim NAME=LO..HI``: import with the
dynamic dims kept symbolic, build once with :class:`PlanDynamicMemory` (our
strategy) and once with TVM's own planner (given the same declared ranges),
then, at each sampled shape (the ends of the declared ranges and random shapes
between), run both builds with the naive allocator and compare the bytes they
allocate with the lower bound at that shape.
"""

from __future__ import annotations

import itertools
from dataclasses import dataclass, field
from typing import Callable, Dict, List, Mapping, Optional, Sequence, Tuple

import numpy as np
import tvm

from .analysis.dims import DimRange, evaluate_int
from .compiler import build, export_library, reference_sensitivity
from .errors import ShapeSpecError
from .runtime import run_checked
from .transform._dynamic_plan import sample_points
from .transform.plan_dynamic_memory import PlanDynamicMemory
from .transform.plan_static_memory import PlanStaticMemory
from .transform.specialize_kernels import SpecializeKernels, backend_schedule, dispatch_path
from .verify import WEAK_VERIFICATION, Comparison, compare_outputs

__all__ = ["ShapeMeasurement", "DynamicReport", "parse_dim_spec", "parse_values_spec",
           "compile_onnx_dynamic"]


def parse_dim_spec(text: str) -> Tuple[str, Tuple[int, ...]]:
    """``"seq=1..128"`` -> ``("seq", (1, 128))``; ``"seq=4.."`` -> ``("seq", (4, None))``; ``"seq=..8"`` -> ``("seq", (1, 8))``;
    ``"height=160..640:32"`` -> ``("height", (160, 640, 32))`` (only 160, 192, ..., 640).

    Raises
    ------
    ShapeSpecError
        Malformed text, bounds not integers, lower < 1, lower > upper or step < 1.
    """
    name, sep, rng = text.partition("=")
    rng, colon, step_text = rng.partition(":")
    lo, dots, hi = rng.partition("..")
    if not sep or not name.strip() or not dots or (colon and not step_text.strip()):
        raise ShapeSpecError(f"bad dim spec {text!r}: expected NAME=LO..HI or NAME=LO..HI:STEP, "
                             f"e.g. seq=1..128")
    try:
        lower = int(lo) if lo.strip() else 1
        upper = int(hi) if hi.strip() else None
        step = int(step_text) if colon else 1
    except ValueError:
        raise ShapeSpecError(f"bad dim spec {text!r}: bounds and step must be integers") from None
    if lower < 1 or (upper is not None and upper < lower):
        # a dim of 0 (zero-size tensors) is refused like --shape 0: the planner would skip
        # it, and most models (and onnxruntime) cannot run it
        raise ShapeSpecError(f"bad dim spec {text!r}: need 1 <= LO <= HI")
    if step < 1 or (step > 1 and upper is None):
        raise ShapeSpecError(f"bad dim spec {text!r}: a step must be >= 1 and needs HI")
    if (upper - lower) % step if step > 1 else False:
        raise ShapeSpecError(f"bad dim spec {text!r}: HI must be LO + k * STEP (e.g. "
                             f"{lower}..{lower + (upper - lower) // step * step}:{step})")
    return name.strip(), ((lower, upper, step) if step > 1 else (lower, upper))


def parse_values_spec(text: str) -> Tuple[str, Tuple[int, ...]]:
    """``"seq=64,128"`` -> ``("seq", (64, 128))`` (bucket values of a dim).

    Raises
    ------
    ShapeSpecError
        Malformed text or a value that is not an integer >= 1.
    """
    name, sep, rest = text.partition("=")
    try:
        values = tuple(sorted({int(v) for v in rest.split(",")}))
    except ValueError:
        values = ()
    if not sep or not name.strip() or not values or min(values) < 1:
        raise ShapeSpecError(f"bad bucket spec {text!r}: expected NAME=V1,V2,... with integers >= 1, "
                             f"e.g. seq=64,128")
    return name.strip(), values


@dataclass
class ShapeMeasurement:
    """Bytes at one sampled shape (all sizes in bytes), and the check against onnxruntime
    there (``max_abs_error`` and the other fields of
    :class:`~relax_memplan.verify.Comparison`, ``input_sensitivity``)."""

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

    def record_comparison(self, comparison: Comparison) -> None:
        """Keep the comparison with the reference at this shape."""
        self.max_abs_error, self.error_tolerance = comparison.max_abs_error, comparison.tolerance
        self.nonfinite_mismatches = comparison.nonfinite_mismatches
        self.nonfinite_matched = comparison.nonfinite_matched

    @property
    def verified(self) -> Optional[bool]:
        """Whether our outputs match onnxruntime's at this shape (None if not compared)."""
        if self.max_abs_error is None or self.error_tolerance is None:
            return None
        return not self.nonfinite_mismatches and self.max_abs_error <= self.error_tolerance

    @property
    def arena_over_lower_bound(self) -> float:
        """Our arena at this shape / the lower bound at this shape."""
        return self.arena_bytes / self.lower_bound_bytes if self.lower_bound_bytes else 1.0


@dataclass
class DynamicReport:
    """Per-shape memory of one dynamic build."""

    model: str
    strategy: str
    dims: Dict[str, Tuple[int, Optional[int]]]
    shapes: List[ShapeMeasurement] = field(default_factory=list)
    planned_tensors: int = 0
    left_to_tvm: Dict[str, str] = field(default_factory=dict)
    notes: List[str] = field(default_factory=list)
    checked: Dict = field(default_factory=dict)
    specialized: Dict[str, Dict[str, List[int]]] = field(default_factory=dict)

    @property
    def verified(self) -> Optional[bool]:
        """Whether every compared shape matched onnxruntime (None if none was compared)."""
        verdicts = [s.verified for s in self.shapes if s.verified is not None]
        return all(verdicts) if verdicts else None

    def to_dict(self) -> Dict:
        """JSON-ready dict."""
        return {
            "model": self.model,
            "strategy": self.strategy,
            "dims": {n: list(r) for n, r in self.dims.items()},
            "planned_tensors": self.planned_tensors,
            "left_to_tvm": self.left_to_tvm,
            "notes": self.notes,
            "ratio_check": self.checked,
            "specialized_kernels": self.specialized,
            "verified": self.verified,
            "shapes": [dict(vars(s), arena_over_lower_bound=round(s.arena_over_lower_bound, 4),
                            verified=s.verified)
                       for s in self.shapes],
        }

    def format_text(self) -> str:
        """A table: one row per sampled shape."""
        ranges = ", ".join(f"{n} in {DimRange(*r)}" for n, r in self.dims.items())
        lines = [f"relax-memplan dynamic report: {self.model}",
                 f"  strategy {self.strategy}; {ranges}; {self.planned_tensors} tensors in the arena",
                 f"  {'dims':<28}{'LB':>12}{'arena':>12}{'x LB':>9}{'run ours':>12}{'run TVM':>12}{'max err':>10}"]

        def num(value):
            return "-" if value is None else f"{value:,}"

        compared = self.verified is not None
        if compared:
            lines[-1] += f"{'tol':>10}  verify"
        for s in self.shapes:
            dims = ", ".join(f"{k}={v}" for k, v in s.dims.items())
            err = "-" if s.max_abs_error is None else f"{s.max_abs_error:.2g}"
            row = (f"  {dims:<28}{s.lower_bound_bytes:>12,}{s.arena_bytes:>12,}"
                   f"{s.arena_over_lower_bound:>9.3f}{num(s.runtime_alloc_bytes):>12}"
                   f"{num(s.tvm_default_runtime_alloc_bytes):>12}{err:>10}")
            if compared and s.verified is not None:
                row += f"{s.error_tolerance:>10.2g}  {'OK' if s.verified else 'FAILED'}"
            lines.append(row)
        for s in self.shapes:
            if s.verified is not None and (s.nonfinite_mismatches or s.nonfinite_matched):
                comparison = Comparison(s.max_abs_error, s.error_tolerance,
                                        s.nonfinite_mismatches, s.nonfinite_matched)
                lines.append("  at " + ", ".join(f"{k}={v}" for k, v in s.dims.items())
                             + f": {comparison.describe()}")
        weak = [s for s in self.shapes if s.input_sensitivity and s.input_sensitivity["weak"]]
        if weak:
            moved = max(s.input_sensitivity["max_abs_change"] for s in weak)
            lines.append(f"  WARNING: {WEAK_VERIFICATION} (at {len(weak)} of {len(self.shapes)} "
                         f"shapes the reference moves by at most {moved:.3g} on another random "
                         f"input)")
        if self.left_to_tvm:
            reasons: Dict[str, int] = {}
            for why in self.left_to_tvm.values():
                reasons[why] = reasons.get(why, 0) + 1
            lines.append("  left to TVM: " + ", ".join(f"{n} x {r}" for r, n in sorted(reasons.items())))
        if self.checked:
            where = (f"every one of the {self.checked['shapes']} shapes in range" if self.checked["enumerated"]
                     else f"{self.checked['shapes']} sampled shapes")
            lines.append(f"  exact layout / lower bound checked at {where}: worst "
                         f"{self.checked['max_ratio']:.3f} ({self.checked['pinned']} shapes pinned "
                         f"to their own plan)" + ("; size classes then round the arena up"
                                                 if any("size classes" in n for n in self.notes) else ""))
        if self.specialized:
            lines.append(f"  kernels specialized: {len(self.specialized)} ("
                         + ", ".join(sorted(self.specialized)[:6])
                         + (", ..." if len(self.specialized) > 6 else "") + ")")
            for s in self.shapes:
                dims = ", ".join(f"{k}={v}" for k, v in s.dims.items())
                lines.append(f"    at {dims}: {' + '.join(s.kernel_paths or ['generic'])} kernels")
        lines += [f"  note: {n}" for n in self.notes]
        return "\n".join(lines)


def _sample_dims(ranges: Mapping[str, Tuple], count: int, seed: int) -> List[Dict[str, int]]:
    """``count`` distinct shapes: the range ends, then random shapes on each dim's grid (an
    unbounded dim up to 4x its lower bound), as the planner samples them; every shape in range
    (the ends first) when there are no more than ``count``."""
    dim_ranges = {n: DimRange(*r) for n, r in ranges.items()}
    lows = {n: r.values()[0] if r.upper is not None else max(r.lower, 1) for n, r in dim_ranges.items()}
    grids = [r.values() if r.upper is not None else range(lows[n], 4 * lows[n] + 1)
             for n, r in dim_ranges.items()]
    if int(np.prod([len(g) for g in grids], dtype=np.float64)) <= count:
        every = [dict(zip(dim_ranges, values)) for values in itertools.product(*grids)]
        return every[:1] + every[-1:] + every[1:-1] if len(every) > 1 else every
    points = sample_points(dim_ranges, list(dim_ranges), lows, 4 * count + 8, seed)
    distinct = [p for i, p in enumerate(points) if p not in points[:i]]
    return distinct[: max(count, 2)]


def compile_onnx_dynamic(
    model,
    dim_ranges: Mapping[str, Tuple[int, Optional[int]]],
    *,
    shapes: Optional[Mapping[str, Sequence[int]]] = None,
    strategy: str = "exact",
    plan_pass: Optional[PlanStaticMemory] = None,
    dynamic_pass: Optional[PlanDynamicMemory] = None,
    buckets: Optional[Mapping[str, Sequence[int]]] = None,
    size_classes: bool = False,
    size_class_growth: float = 4.0,
    dispatch: Optional[Mapping[str, Sequence[int]]] = None,
    schedule: bool = False,
    check_indices: bool = True,
    sample_shapes: int = 3,
    measure: bool = True,
    verify: bool = False,
    input_values: Optional[Dict[str, np.ndarray]] = None,
    seed: int = 0,
    rtol: float = 1e-4,
    atol: float = 1e-5,
    prepare: bool = True,
    compare_with_tvm: bool = True,
    progress: Optional[Callable[[str], None]] = None,
    library_path=None,
) -> Tuple[object, DynamicReport]:
    """Import with symbolic dims, build once, measure at sampled shapes.

    Parameters
    ----------
    model : path or onnx.ModelProto
    dim_ranges : mapping of str to (int, int or None[, int])
        Declared ranges of the model's symbolic dims (names as in the ONNX file),
        optionally with a step: ``{"height": (160, 640, 32)}``.  Unnamed dims (ONNX
        ``dim_param`` empty or ``?``) are named ``<input>_dim<axis>``.
    shapes : mapping of str to sequence of int, optional
        Full shapes of some inputs (as ``--shape``), written into the model before
        import; the dims they fix (and every dim sharing a name with one) are static,
        the others stay symbolic and need a range in ``dim_ranges``.
    strategy : {"exact", "upper_bound", "buckets"}
    plan_pass : PlanStaticMemory, optional
        Settings (alignment, algorithms, time limit) for the planning passes.
    dynamic_pass : PlanDynamicMemory, optional
        A configured dynamic planner, used instead of one made from ``strategy``,
        ``buckets`` and ``size_classes`` (read its ``plans`` after the call).
    buckets : mapping of str to sequence of int, optional
        Bucket values for the ``buckets`` strategy (``{"seq": [64, 128]}``).
    size_classes : bool
        Round the arena and symbolic outputs up to geometric size classes
        (bounded pooled-allocator policy; see :class:`PlanDynamicMemory`).
    size_class_growth : float
        Ratio between consecutive size classes of a dim (> 1).
    dispatch : mapping of str to sequence of int, optional
        Kernel specialization buckets (:class:`~relax_memplan.transform.SpecializeKernels`);
        the report says which path each sampled shape took.
    schedule : bool
        Apply our CPU matmul schedules (:mod:`relax_memplan.schedules`).
    check_indices : bool
        Check index values at run time where not proved in range (both builds).
    sample_shapes : int
        Shapes to run at (>= 2: the range ends come first).
    measure : bool
        Run the builds at the sampled shapes (``False``: the report gives the
        plan's arena and lower bound there only).
    verify : bool
        Compare with onnxruntime at each shape (:func:`relax_memplan.verify.compare_outputs`,
        onnxruntime run first), and measure how much its output moves on a second random
        input (``input_sensitivity``).
    rtol, atol : float
        Verification tolerance ``rtol * max|finite reference| + atol``, per shape.
    input_values : dict, optional
        Fixed values for inputs (e.g. a sample rate); must fit every sampled shape.
    seed : int
        Seed of the sampled shapes and random inputs.
    prepare : bool
        Run the ONNX preparation steps.
    compare_with_tvm : bool
        Also build and run with TVM's planner alone.
    progress : callable, optional
    library_path : str or os.PathLike, optional
        Write our build there right after building it, before any run
        (:func:`relax_memplan.compiler.export_library`).

    Returns
    -------
    (executable, DynamicReport)

    Raises
    ------
    ShapeSpecError
        A declared dim is not a symbolic dim of the model, is fixed by ``shapes``, or a
        symbolic dim has no declared range; or ``shapes`` is invalid (as in
        :func:`relax_memplan.frontend.import_onnx`).
    RunError
        The build fails at a sampled shape (e.g. a shape the model cannot take).
    ReferenceRunError
        onnxruntime refuses the inputs at a sampled shape.
    CompileError, ModelLoadError
        As :func:`relax_memplan.compiler.compile_onnx`.
    """
    from . import frontend
    from .onnx_prepare import STEP_NAMES

    say = progress or (lambda _m: None)
    onnx_model = frontend.load_onnx(model) if not hasattr(model, "graph") else model
    say(f"importing {model} with symbolic dims")
    mod, info = frontend.import_onnx(onnx_model, dict(shapes or {}), keep_dynamic=True,
                                     prepare_steps=STEP_NAMES if prepare else ())
    fixed = sorted(set(dim_ranges) & set(info.fixed_dims))
    if fixed:
        raise ShapeSpecError(f"--dim {fixed[0]}: dim '{fixed[0]}' is fixed to "
                             f"{info.fixed_dims[fixed[0]]} by --shape; give it a --shape value "
                             f"or a --dim range, not both")
    params = mod["main"].params
    symbolic = sorted({d.name for p in params for d in getattr(p.ty, "shape", None) or ()
                       if type(d).__name__ == "Var"})
    unknown = sorted(set(dim_ranges) - set(symbolic))
    if unknown:
        raise ShapeSpecError(f"--dim {', '.join(unknown)}: not a symbolic dim of the model "
                             f"(its dims: {', '.join(symbolic) or 'none'})")
    missing = sorted(set(symbolic) - set(dim_ranges))
    if missing:
        raise ShapeSpecError(f"give a range for every symbolic dim of the model: missing --dim for "
                             f"{', '.join(missing)} (e.g. --dim {missing[0]}=1..1 to keep it at 1)")
    settings = plan_pass if plan_pass is not None else PlanStaticMemory()
    dyn = dynamic_pass if dynamic_pass is not None else PlanDynamicMemory(
        strategy=strategy, alignment_bytes=settings.alignment_bytes, algorithms=settings.algorithms,
        time_limit_s=settings.time_limit_s, buckets=buckets, size_classes=size_classes,
        size_class_growth=size_class_growth)
    strategy = dyn.strategy
    kernels = SpecializeKernels(dispatch, schedule=_dispatch_schedule(schedule)) if dispatch else None
    say(f"building once with relax_memplan's {strategy} plan")
    ex = build(mod, "llvm", "relax_memplan", settings, None, dynamic_pass=dyn, dim_ranges=dim_ranges,
               dispatch_pass=kernels, schedule=schedule, check_indices=check_indices)
    if library_path is not None:
        export_library(ex, library_path)
    ex_tvm = None
    if compare_with_tvm:
        say("building with TVM's StaticPlanBlockMemory (same declared ranges)")
        ex_tvm = build(mod, "llvm", "tvm", None, None, dim_ranges=dim_ranges, schedule=schedule,
                       check_indices=check_indices)
    fplan = dyn.plans.get("main")
    report = DynamicReport(model=str(model), strategy=strategy, dims=dict(dim_ranges),
                           notes=[n for n in info.notes if "kept symbolic" not in n])
    if fplan is None or not fplan.planned:
        report.notes.append("no symbolic tensor was planned: "
                            + (fplan.fallback_reason if fplan else "main has no symbolic tensors"))
    else:
        report.planned_tensors = len(fplan.planned)
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
    if not measure:
        report.notes.append("not run (--no-measure): arena and lower bound from the plan only")
    ranges = {n: dim_ranges[n] for n in symbolic}
    for dims in _sample_dims(ranges, sample_shapes, seed):
        shapes = {p.name: tuple(evaluate_int(d, dims) if not isinstance(d, int) else d
                                for d in p.ty.shape) for p in params}
        say("running at " + ", ".join(f"{k}={v}" for k, v in dims.items()))
        point_info = _with_shapes(info, shapes)
        feed = frontend.make_random_inputs(onnx_model, point_info, seed=seed,
                                           values=_fit_values(input_values, shapes))
        arrays = list(feed.values())
        arena, lower_bound = (fplan.bytes_at(dims)[:2] if fplan is not None and fplan.planned
                              else (0, 0))
        row = ShapeMeasurement(dims=dims, runtime_alloc_bytes=None,
                               arena_bytes=arena, lower_bound_bytes=lower_bound)
        if kernels is not None:
            paths = dispatch_path(kernels.specialized, dims)
            row.kernel_paths = sorted(set(paths.values()))
        report.shapes.append(row)
        if not measure:
            continue
        # the reference first: onnxruntime refusing the inputs is a clear error, whereas
        # our build may not check them (e.g. an index beyond the data)
        reference = frontend.run_onnxruntime(onnx_model, feed) if verify else None
        got = _run(ex, arrays, dims, "relax_memplan's build")
        row.runtime_alloc_bytes = got.alloc_bytes
        if ex_tvm is not None:
            row.tvm_default_runtime_alloc_bytes = _run(ex_tvm, arrays, dims,
                                                       "TVM's default build").alloc_bytes
        if verify:
            row.record_comparison(compare_outputs(got.outputs, reference, rtol, atol))
            row.input_sensitivity = reference_sensitivity(
                onnx_model, point_info, reference, rtol, atol, seed,
                _fit_values(input_values, shapes))
    return ex, report


def _run(ex, arrays, dims, build_name):
    """run_checked, with a hint about the shape: the likeliest cause of a failure here."""
    return run_checked(ex, arrays, build_name, dims=dims,
                       hint=" (does the model accept this shape? narrow --dim or give a :STEP)")


def _summarize_skipped(skipped: Sequence[str]) -> List[str]:
    """Kernel-dispatch notes, one line per reason (``"<kernel>: <reason>"`` lines grouped)."""
    reasons: Dict[str, List[str]] = {}
    for note in skipped:
        kernel, _, why = note.partition(": ")
        reasons.setdefault(why or kernel, []).append(kernel)
    return [f"{len(kernels)} kernel(s) {why}" + (f" ({', '.join(kernels[:3])}"
            + (", ..." if len(kernels) > 3 else "") + ")" if why else "")
            for why, kernels in reasons.items()]


def _dispatch_schedule(schedule: bool):
    if schedule:
        from .schedules import schedule_prim_func

        return schedule_prim_func
    return backend_schedule(tvm.target.Target("llvm"))


def _with_shapes(info, shapes):
    import dataclasses

    return dataclasses.replace(info, input_shapes={n: shapes.get(n, s) for n, s in info.input_shapes.items()})


def _fit_values(values, shapes):
    """Fixed input values; a scalar or fixed-shape value is used at every shape."""
    out = {}
    for name, value in (values or {}).items():
        if name in shapes and tuple(np.shape(value)) != tuple(shapes[name]):
            raise ShapeSpecError(f"value for input '{name}' has shape {np.shape(value)}, but the "
                                 f"sampled shape needs {shapes[name]}")
        out[name] = value
    return out
