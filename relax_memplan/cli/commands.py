"""The four commands of ``relax-memplan``, each a function of the parsed arguments that
returns the exit status: ``compile`` (:func:`relax_memplan.compile.compile_strategies`),
``run`` (:func:`relax_memplan.tools.run.run_library`), ``inspect``
(:func:`relax_memplan.tools.inspect.inspect_onnx`) and ``bench``
(:func:`relax_memplan.tools.bench.bench_onnx`). They check the arguments, call the library
function and print; :func:`relax_memplan.cli.main` runs them.

Each command imports the library it calls when it runs: ``--help``, ``--version`` and bad
arguments are answered without loading TVM, onnx or numpy.
"""

from __future__ import annotations

import contextlib
import dataclasses
import functools
import json
import sys
import warnings
from pathlib import Path

from ..errors import RelaxMemplanError, summarize_error
from .args import (check_distinct_paths, check_environment, check_output_path,
                   check_target_flags, input_files, parse_inputs, parse_repeated)
from .console import native_log

__all__ = ["COMMANDS", "EXIT_VERIFY_FAILED"]

EXIT_VERIFY_FAILED = 3


def _log_mode(args) -> str:
    """What becomes of TVM's native log lines: -q drops them, -v shows them as they come,
    by default each distinct line is shown once with its count."""
    return "mute" if args.quiet else "verbose" if args.verbose else "once"


def _progress(args):
    """The progress callback: each phase with its seconds (``None`` with -q)."""
    from .console import PhaseProgress

    return None if args.quiet else PhaseProgress()


def _finish(progress) -> None:
    if progress is not None:
        progress.finish()


def _compile(args) -> int:
    from ..compile import CheckOptions, compile_strategies
    from ..config import load_config
    from ..frontend import parse_shape_spec
    from ..report.text import format_side_by_side
    from ..tools.run import refuse_compiled_library

    check_distinct_paths([("model", args.model), ("config", args.config)]
                         + input_files(args.input),
                         [("-o", args.output), ("--report", args.report), ("--plot", args.plot),
                          ("--dump-ir", args.dump_ir)] + _manifest_of(args.output))
    refuse_compiled_library(args.model, "compile")
    config = load_config(args.config)
    if args.target is None:
        args.target = config.target
    check_environment(args)
    _check_config_cpu(args, config)
    shapes = {name: tuple(dims) for name, dims in config.shapes.items()}
    shapes.update(parse_repeated(args.shape, parse_shape_spec, "--shape"))
    input_values = parse_inputs(args.input)
    dims, options = _build_options(args, config)
    check = CheckOptions(measure=not args.no_measure, verify=args.verify, rtol=config.verify.rtol,
                         atol=config.verify.atol, seed=config.verify.seed,
                         sample_shapes=3 if args.sample_shapes is None else args.sample_shapes)
    progress = _progress(args)
    with native_log(_log_mode(args)):
        results = compile_strategies(args.model, shapes, dims, options=options, check=check,
                                     input_values=input_values, progress=progress)
        _finish(progress)  # before TVM's collected log lines
    reports = {name: result.report for name, result in results.items()}
    _warn_large_arena(args, reports.values())  # before the table, where it is seen
    print(format_side_by_side(reports) if len(reports) > 1
          else next(iter(reports.values())).format_text())
    if args.explain_fusion:
        _explain_fusion(reports)
    _write_outputs(args, results, options.plan_pass)
    if args.verify and any(r.verified is False for r in reports.values()):
        # the report says it on stdout among many lines; -q or a redirect would hide it
        failed = ", ".join(name for name, r in reports.items() if r.verified is False)
        print(f"relax-memplan: error: verification against onnxruntime failed ({failed}): "
              f"the outputs differ beyond rtol {config.verify.rtol} / atol "
              f"{config.verify.atol}; see the report's verification lines", file=sys.stderr)
        return EXIT_VERIFY_FAILED
    return 0


