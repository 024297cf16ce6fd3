"""The one compile path: import an ONNX model (or take a Relax module), build it with our
planner (one build per dynamic strategy) and with TVM's, run the builds at each shape and
report.

A fixed shape is the case without symbolic dims: one build (strategy ``"static"``), one
shape (dims ``{}``), and the report carries the static plan of each function. With
symbolic dims (declared ranges), each strategy is built once and every build runs at the
same sampled shapes on the same inputs; the model is imported and TVM's build made once.
"""

from __future__ import annotations

import dataclasses
import os
from dataclasses import dataclass
from typing import Dict, List, Mapping, Optional, Sequence

import numpy as np
import tvm

from ..analysis.dims import DimRange
from ..errors import RelaxMemplanError, RunError, ShapeSpecError
from ..frontend.prepare.loop_facts import loops_of, with_body_plans
from ..library.inputs import inputs_of
from ..library.manifest import manifest_path
from ..pipeline import PipelinePasses, fusion_counts, fusion_passes
from ..frontend.reference import cast_value
from ..report import CompileReport
from ..transform.hoist_loop_storage import HoistLoopStorage
from ..transform.plan_dynamic_memory import PlanDynamicMemory
from ..transform.record_resident_bytes import RecordResidentBytes
from ..transform.record_storage import RecordStorage
from ..transform.specialize_kernels import SpecializeKernels, backend_schedule
from .build import build, export_library
from ..report.fusion_patterns import pattern_dicts
from ..report.fusion_summary import fusion_skips, summarize_fusion
from ..report.not_applied import features_not_applied
from .measure import ModelSource, StrategyBuild, add_rows, measure_point, physical_memory_bytes
from .shape_casts import check_shape_casts
from .options import BuildOptions, CheckOptions, library_path_for
from .shapes import (check_dims_up_front, fit_values, flag_spelling, sample_dims, shapes_at,
                     symbolic_dims)
from ..report.summary import static_functions, summarize_dynamic

__all__ = ["CompileResult", "compile_model", "compile_strategies", "compile_and_measure",
           "model_name"]

EXAMPLE_NAME = "built-in example (MobileNetV2-style CNN)"


@dataclass
class CompileResult:
    """One build and its report.

    Attributes
    ----------
    executable : tvm.runtime.Executable
        Built with our pipeline.
    report : CompileReport
    outputs : list of numpy.ndarray or None
        Our build's outputs at the last shape run (the only one for fixed shapes).
    library_path : str or None
        Where the library was written.
    """

    executable: tvm.runtime.Executable
    report: CompileReport
    outputs: Optional[List[np.ndarray]] = None
    library_path: Optional[str] = None


def _drop_libraries(builds) -> str:
    """Remove the libraries already written for ``builds`` (a run at a shape of the declared
    ranges failed, so they cannot serve those ranges); the words that say so."""
    dropped = []
    for b in builds:
        if b.library_path is not None and os.path.exists(b.library_path):
            os.remove(b.library_path)
            dropped.append(b.library_path)
        if b.library_path is not None and os.path.exists(manifest_path(b.library_path)):
            os.remove(manifest_path(b.library_path))
    return f"; {', '.join(dropped)} not kept" if dropped else ""


def compile_model(model=None, shapes=None, dim_ranges=None, *, options: BuildOptions = BuildOptions(),
                  check: CheckOptions = CheckOptions(), input_values=None,
                  progress=None) -> CompileResult:
    """:func:`compile_strategies` with one strategy (the first of ``options.strategies``)."""
    if dim_ranges:
        options = _replace(options, strategies=tuple(options.strategies[:1]))
    results = compile_strategies(model, shapes, dim_ranges, options=options, check=check,
                                 input_values=input_values, progress=progress)
    return next(iter(results.values()))


