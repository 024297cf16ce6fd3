"""Compile a Relax module (or an ONNX model) with our planner and TVM's, measure and report.

This is the library behind ``relax-memplan compile``: the CLI only parses
arguments and calls :func:`compile_onnx`.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from typing import Callable, Dict, List, Optional, Sequence, Union

import numpy as np
import tvm

from .errors import CompileError, RelaxMemplanError, summarize_error
from .pipeline import get_pipeline
from .report import FunctionMemoryReport, MemoryReport
from .runtime import RuntimeMemory, run_checked
from .verify import compare_outputs, input_sensitivity
from .transform.check_index_bounds import CheckIndexBounds
from .transform.plan_static_memory import PlanStaticMemory
from .transform.record_storage import RecordStorage

__all__ = ["CompileResult", "build", "compile_module", "compile_onnx", "export_library",
           "max_abs_error", "reference_sensitivity"]

Progress = Optional[Callable[[str], None]]


@dataclass
class CompileResult:
    """What :func:`compile_module` / :func:`compile_onnx` produced.

    Attributes
    ----------
    executable : tvm.runtime.Executable
        Built with our pipeline.
    report : MemoryReport
    outputs : list of numpy.ndarray or None
        Our build's outputs on the measured inputs.
    """

    executable: tvm.runtime.Executable
    report: MemoryReport
    outputs: Optional[List[np.ndarray]] = None


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
    reference moves (:func:`relax_memplan.verify.input_sensitivity`); None when every input
    is given in ``values`` (nothing to draw)."""
    from . import frontend

    if set(values or {}) >= set(info.input_shapes):
        return None
    other = frontend.make_random_inputs(onnx_model, info, seed=seed + 1, values=values)
    return input_sensitivity(reference, frontend.run_onnxruntime(onnx_model, other), rtol, atol)


_KERNEL_OPTIONS = ("dim_ranges", "dispatch", "dispatch_pass", "schedule", "check_indices", "fusion")
"""``get_pipeline`` options that change the kernels, not the memory plan: kept by the retry
with TVM's planner that decides whose fault a failed build is."""


def build(mod, target, planner: str, plan_pass, record: Optional[RecordStorage], dump_dir=None,
          **pipeline_kwargs):
    """``tvm.compile`` with our pipeline; a failure becomes a one-line :class:`CompileError`
    that says whether TVM's own planner fails too.

    To say so, a failed build with our planner is retried with TVM's planner and the same
    kernel options (``dim_ranges``, ``dispatch``/``dispatch_pass``, ``schedule``), without our
    planning passes (``plan_pass``, ``dynamic_pass``): a failure caused by a kernel option then
    fails the retry too and is not blamed on our planner."""
    index_pass = CheckIndexBounds(runtime_checks=pipeline_kwargs.get("check_indices", True)
                                  and tvm.target.Target(target).kind.name != "cuda")
    pipeline = get_pipeline(target, planner=planner, plan_pass=plan_pass, record_pass=record,
                            dump_dir=dump_dir, index_pass=index_pass, **pipeline_kwargs)
    try:
        return tvm.compile(mod, target, relax_pipeline=pipeline)
    except Exception as err:  # TVM raises many types; re-raised as one clear error
        if index_pass.refused is not None:  # the model cannot serve a declared dim range
            raise index_pass.refused from None
        if planner == "tvm":
            raise CompileError.from_tvm(planner, err) from err
        # Whose fault? Build again with TVM's planner alone (same kernels) to say so.
        kernel_options = {k: v for k, v in pipeline_kwargs.items() if k in _KERNEL_OPTIONS}
        try:
            tvm.compile(mod, target, relax_pipeline=get_pipeline(
                target, planner="tvm", **kernel_options))
        except Exception:  # noqa: BLE001 - any failure means TVM itself cannot build it
            raise CompileError(
                f"TVM cannot build this model{_with_options(kernel_options)} (it fails with "
                f"TVM's own memory planner too): {summarize_error(err)}") from err
        raise CompileError(
            f"the build with relax_memplan's planner failed although TVM's own planner builds "
            f"it (please report this): {summarize_error(err)}") from err