def _explain_fusion(reports) -> None:
    """``--explain-fusion``: each refused fusion candidate of each build, with its bindings."""
    from ..report.fusion_patterns import explain_lines

    for name, report in reports.items():
        head = "fusion candidates refused" + (f" ({name})" if len(reports) > 1 else "")
        print(f"{head}:" if report.fusion is not None else f"{head}: fusion is off")
        if report.fusion is not None:
            print("\n".join(explain_lines(report.fusion_patterns)))


def _warn_large_arena(args, reports) -> None:
    """One warning line when the arena at the largest sampled shape exceeds this machine's
    memory (:func:`~relax_memplan.cli.arena_warning.large_arena_warning`); none with -q.
    Printed before the report: after the table it scrolls by unseen."""
    from .arena_warning import large_arena_warning

    warning = None if args.quiet else large_arena_warning(reports)
    if warning:
        sys.stdout.flush()  # whatever stdout holds stays before it
        print(f"relax-memplan: warning: {warning}", file=sys.stderr, flush=True)


def _check_config_cpu(args, config) -> None:
    """The config file's ``cpu`` checked against LLVM before the import, its error naming the
    file's key (``--cpu`` given instead replaces it and is checked with the flags)."""
    from ..targets import resolve_cpu

    if getattr(args, "cpu", None) is None and config.cpu is not None \
            and getattr(args, "target", "llvm") in (None, "llvm"):
        resolve_cpu(config.cpu, f"{args.config}: cpu")


def _build_options(args, config):
    """(declared dim ranges, BuildOptions) from the command line and the config."""
    from ..compile import BuildOptions

    planner = config.planner
    plan_pass, reorder_pass = _planner_passes(planner, args.time_limit, args.inplace,
                                              args.reorder)
    common = dict(target=args.target, cuda_arch=args.cuda_arch or config.cuda_arch,
                  plan_pass=plan_pass, reorder=reorder_pass is not None,
                  reorder_pass=reorder_pass, dump_dir=args.dump_ir,
                  cpu=args.cpu or config.cpu,
                  prepare=not args.no_prepare,
                  schedule=config.schedule if args.schedule is None else args.schedule,
                  check_indices=config.check_indices and not args.no_index_checks,
                  fusion=config.fusion if args.fusion is None else args.fusion,
                  fusion_conv_chain=config.fusion_conv_chain, library_path=args.output,
                  compare_with_tvm=not args.no_compare)
    if not (args.dim or config.dims):
        if args.strategy:
            raise RelaxMemplanError(f"--strategy {args.strategy} plans symbolic dims: give --dim "
                                    f"NAME=LO..HI (a fixed-shape build has one plan)")
        if args.bucket or args.dispatch or args.size_classes or config.dispatch:
            raise RelaxMemplanError("--bucket, --dispatch and --size-classes (or config "
                                    "dispatch) need symbolic dims: give --dim NAME=LO..HI")
        if getattr(args, "sample_shapes", None) is not None:
            # taken silently it would do nothing: a fixed-shape build runs at its one shape
            raise RelaxMemplanError(f"--sample-shapes {args.sample_shapes} samples the "
                                    f"ranges of symbolic dims: give --dim NAME=LO..HI (a "
                                    f"fixed-shape build runs at its one shape)")
        return {}, BuildOptions(**common)
    ranges, buckets, dispatch = _dynamic_specs(args, config)
    strategy = args.strategy or planner.strategy
    if strategy == "buckets" and not buckets:
        raise RelaxMemplanError("--strategy buckets needs --bucket NAME=V1,V2,... "
                                "(or planner.buckets)")
    if args.bucket and strategy not in ("buckets", "all"):
        # a bucket only shapes the buckets strategy's plans: taken silently it would do nothing
        raise RelaxMemplanError(f"--bucket plans buckets, which --strategy {strategy} does not "
                                f"make: add --strategy buckets (or all)")
    from ..compile import STRATEGIES

    strategies = ([s for s in STRATEGIES if s != "buckets" or buckets] if strategy == "all"
                  else [strategy])
    return ranges, BuildOptions(**common, strategies=tuple(strategies), buckets=buckets,
                                size_classes=args.size_classes or planner.size_classes,
                                size_class_growth=planner.size_class_growth, dispatch=dispatch)