def compile_strategies(model=None, shapes: Optional[Mapping[str, Sequence[int]]] = None,
                       dim_ranges: Optional[Mapping[str, tuple]] = None, *,
                       options: BuildOptions = BuildOptions(), check: CheckOptions = CheckOptions(),
                       input_values: Optional[Mapping[str, np.ndarray]] = None,
                       progress=None) -> Dict[str, CompileResult]:
    """Import an ONNX model, build it with our planner and TVM's, run, verify and report.

    Parameters
    ----------
    model : onnx.ModelProto or path, optional
        ``None``: the built-in example (:func:`relax_memplan.frontend.examples.example_cnn`).
    shapes : mapping of str to sequence of int, optional
        Full shapes of some inputs (``--shape``); without ``dim_ranges`` they must fix every
        symbolic dim of the model, with it the dims they leave free stay symbolic.
    dim_ranges : mapping of str to (int, int or None[, int]), optional
        Declared ranges of every symbolic dim (``--dim``); none: a fixed-shape build.
    options : BuildOptions
    check : CheckOptions
    input_values : mapping of str to numpy.ndarray, optional
        Values to use instead of random inputs (they must fit every shape).
    progress : callable, optional
        Called with a short message before each step.

    Returns
    -------
    dict of str to CompileResult
        By strategy (``"static"`` for a fixed-shape build), in build order.

    Raises
    ------
    ModelLoadError, UnsupportedOperatorError, ShapeSpecError, CompileError,
    ReferenceRunError, RunError
        Bad model, bad shapes or dims (:class:`~relax_memplan.errors.UndeclaredDimError`: a
        symbolic dim neither fixed by ``shapes`` nor ranged by ``dim_ranges``, before any
        import), a failed build, onnxruntime refusing the inputs, a build failing at run time.
    """
    say = progress or (lambda _msg: None)
    dims = dict(dim_ranges or {})
    onnx_model, name, mod, info, renames = _import(model, shapes, dims, options.prepare, say)
    if renames:  # --dim p2o_DynamicDimension_1 (as printed) for p2o.DynamicDimension.1
        dims, options = _renamed(dims, options, renames)
    source = ModelSource(mod=mod, name=name, info=info, onnx_model=onnx_model,
                         values=dict(input_values or {}),
                         notes=[n for n in info.notes if not dims or "kept symbolic" not in n])
    points = _points(source, dims, check)
    results = compile_and_measure(source, dims, points, options, check, say)
    if not dims:
        for result in results.values():
            result.report.inputs = {n: {"shape": list(s), "dtype": info.input_dtypes[n]}
                                    for n, s in info.input_shapes.items()}
    return results


def _import(model, shapes, dims, prepare: bool, say):
    """(onnx model, report name, Relax module, ImportInfo, dim renames); dims stay symbolic
    with ranges; renames: :func:`~relax_memplan.compile.shapes.flag_spelling`."""
    from .. import frontend
    from ..frontend.examples import example_cnn
    from ..frontend.prepare import STEP_NAMES

    name = model_name(model)
    onnx_model = (example_cnn() if model is None else model if hasattr(model, "graph")
                  else frontend.load_onnx(model))
    shapes = _input_spelling(onnx_model, shapes)
    renames = check_dims_up_front(onnx_model, shapes, dims)  # before any import or build
    say(f"importing {name} " + ("with symbolic dims" if dims else "with TVM's ONNX frontend"))
    mod, info = frontend.import_onnx(onnx_model, dict(shapes or {}), keep_dynamic=bool(dims),
                                     prepare_steps=STEP_NAMES if prepare else ())
    return onnx_model, name, mod, info, renames


def _input_spelling(onnx_model, shapes):
    """``--shape`` keyed by the model's input names, an input also taken in its printed
    spelling (``input_1`` for ``input.1``, :func:`~.shapes.flag_spelling`)."""
    from ..frontend.input_shapes import graph_inputs

    shapes = dict(shapes or {})
    names = [v.name for v in graph_inputs(onnx_model)]
    renames = flag_spelling(names, list(shapes))
    return {renames.get(n, n): s for n, s in shapes.items()}