def export_library(executable: tvm.runtime.Executable, path) -> None:
    """Write ``executable`` as a shared library that ``tvm.runtime.load_module`` loads.

    Call it before the executable is ever run: creating a ``relax.VirtualMachine`` on an
    executable records an empty memory scope per tensor constant in it (TVM 0.27's
    ``vm.cc``, ``exec_->memory_scopes[i]``), and a library exported afterwards prints one
    ``Warning: Scope Loaded:`` line per constant each time it is loaded.

    Parameters
    ----------
    executable : tvm.runtime.Executable
        Result of ``tvm.compile``.
    path : str or os.PathLike
        Where to write the library (``.so``); parent folders are created.

    Raises
    ------
    RelaxMemplanError
        The library cannot be written (one line: the path and the reason).
    """
    from .runtime import raise_if_interrupted

    raise_if_interrupted()  # never write a library from a build a Ctrl-C cut short
    try:
        os.makedirs(os.path.dirname(os.fspath(path)) or ".", exist_ok=True)
        executable.export_library(os.fspath(path))
    except (OSError, RuntimeError) as err:
        raise RelaxMemplanError(f"cannot write the library {os.fspath(path)}: "
                                f"{summarize_error(err)}") from None


def _with_options(kernel_options) -> str:
    """`` with dispatch={...}, schedule=True`` for the kernel options in use, else ``""``."""
    shown = []
    if kernel_options.get("dispatch_pass") is not None:
        shown.append(f"dispatch={dict(kernel_options['dispatch_pass'].buckets)}")
    elif kernel_options.get("dispatch"):
        shown.append(f"dispatch={dict(kernel_options['dispatch'])}")
    if kernel_options.get("schedule"):
        shown.append("schedule=True")
    return f" with {', '.join(shown)}" if shown else ""


def _physical_memory_bytes() -> Optional[int]:
    try:
        return os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")
    except (ValueError, OSError, AttributeError):
        return None


def _check_fits_in_memory(main: FunctionMemoryReport, inputs) -> None:
    """Refuse to run a build whose static plan needs more bytes than the machine has."""
    need = main.expected_runtime_alloc_bytes + sum(np.asarray(x).nbytes for x in inputs)
    have = _physical_memory_bytes()
    if have is not None and need > have:
        raise RelaxMemplanError(
            f"running this build needs about {need / 2**30:.1f} GiB but the machine has "
            f"{have / 2**30:.1f} GiB; use smaller shapes or --no-measure")