def _planner_passes(planner, time_limit=None, inplace=None, reorder=None):
    """(PlanStaticMemory, ReorderForMemory or None) from the config's ``planner`` section, the
    command line's values (None: the config's) overriding it; compile and bench share it."""
    from ..compile import default_planner_passes

    return default_planner_passes(planner, time_limit, inplace, reorder)


def _dynamic_specs(args, config):
    """(--dim ranges, --bucket values, --dispatch values), config first, checked."""
    from ..compile import parse_dim_spec, parse_values_spec

    if args.model is None:
        raise RelaxMemplanError("--dim needs a model with symbolic dims (the built-in example "
                                "has none)")
    ranges = dict(config.dims)
    ranges.update(parse_repeated(args.dim, parse_dim_spec, "--dim"))
    buckets = dict(config.planner.buckets)
    buckets.update(parse_repeated(args.bucket, functools.partial(parse_values_spec,
                                                                 option="--bucket"), "--bucket"))
    dispatch = dict(config.dispatch)
    dispatch.update(parse_repeated(args.dispatch, functools.partial(
        parse_values_spec, option="--dispatch"), "--dispatch"))
    for option, named in (("--bucket", buckets), ("--dispatch", dispatch)):
        unknown = sorted(set(named) - set(ranges))
        if unknown:
            raise RelaxMemplanError(f"{option} {', '.join(unknown)}: not a dim given with --dim "
                                    f"(dims: {', '.join(sorted(ranges))})")
    return ranges, buckets, dispatch


def _write_outputs(args, results, plan_pass) -> None:
    """Say where -o went (written right after each build, before any run: a library
    exported after a run prints TVM warnings when loaded), then write --plot, --report."""
    try:
        for name, result in results.items():
            if result.library_path:
                which = f" ({name})" if len(results) > 1 else ""
                print(f"library{which} written to {result.library_path}{_run_hint(result)}")
        if args.plot:
            _plot(args.plot, results, plan_pass)
        if args.report:
            data = ({"strategies": {n: r.report.to_dict() for n, r in results.items()}}
                    if len(results) > 1 else next(iter(results.values())).report.to_dict())
            path = Path(args.report)
            path.parent.mkdir(parents=True, exist_ok=True)
            path.write_text(json.dumps(data, indent=2) + "\n", encoding="utf-8")
            print(f"report written to {args.report}")
    except (OSError, RuntimeError) as err:
        raise RelaxMemplanError(f"cannot write output: {summarize_error(err)}") from None


def _run_hint(result) -> str:
    """``; run it with: ...``, the command line that runs the library just written, quoted to
    paste; empty for a cuda library (``relax-memplan run`` runs CPU libraries)."""
    from ..tools.run import run_command

    if result.report.target != "llvm":
        return ""
    command = run_command(result.library_path, list(result.report.inputs))
    return (f"; run it with: {command}" if result.report.inputs else
            f"; run it with: {command} --input NAME=FILE.npy (one per input)")


def _plot(path, results, plan_pass) -> None:
    """The arena plan (fixed shapes) or the per-shape bytes chart (symbolic dims)."""
    from ..report.plot import plot_plan, plot_shapes

    if "static" in results:
        plot_plan(plan_pass.plans["main"], path, title=results["static"].report.model)
        print(f"plan drawn to {path}")
        return
    reports = {name: result.report for name, result in results.items()}
    plot_shapes(reports, path, title=next(iter(reports.values())).model)
    print(f"bytes per sampled shape drawn to {path}")


@contextlib.contextmanager
def _manifest_warning_as_a_line():
    """A library without its manifest: ``relax-memplan: warning: ...`` on one line, at once
    (Python's own form would add the source line)."""
    from ..library.manifest import MissingManifestWarning

    with warnings.catch_warnings():
        show_default = warnings.showwarning

        def show(message, category, *rest, **kwargs):
            if issubclass(category, MissingManifestWarning):
                print(f"relax-memplan: warning: {message}", file=sys.stderr, flush=True)
            else:
                show_default(message, category, *rest, **kwargs)

        warnings.simplefilter("always", MissingManifestWarning)
        warnings.showwarning = show
        yield