def _renamed(dims, options: BuildOptions, renames):
    """Dim ranges, buckets and dispatch values under the model's dim names."""
    def rename(named):
        return {renames.get(n, n): v for n, v in named.items()}

    return rename(dims), _replace(options, buckets=rename(options.buckets),
                                  dispatch=rename(options.dispatch))


def model_name(model) -> str:
    """The model's name in the report: the path, ``graph 'mlp' (onnx.ModelProto)`` for a model
    in memory (not the proto's whole text), or the built-in example."""
    if model is None:
        return EXAMPLE_NAME
    if hasattr(model, "graph"):
        return f"graph '{model.graph.name}' (onnx.ModelProto)"
    return str(model)


def _points(source: ModelSource, dims, check: CheckOptions) -> List[Dict[str, int]]:
    """The shapes to run at (``[{}]`` for fixed shapes), with the given values checked there
    and the inputs' memory checked against the machine's, before any build."""
    info = source.info
    unknown = sorted(set(source.values) - set(info.input_shapes))
    if unknown:
        raise ShapeSpecError(f"values given for unknown input(s) {unknown}; "
                             f"inputs: {list(info.input_shapes)}")
    for name, value in source.values.items():  # as a run would, also with --no-measure
        cast_value(name, value, info.input_dtypes[name])
    symbolic = symbolic_dims(source.mod, info, dims) if dims else []
    check_shape_casts(source.mod, {n: dims[n] for n in symbolic})
    points = sample_dims({n: dims[n] for n in symbolic}, check.sample_shapes, check.seed)
    have = physical_memory_bytes()
    for point in points:
        shapes = shapes_at(source.mod, point) if point else info.input_shapes
        fit_values(source.values, shapes, sampled=bool(point))
        need = sum(int(np.prod(s, dtype=np.float64)) * np.dtype(info.input_dtypes[n]).itemsize
                   for n, s in shapes.items() if n in info.input_dtypes)
        if (check.measure or check.verify) and have is not None and need > have:
            raise RelaxMemplanError(f"the inputs alone need {need / 2**30:.1f} GiB, the machine "
                                    f"has {have / 2**30:.1f} GiB; use smaller shapes or "
                                    f"--no-measure")
    return points


def compile_and_measure(source: ModelSource, dims, points: Sequence[Dict[str, int]],
                        options: BuildOptions, check: CheckOptions,
                        say) -> Dict[str, CompileResult]:
    """Build each strategy and TVM's once, then add a row per point (run when asked)."""
    mod = source.mod
    strategies = _strategies(dims, options)
    builds = [_build_ours(mod, s, dims, options, say, several=len(strategies) > 1,
                          model=source.name)
              for s in strategies]
    tvm_rec = RecordStorage()
    ex_tvm = None
    if options.compare_with_tvm:
        say("building with TVM's StaticPlanBlockMemory"
            + (" (same declared ranges)" if dims else " for comparison"))
        # the same fusion passes as ours (conv chain mode, schedule): same kernels
        ex_tvm = build(mod, options.tvm_target, options.pipeline_options("tvm", dims),
                       PipelinePasses(record=None if dims else tvm_rec,
                                      fusion=_fusion_list(options)))
    for b in builds:
        _start_report(b, source, dims, options, tvm_rec)
    run = _runnable(builds, options, check)
    for point in points:
        add_rows(builds, point)
        if run:
            try:
                measure_point(point, builds, ex_tvm, source, check, say)
            except RunError as err:
                raise RunError(str(err) + _drop_libraries(builds)) from None
    for b in builds:
        if b.report.is_static and "main" in b.report.functions and b.report.shapes:
            b.report.main.record_run(b.report.shapes[0])
    return {b.strategy: CompileResult(b.executable, b.report, b.outputs, b.library_path)
            for b in builds}