def compile_module(
    mod: tvm.IRModule,
    inputs: Optional[Sequence[np.ndarray]] = None,
    *,
    target: Union[str, tvm.target.Target] = "llvm",
    plan_pass: Optional[PlanStaticMemory] = None,
    reference: Optional[Sequence[np.ndarray]] = None,
    rtol: float = 1e-4,
    atol: float = 1e-5,
    name: str = "module",
    notes: Sequence[str] = (),
    compare_with_tvm: bool = True,
    dump_dir=None,
    progress: Progress = None,
    schedule: bool = False,
    check_indices: bool = True,
    library_path=None,
) -> CompileResult:
    """Build ``mod`` with our pipeline (and TVM's for comparison), run it, report memory.

    Parameters
    ----------
    mod : tvm.IRModule
        A Relax module as imported (before legalization).
    inputs : sequence of numpy.ndarray, optional
        Arguments of ``main``; when given, both builds are run once on them and
        the bytes they allocate are measured (CPU targets only).
    target : str or tvm.target.Target
        ``llvm`` or ``cuda``.
    plan_pass : PlanStaticMemory, optional
        Our pass, configured; a default one otherwise.
    reference : sequence of numpy.ndarray, optional
        Expected outputs (e.g. from onnxruntime); sets ``max_abs_error`` and the other
        fields of :func:`relax_memplan.verify.compare_outputs` (NaN/Inf compared by position).
    rtol, atol : float
        Tolerance ``rtol * max|finite reference| + atol`` on the max abs error.
    name : str
        Model name for the report.
    notes : sequence of str
        Notes to carry into the report.
    compare_with_tvm : bool
        Also build with TVM's planner alone (the ``tvm_default_*`` fields).
    dump_dir : path, optional
        Write the IR after each phase of our pipeline there.
    progress : callable, optional
        Called with a short message before each step.
    schedule : bool
        Apply our CPU matmul schedules to both builds (llvm only).
    check_indices : bool
        Check index values at run time in both builds (see
        :class:`~relax_memplan.transform.check_index_bounds.CheckIndexBounds`).
    library_path : str or os.PathLike, optional
        Write our build there (:func:`export_library`) right after building it, before any run.

    Returns
    -------
    CompileResult

    Raises
    ------
    CompileError
        If TVM fails to build the module.
    RelaxMemplanError
        If ``library_path`` cannot be written.
    RunError
        If a build fails at run time (one line, the input shapes named).
    VerificationError
        If the outputs and ``reference`` differ in count or shape.
    """
    say = progress or (lambda _msg: None)
    tgt = tvm.target.Target(target) if isinstance(target, str) else target
    plan_pass = plan_pass if plan_pass is not None else PlanStaticMemory()
    ours_rec, tvm_rec = RecordStorage(), RecordStorage()
    say(f"building with relax_memplan's planner for {tgt.kind.name}")
    ex = build(mod, tgt, "relax_memplan", plan_pass, ours_rec, dump_dir, schedule=schedule,
               check_indices=check_indices)
    if library_path is not None:
        export_library(ex, library_path)
    ex_tvm = None
    if compare_with_tvm:
        say("building with TVM's StaticPlanBlockMemory for comparison")
        ex_tvm = build(mod, tgt, "tvm", None, tvm_rec, schedule=schedule,
                       check_indices=check_indices)

    functions: Dict[str, FunctionMemoryReport] = {}
    for fname, fplan in plan_pass.plans.items():
        ours, theirs = ours_rec.summaries.get(fname), tvm_rec.summaries.get(fname)
        live = fplan.liveness
        placed = {uid for arena in fplan.arenas for uid in arena.offsets}
        functions[fname] = FunctionMemoryReport(
            name=fname,
            num_tensors=len(live.tensors),
            num_planned=len(placed),
            left_to_tvm=[
                {"tensor": t.uid, "size_bytes": t.size_bytes,
                 "reason": t.reason or "TVM's plan of the function is smaller"}
                for t in live.tensors if t.uid not in placed
            ],
            lower_bound_bytes=fplan.lower_bound_bytes,
            unaligned_lower_bound_bytes=fplan.unaligned_lower_bound_bytes,
            arena_bytes=fplan.arena_bytes,
            planned_bytes=ours.planned_bytes if ours else fplan.arena_bytes,
            unplanned_bytes=ours.unplanned_bytes if ours else 0,
            tvm_default_bytes=theirs.static_total_bytes if theirs else 0,
            tvm_default_unplanned_bytes=theirs.unplanned_bytes if theirs else 0,
            num_runtime_sized_allocs=ours.num_symbolic if ours else 0,
            algorithm=", ".join(sorted({a.algorithm for a in fplan.arenas})),
            fallback=fplan.fallback_reason,
        )
        if fplan.fallback_reason:
            notes = [*notes, f"function {fname} keeps TVM's memory plan: {fplan.fallback_reason}"]
    report = MemoryReport(model=name, target=str(tgt.kind.name), inputs={}, functions=functions,
                          notes=list(notes))
    outputs = None
    if inputs is not None and tgt.kind.name not in ("llvm", "c"):
        report.notes.append(f"built for {tgt.kind.name} only: run-time bytes and verification "
                            f"need a CPU (llvm) build")
    if inputs is not None and tgt.kind.name in ("llvm", "c") and "main" in functions:
        _check_fits_in_memory(functions["main"], inputs)
        main = functions["main"]
        say("running our build once (naive allocator, counting alloc_storage)")
        measured: RuntimeMemory = run_checked(ex, inputs, "relax_memplan's build")
        main.runtime_alloc_bytes, main.runtime_num_allocs = measured.alloc_bytes, measured.num_allocs
        outputs = measured.outputs
        if ex_tvm is not None:
            say("running TVM's default build on the same inputs")
            base = run_checked(ex_tvm, inputs, "TVM's default build")
            main.tvm_default_runtime_alloc_bytes = base.alloc_bytes
            main.tvm_default_runtime_num_allocs = base.num_allocs
            main.max_abs_diff_vs_tvm_default = max_abs_error(outputs, base.outputs)
        if reference is not None:
            main.record_comparison(compare_outputs(outputs, reference, rtol, atol))
    return CompileResult(executable=ex, report=report, outputs=outputs)