def _manifest_of(library) -> list:
    """The manifest ``-o`` writes beside the library, as one more output: ``--report
    a.so.json`` would overwrite it and leave a library that ``run`` refuses."""
    if not library:
        return []
    from ..library.manifest import manifest_path

    return [("the manifest of -o", manifest_path(library))]


def _run(args) -> int:
    from ..tools.run import check_library_file, fill_numbers, npz_path, run_library, save_outputs

    if args.output and not args.output.endswith(".npz"):
        # numpy.savez would append ".npz": the file written would not be the one named
        raise RelaxMemplanError(f"--output {args.output}: the outputs are written as a NumPy "
                                f".npz archive; give a file name ending in .npz")
    files = input_files(args.input)
    check_distinct_paths([("library", args.library)] + files,
                         [("--output", args.output and npz_path(args.output))])
    if args.output:
        check_output_path("--output", npz_path(args.output))
    check_library_file(args.library)  # before any input is read: a wrong file comes first
    values = parse_inputs(args.input)
    from_files = {label.split(" ", 1)[1] for label, _path in files}  # "--input NAME"
    values = fill_numbers(args.library, values, set(values) - from_files)
    # the missing-manifest warning stays under -q: the file's integrity is not checked
    with _manifest_warning_as_a_line():
        result = run_library(args.library, values)
    if not args.quiet:
        for k, out in enumerate(result.outputs):
            print(f"output{k}: {out.dtype} {list(out.shape)}")
    if args.output:
        save_outputs(args.output, result.outputs)
        if not args.quiet:
            print(f"outputs written to {npz_path(args.output)}")
    return 0


def _inspect(args) -> int:
    from ..tools.inspect import inspect_onnx
    from ..tools.run import refuse_compiled_library

    if args.pipeline:
        print(_pipeline_text(args))
        return 0
    for flag, given in (("--target", args.target), ("--cuda-arch", args.cuda_arch),
                        ("--cpu/--portable", args.cpu), ("--planner", args.planner),
                        ("--schedule", args.schedule), ("--fusion", args.fusion),
                        ("--config", args.config)):
        if given is not None:
            raise RelaxMemplanError(f"inspect {flag}: only with --pipeline")
    if args.model is None:
        raise RelaxMemplanError("inspect needs an ONNX model (or --pipeline for the pass order)")
    refuse_compiled_library(args.model, "inspect")
    with native_log(_log_mode(args)):  # -q: no TVM log lines; the summary is printed
        summary = inspect_onnx(args.model)
    print(json.dumps(summary.to_dict(), indent=2) if args.json else summary.format_text())
    return 0


def _pipeline_text(args) -> str:
    """``inspect --pipeline``: the pass order compile would run with these options."""
    from ..config import load_config
    from ..compile import parse_dim_spec
    from ..pipeline import PipelinePasses, format_pass_order
    from ..targets import make_target
    from ..transform import PlanDynamicMemory, ReorderForMemory

    if args.model is not None:
        raise RelaxMemplanError(f"inspect --pipeline takes no model (got {args.model}): the "
                                f"pass order depends on the target and options only")
    config = load_config(args.config)
    target = args.target or config.target
    check_target_flags(target, args.cuda_arch, args.cpu)
    dims = dict(config.dims)
    dims.update(parse_repeated(args.dim, parse_dim_spec, "--dim"))
    chosen = {"schedule": args.schedule, "fusion": args.fusion}
    options = dataclasses.replace(config.pipeline_options(args.planner or "relax_memplan"),
                                  dim_ranges=dims,
                                  **{k: v for k, v in chosen.items() if v is not None})
    ours = options.planner == "relax_memplan"
    passes = PipelinePasses(
        reorder=ReorderForMemory() if config.planner.reorder and ours else None,
        dynamic=PlanDynamicMemory(strategy=config.planner.strategy) if dims and ours else None)
    tvm_target = make_target(target, args.cuda_arch or config.cuda_arch, args.cpu or config.cpu)
    return format_pass_order(tvm_target, options, passes)