def _fusion_list(options: BuildOptions):
    """A fresh list of the build's fusion passes (its conv chain mode and schedule), or None
    with fusion off. TVM's comparison build gets its own list too: without it, it ran the
    default (``auto`` without schedules), fusing dense conv chains that ours left under
    ``--schedule`` or ``fusion_conv_chain: off``, so the two builds' kernels differed."""
    return fusion_passes(options.tvm_target, options.fusion_conv_chain, options.schedule) \
        if options.fusion else None


def _strategies(dims, options: BuildOptions) -> List[str]:
    if not dims:
        return ["static"]
    if options.dynamic_pass is not None:
        return [options.dynamic_pass.strategy]
    return list(options.strategies)


def _build_ours(mod, strategy: str, dims, options: BuildOptions, say, several: bool,
                model: Optional[str] = None):
    """Our build with one strategy; its library and manifest written right away (before any
    run)."""
    plan_pass = options.plan_pass
    b = StrategyBuild(strategy=strategy, executable=None, report=None, plan_pass=plan_pass,
                      fusion=_fusion_list(options),
                      hoist=HoistLoopStorage(), resident=RecordResidentBytes())
    dump_dir = options.dump_dir
    if dump_dir is not None and several:
        dump_dir = f"{dump_dir}/{strategy}"
    pipeline_options = dataclasses.replace(options.pipeline_options("relax_memplan", dims),
                                           dump_dir=dump_dir)
    passes = PipelinePasses(plan=plan_pass, fusion=b.fusion, reorder=options.reorder_pass,
                            hoist=b.hoist)
    if not dims:
        b.record = passes.record = RecordStorage()
        say(f"building with relax_memplan's planner for {_target_words(options)}")
    else:
        b.dyn = passes.dynamic = options.dynamic_pass or PlanDynamicMemory(
            strategy=strategy, alignment_bytes=plan_pass.alignment_bytes,
            algorithms=plan_pass.algorithms, time_limit_s=plan_pass.time_limit_s,
            buckets=dict(options.buckets) or None, size_classes=options.size_classes,
            size_class_growth=options.size_class_growth, inplace=plan_pass.inplace)
        b.kernels = passes.dispatch = (SpecializeKernels(dict(options.dispatch), schedule=
                                       _dispatch_schedule(options)) if options.dispatch else None)
        say(f"building once with relax_memplan's {strategy} plan for {_target_words(options)}")
    lowered = []
    b.executable = build(mod, options.tvm_target, pipeline_options, passes, b.resident,
                         notes=b.notes, lowered=lowered)
    b.lowered = lowered[0] if lowered and not dims and b.fusion is not None else None
    if options.library_path is not None:
        b.library_path = library_path_for(options.library_path, strategy, several)
        resident = b.resident.resident
        export_library(b.executable, b.library_path, target=options.tvm_target,
                       inputs=inputs_of(mod), dims=dims, model=model,
                       constants_bytes=resident.constants_bytes,
                       workspace_bytes=resident.workspace_bytes)
    return b


def _fusion_counts(passes, options: BuildOptions):
    """:func:`fusion_counts` of a build's fusion passes (None: fusion off), with
    ``conv_chain: "off"`` where ``fusion_conv_chain: off`` removed the pass on a CPU target."""
    if passes is None:
        return None
    counts = fusion_counts(passes)
    if options.fusion_conv_chain == "off" and options.tvm_target.kind.name in ("llvm", "c"):
        counts["conv_chain"] = "off"
    return counts