def compile_onnx(
    model=None,
    shapes: Optional[Dict[str, Sequence[int]]] = None,
    *,
    target: Union[str, tvm.target.Target] = "llvm",
    plan_pass: Optional[PlanStaticMemory] = None,
    verify: bool = False,
    measure: bool = True,
    input_values: Optional[Dict[str, np.ndarray]] = None,
    seed: int = 0,
    rtol: float = 1e-4,
    atol: float = 1e-5,
    dump_dir=None,
    progress: Progress = None,
    prepare: bool = True,
    schedule: bool = False,
    check_indices: bool = True,
    library_path=None,
) -> CompileResult:
    """Import an ONNX model with TVM's frontend, compile it with our planner, report memory.

    Parameters
    ----------
    model : onnx.ModelProto or path, optional
        The model; ``None`` uses the built-in example (:func:`relax_memplan.examples.example_cnn`).
    shapes : dict of str to sequence of int, optional
        Full shape per input (fixes dynamic dims; unfixed ones default to 1).
    target : str or tvm.target.Target
        ``llvm`` (measured and verified) or ``cuda`` (built only).
    plan_pass : PlanStaticMemory, optional
        Our configured pass.
    verify : bool
        Run onnxruntime on the same inputs (before our build runs) and compare
        (:func:`relax_memplan.verify.compare_outputs`); also run it on a second random
        input and record ``input_sensitivity`` (a warning when the output barely moves).
    measure : bool
        Run both builds once and measure the bytes they allocate.
    input_values : dict of str to numpy.ndarray, optional
        Inputs to use instead of random ones (e.g. a sample rate).
    seed : int
        Seed of the random inputs.
    rtol, atol : float
        Verification tolerance.
    dump_dir : path, optional
        Write the IR after each phase.
    progress : callable, optional
        Called with a short message before each step.
    prepare : bool
        Run the ONNX preparation steps (:mod:`relax_memplan.onnx_prepare`)
        before TVM's importer; ``False`` uses TVM's importer as it is.
    schedule : bool
        Apply our CPU matmul schedules (:mod:`relax_memplan.schedules`) to both
        builds (llvm only).
    check_indices : bool
        Check index values at run time (see :func:`compile_module`).
    library_path : str or os.PathLike, optional
        Write our build there before it runs (see :func:`compile_module`).

    Returns
    -------
    CompileResult

    Raises
    ------
    ModelLoadError, UnsupportedOperatorError
        Missing or malformed model, or an ONNX node TVM cannot import (named).
    ShapeSpecError
        Shapes that do not fit the model's inputs.
    CompileError
        TVM failed to build.
    ReferenceRunError
        onnxruntime refused the model or the inputs.
    RunError
        A build failed at run time.
    """
    from . import frontend
    from .errors import ShapeSpecError
    from .examples import example_cnn
    from .onnx_prepare import STEP_NAMES

    say = progress or (lambda _msg: None)
    name = "built-in example (MobileNetV2-style CNN)" if model is None else str(model)
    onnx_model = example_cnn() if model is None else frontend.load_onnx(model) if not hasattr(model, "graph") else model
    say(f"importing {name} with TVM's ONNX frontend")
    mod, info = frontend.import_onnx(onnx_model, shapes, prepare_steps=STEP_NAMES if prepare else ())
    unknown = sorted(set(input_values or {}) - set(info.input_shapes))
    if unknown:
        raise ShapeSpecError(f"values given for unknown input(s) {unknown}; "
                             f"inputs: {list(info.input_shapes)}")
    for n, value in (input_values or {}).items():
        if tuple(np.shape(value)) != tuple(info.input_shapes[n]):
            raise ShapeSpecError(f"value for input '{n}' has shape {tuple(np.shape(value))}, "
                                 f"expected {tuple(info.input_shapes[n])}")
    need = sum(int(np.prod(s, dtype=np.float64)) * np.dtype(info.input_dtypes[n]).itemsize
               for n, s in info.input_shapes.items())
    have = _physical_memory_bytes()
    if (measure or verify) and have is not None and need > have:
        raise RelaxMemplanError(f"the inputs alone need {need / 2**30:.1f} GiB, the machine has "
                                f"{have / 2**30:.1f} GiB; use smaller shapes or --no-measure")
    arrays = None
    if measure or verify:
        feed = frontend.make_random_inputs(onnx_model, info, seed=seed, values=input_values)
        arrays = list(feed.values())
    reference = None
    if verify:
        say("running onnxruntime for reference outputs")
        reference = frontend.run_onnxruntime(onnx_model, feed)
    result = compile_module(
        mod, arrays, target=target, plan_pass=plan_pass, reference=reference, rtol=rtol, atol=atol,
        name=name, notes=info.notes, dump_dir=dump_dir, progress=progress, schedule=schedule,
        check_indices=check_indices, library_path=library_path,
    )
    main = result.report.main
    if reference is not None and main.error_tolerance is not None:
        say("running onnxruntime on a second random input (does the output depend on it?)")
        main.input_sensitivity = reference_sensitivity(onnx_model, info, reference, rtol, atol,
                                                       seed, input_values)
    result.report.inputs = {
        n: {"shape": list(s), "dtype": info.input_dtypes[n]} for n, s in info.input_shapes.items()
    }
    return result