def _bench(args) -> int:
    from ..frontend import parse_shape_spec
    from ..config import load_config
    from ..tools.bench import bench_onnx
    from ..tools.run import refuse_compiled_library

    if not args.no_onnxruntime:
        try:
            import onnxruntime  # noqa: F401
        except ImportError:
            raise RelaxMemplanError("bench times onnxruntime too: pip install onnxruntime "
                                    "(or give --no-onnxruntime)") from None
    check_distinct_paths([("model", args.model), ("config", args.config)]
                         + input_files(args.input), [("--json", args.json)])
    if args.json:
        check_output_path("--json", args.json)
    refuse_compiled_library(args.model, "bench")
    config = load_config(args.config)
    _check_bench_config(config, args.config)
    _check_config_cpu(args, config)
    shapes = {name: tuple(dims) for name, dims in config.shapes.items()}
    shapes.update(parse_repeated(args.shape, parse_shape_spec, "--shape"))
    plan_pass, reorder_pass = _planner_passes(config.planner)
    schedule = config.schedule if args.schedule is None else args.schedule
    fusion = config.fusion if args.fusion is None else args.fusion
    print(_bench_settings_line(args, config, schedule, fusion))
    progress = _progress(args)
    with native_log(_log_mode(args)):
        result = bench_onnx(args.model, shapes, repeat=args.repeat, warmup=args.warmup,
                            plan_pass=plan_pass, reorder_pass=reorder_pass,
                            onnxruntime=not args.no_onnxruntime, schedule=schedule, fusion=fusion,
                            cpu=args.cpu or config.cpu,
                            fusion_conv_chain=config.fusion_conv_chain,
                            check_indices=config.check_indices, seed=config.verify.seed,
                            input_values=parse_inputs(args.input), progress=progress)
        _finish(progress)
    print(result.format_text())
    if args.json:
        Path(args.json).write_text(json.dumps(result.to_dict(), indent=2) + "\n", encoding="utf-8")
        print(f"times written to {args.json}")
    return 0


def _bench_settings_line(args, config, schedule: bool, fusion: bool) -> str:
    """The settings both TVM builds of bench use and where they came from (the config's
    settings apply to both builds: the line says which)."""
    planner = config.planner
    source = f"config {args.config}" if args.config else "defaults"
    flags = [f for f, given in (("--schedule", args.schedule), ("--fusion", args.fusion))
             if given is not None]
    algorithms = ",".join(planner.algorithms) if planner.algorithms else "default"
    return (f"settings ({source}{', ' + ' '.join(flags) + ' given' if flags else ''}): "
            f"schedule {'on' if schedule else 'off'}, fusion {'on' if fusion else 'off'}, "
            f"fusion_conv_chain {config.fusion_conv_chain if fusion else 'off (no fusion)'}, "
            f"planner algorithms {algorithms}, time limit {planner.time_limit_s:g} s, "
            f"in-place {'on' if planner.inplace else 'off'}, "
            f"reorder {'on' if planner.reorder else 'off'}, "
            f"index checks {'on' if config.check_indices else 'off'}")


def _check_bench_config(config, path) -> None:
    """bench times fixed shapes on this CPU: a config asking for symbolic dims, kernel
    dispatch or another target is refused, naming the key (bench uses a config's planner
    settings; its dims, dispatch and target would otherwise be ignored silently)."""
    where = f"config {path}" if path else "config"
    if config.target != "llvm":
        raise RelaxMemplanError(f"{where}: target {config.target!r} is not supported by bench "
                                f"(it runs the builds on this CPU: target llvm)")
    for key in ("dims", "dispatch"):
        if getattr(config, key):
            raise RelaxMemplanError(f"{where}: key '{key}' is not supported by bench (it times "
                                    f"fixed shapes: give full shapes in 'shapes' or --shape)")


COMMANDS = {"compile": _compile, "run": _run, "inspect": _inspect, "bench": _bench}
"""The function of each command, by name."""