def _start_report(b: StrategyBuild, source: ModelSource, dims, options: BuildOptions,
                  tvm_rec) -> None:
    """The report of a build before any run: the plan's summary."""
    arch, cpu = options.cuda_arch_used, options.cpu_used
    b.report = CompileReport(model=source.name, target=str(options.tvm_target.kind.name),
                             resident=b.resident.resident,
                             arch=arch.arch if arch else None,
                             cpu=cpu.mcpu if cpu else None,
                             cpu_source=cpu.source if cpu else None,
                             notes=[*source.notes, *b.notes], strategy=b.strategy, dims=dict(dims),
                             fusion=_fusion_counts(b.fusion, options),
                             fusion_skipped=fusion_skips(b.fusion),
                             fusion_patterns=pattern_dicts(b.fusion),
                             loops=with_body_plans(loops_of(source.mod),
                                                   b.plan_pass.plans))
    if not dims:
        b.report.functions, fallbacks = static_functions(b.plan_pass, b.record,
                                                         tvm_rec if options.compare_with_tvm
                                                         else None,
                                                         b.hoist, options.reorder_pass,
                                                         options.tvm_target)
        b.report.notes += fallbacks
        if b.fusion is not None and "main" in b.report.functions:
            # what fusion changed: the build's own module and plan, beside the Relax phases
            # run again without our fusion
            b.report.fusion_summary = summarize_fusion(
                source.mod, options.tvm_target, source.onnx_model,
                conv_chain=options.fusion_conv_chain, schedule=options.schedule,
                plan_pass=b.plan_pass, reorder=options.reorder_pass is not None,
                fused=b.lowered, fusion_pass_list=b.fusion).to_dict()
        b.lowered = None
        return
    # the values planned: those outside the dim's range are skipped, with a note, and the
    # header lists none of them
    b.report.buckets = {n: [x for x in v if n not in dims or x in DimRange(*dims[n])]
                        for n, v in (b.dyn.buckets or {}).items()} \
        if b.strategy == "buckets" else {}
    summarize_dynamic(b.report, b.dyn, b.kernels)
    b.report.not_applied = features_not_applied(
        source.mod, strategy=b.strategy, inplace=b.dyn.inplace,
        concat_inplace=b.plan_pass.concat_inplace, inplace_calls=b.report.inplace_calls,
        conv_chain=any(p.info.name == "FuseConvChain" for p in b.fusion or []))


def _runnable(builds, options: BuildOptions, check: CheckOptions) -> bool:
    """Whether the builds can run here (CPU targets, a ``main``); a note when not."""
    if options.tvm_target.kind.name not in ("llvm", "c"):
        for b in builds:
            b.report.notes.append(f"built for {_target_words(options)}, not run: "
                                  f"{_not_run_reason(options)}")
        return False
    if not (check.measure or check.verify):
        if builds[0].report.dims:
            for b in builds:
                b.report.notes.append("not run (--no-measure): arena and lower bound from the "
                                      "plan only")
        return False
    return all(not b.report.is_static or "main" in b.report.functions for b in builds)


def _not_run_reason(options: BuildOptions) -> str:
    """Why a non-CPU build was not run, in plain words, and what was checked (for cuda:
    whether TVM sees a CUDA device, ``tvm.cuda(0).exist``)."""
    from ..targets import installed_cuda_arch

    why = "compile runs and verifies CPU builds only"
    if options.tvm_target.kind.name == "cuda" and installed_cuda_arch() is None:
        why = ("no CUDA device was found here (checked: tvm.cuda(0).exist is false), so the "
               "build was compiled only")
    return (f"{why}; the arena and lower bound come from the plan; for run-time bytes and "
            f"verification compile with --target llvm")


def _target_words(options: BuildOptions) -> str:
    """``llvm rocketlake (this machine's CPU; ...)``, or ``cuda sm_80 (the default: no CUDA GPU
    here; set --cuda-arch)``."""
    arch, cpu = options.cuda_arch_used, options.cpu_used
    described = arch.describe() if arch else cpu.describe() if cpu else None
    return options.tvm_target.kind.name + (f" {described}" if described else "")


def _dispatch_schedule(options: BuildOptions):
    """The schedule of specialized kernels: ours (``schedule`` on llvm), else the target's
    (dlight's GPU rules for cuda: a specialized kernel must stay a GPU kernel)."""
    target = options.tvm_target
    if options.schedule and target.kind.name == "llvm":
        from ..schedules import schedule_prim_func

        return schedule_prim_func
    return backend_schedule(target)


def _replace(options: BuildOptions, **changes) -> BuildOptions:
    import dataclasses

    return dataclasses.replace(options, **changes)
