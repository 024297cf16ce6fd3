"""``relax-memplan``: compile ONNX models with relax_memplan's planner and report memory.

Only argument parsing lives here; the work is :func:`relax_memplan.compiler.compile_onnx`.

Exit status: 0 success, 1 a clear error (printed on one line), 2 bad usage,
3 ``--verify`` found an error above tolerance.
"""

from __future__ import annotations

import argparse
import gc
import os
import sys
from pathlib import Path
from typing import Dict, List, Optional

import numpy as np

from .errors import RelaxMemplanError, ShapeSpecError

__all__ = ["main", "build_parser"]

EXIT_ERROR = 1
EXIT_VERIFY_FAILED = 3


def build_parser() -> argparse.ArgumentParser:
    """The argument parser of ``relax-memplan``."""
    parser = argparse.ArgumentParser(
        prog="relax-memplan",
        description="Memory planning for Apache TVM Relax: compile a model with an arena planner "
        "and compare its memory with the lower bound and TVM's default planner.",
    )
    sub = parser.add_subparsers(dest="command", required=True)
    c = sub.add_parser(
        "compile",
        help="compile an ONNX model and print its memory report",
        description="Import an ONNX model with TVM's frontend, compile it for the target with "
        "relax_memplan's pipeline (and with TVM's default planner for comparison), run both once, "
        "and print the memory report. With no MODEL, the built-in example CNN is used.",
    )
    c.add_argument("model", nargs="?", help="path to an .onnx file (default: built-in example)")
    c.add_argument("--shape", action="append", default=[], metavar="NAME=D0,D1,...",
                   help="full shape of an input, fixing its dynamic dims (repeatable); "
                   "dims not fixed default to 1")
    c.add_argument("--input", action="append", default=[], metavar="NAME=VALUE|FILE.npy",
                   help="use this value for an input instead of random data, e.g. sr=16000")
    c.add_argument("--config", metavar="YAML", help="configuration file (see configs/default.yaml)")
    c.add_argument("--target", choices=("llvm", "cuda"), help="compilation target (default from config: llvm)")
    c.add_argument("--verify", action="store_true",
                   help="compare outputs with onnxruntime on the same random inputs")
    c.add_argument("--no-measure", action="store_true",
                   help="do not run the builds (no run-time bytes)")
    c.add_argument("-o", "--output", metavar="LIB.so", help="write the compiled library")
    c.add_argument("--report", metavar="JSON", help="write the report as JSON")
    c.add_argument("--plot", metavar="PNG", help="draw the arena plan (needs matplotlib)")
    c.add_argument("--dump-ir", metavar="DIR", help="write the IR after each pipeline phase")
    c.add_argument("--time-limit", type=float, metavar="SECONDS",
                   help="offset-search budget per arena (default from config)")
    c.add_argument("-q", "--quiet", action="store_true", help="no progress messages")
    return parser


def _parse_inputs(specs: List[str]) -> Dict[str, np.ndarray]:
    values: Dict[str, np.ndarray] = {}
    for spec in specs:
        name, sep, text = spec.partition("=")
        if not sep or not name or not text:
            raise ShapeSpecError(f"--input '{spec}' is not NAME=VALUE or NAME=FILE.npy")
        if text.endswith(".npy"):
            try:
                values[name] = np.load(text)
            except (OSError, ValueError) as err:
                raise ShapeSpecError(f"--input {name}: cannot read '{text}': {err}") from None
            continue
        try:
            nums = [float(v) if any(ch in v for ch in ".eE") else int(v) for v in text.split(",")]
        except ValueError:
            raise ShapeSpecError(f"--input {name}: '{text}' is not a number list") from None
        values[name] = np.array(nums[0] if len(nums) == 1 else nums)
    return values


def _compile(args) -> int:
    from .compiler import compile_onnx
    from .config import load_config
    from .frontend import parse_shape_spec
    from .transform.plan_static_memory import PlanStaticMemory

    config = load_config(args.config)
    shapes = {name: tuple(dims) for name, dims in config.shapes.items()}
    for spec in args.shape:
        name, dims = parse_shape_spec(spec)
        shapes[name] = dims
    input_values = _parse_inputs(args.input)
    target = args.target or config.target
    planner = config.planner
    plan_pass = PlanStaticMemory(
        alignment_bytes=planner.alignment_bytes,
        algorithms=planner.algorithms,
        time_limit_s=args.time_limit if args.time_limit is not None else planner.time_limit_s,
    )
    progress = None if args.quiet else (lambda msg: print(f"[relax-memplan] {msg}", file=sys.stderr, flush=True))
    result = compile_onnx(
        args.model, shapes, target=target, plan_pass=plan_pass, verify=args.verify,
        measure=not args.no_measure and target == "llvm", input_values=input_values,
        seed=config.verify.seed, rtol=config.verify.rtol, atol=config.verify.atol,
        dump_dir=args.dump_ir, progress=progress,
    )
    print(result.report.format_text())
    if args.report:
        result.report.write_json(args.report)
        print(f"report written to {args.report}")
    if args.output:
        Path(args.output).parent.mkdir(parents=True, exist_ok=True)
        result.executable.export_library(args.output)
        print(f"library written to {args.output}")
    if args.plot:
        from .plot import plot_plan

        plot_plan(plan_pass.plans["main"], args.plot, title=result.report.model)
        print(f"plan drawn to {args.plot}")
    if args.verify and result.report.main.verified is False:
        return EXIT_VERIFY_FAILED
    return 0


def _release_quietly(err: BaseException) -> None:
    """Drop what a failed import/build still references, with C++ stderr muted.

    TVM's C++ BlockBuilder logs "destroyed with remaining blocks" when an importer
    that failed half-way is garbage-collected; that would follow our one-line error.
    """
    err.__cause__ = err.__context__ = err.__traceback__ = None
    sys.stderr.flush()
    saved = os.dup(2)
    try:
        with open(os.devnull, "w") as devnull:
            os.dup2(devnull.fileno(), 2)
            gc.collect()
    finally:
        os.dup2(saved, 2)
        os.close(saved)


def main(argv: Optional[List[str]] = None) -> int:
    """Entry point of ``relax-memplan``; returns the exit status.

    Errors of this package (bad model, unsupported ONNX node, bad shape, bad
    config, TVM build failure) are printed as one line without a traceback.
    """
    args = build_parser().parse_args(argv)
    try:
        return _compile(args)
    except RelaxMemplanError as err:
        message = str(err)
        _release_quietly(err)
        del err
        print(f"relax-memplan: error: {message}", file=sys.stderr)
        return EXIT_ERROR
    except KeyboardInterrupt:
        print("relax-memplan: interrupted", file=sys.stderr)
        return 130


if __name__ == "__main__":
    sys.exit(main())
