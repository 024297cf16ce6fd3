"""The ``relax-memplan`` argument parser: subcommands ``compile``, ``run``, ``inspect`` and
``bench`` with their flags and help texts (:mod:`relax_memplan.cli` runs them)."""

from __future__ import annotations

import argparse

from .args import int_at_least, positive_seconds
from ..targets import DEFAULT_CUDA_ARCH

__all__ = ["build_parser"]


class _Once(argparse.Action):
    """A file option that may be given once: argparse keeps the last of two silently, so
    ``-o a.so -o b.so`` would write one of the two files the user named."""

    def __call__(self, parser, namespace, values, option_string=None):
        seen = getattr(namespace, "_given_once", set())
        if self.dest in seen:
            parser.error(f"{option_string} is given twice ({getattr(namespace, self.dest)} and "
                         f"{values}): give it once")
        namespace._given_once = seen | {self.dest}
        setattr(namespace, self.dest, values)


def _add_lower_bound_flags(c) -> None:
    """--inplace/--no-inplace and --reorder/--no-reorder (override the config's planner keys),
    and --explain-fusion."""
    c.add_argument("--explain-fusion", action="store_true", help="after the report, list "
                   "each refused fusion candidate: reason, Relax bindings, ONNX nodes")
    _on_off(c, "inplace",
            help="a kernel writes its output over an input that dies there when its TIR "
            "reads that input at the output's indices only (static and exact dynamic "
            "plans; default from config planner.inplace: on)")
    _on_off(c, "reorder",
            help="ReorderForMemory: per dataflow block, the binding order of least peak "
            "live bytes, kept only where it lowers the peak (default from config "
            "planner.reorder: on)")


def _add_target_flags(parser) -> None:
    """--target, --cuda-arch, --cpu and --portable."""
    parser.add_argument("--target", choices=("llvm", "cuda"),
                        help="compilation target (default from config: llvm)")
    parser.add_argument("--cuda-arch", metavar="sm_XX",
                        help="CUDA arch of a --target cuda build, e.g. sm_90 (default from "
                        f"config, else the installed GPU's, else {DEFAULT_CUDA_ARCH}); cuda "
                        "builds are compiled and reported, not run")
    _add_cpu_flags(parser)


def _add_cpu_flags(parser) -> None:
    """--cpu NAME and --portable (mutually exclusive), both setting ``cpu``."""
    group = parser.add_mutually_exclusive_group()
    group.add_argument("--cpu", metavar="NAME",
                       help="CPU an llvm build is compiled for: host (this machine's CPU) or an "
                       "LLVM CPU name such as skylake-avx512, znver3, neoverse-v1 for a library "
                       "shipped to other machines (default from config: host)")
    group.add_argument("--portable", dest="cpu", action="store_const", const="portable",
                       help="compile for any CPU of this architecture (plain llvm: baseline "
                       "vector instructions only, 2-5x slower kernels than --cpu host)")


def build_parser() -> argparse.ArgumentParser:
    """The argument parser of ``relax-memplan``."""
    parser = argparse.ArgumentParser(
        prog="relax-memplan",
        description="Memory planning for Apache TVM Relax: compile a model with an arena planner "
        "and compare its memory with the lower bound and TVM's default planner.",
    )
    from .._version import __version__

    parser.add_argument("--version", action="version", version=f"relax-memplan {__version__}")
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
                   "without --dim every symbolic dim needs one (with --dim: the dims it leaves free "
                   "stay symbolic)")
    c.add_argument("--input", action="append", default=[], metavar="NAME=VALUE|FILE.npy",
                   help="use this value for an input instead of random data, e.g. sr=16000")
    c.add_argument("--config", action=_Once, metavar="YAML",
                   help="configuration file (see configs/default.yaml)")
    _add_target_flags(c)
    c.add_argument("--verify", action="store_true",
                   help="compare outputs with onnxruntime on the same random inputs")
    c.add_argument("--no-measure", action="store_true",
                   help="do not run the builds (no run-time bytes)")
    c.add_argument("--no-compare", action="store_true",
                   help="do not build TVM's default plan (StaticPlanBlockMemory) for comparison "
                   "(its build takes 2-3x ours, also with --no-measure); the report then has "
                   "no TVM column")
    c.add_argument("-o", "--output", action=_Once, metavar="LIB.so", help="write the compiled library")
    c.add_argument("--report", action=_Once, metavar="JSON", help="write the report as JSON")
    c.add_argument("--plot", action=_Once, metavar="PNG", help="draw the arena plan (needs matplotlib)")
    c.add_argument("--dump-ir", action=_Once, metavar="DIR", help="write the IR after each pipeline phase")
    c.add_argument("--time-limit", type=positive_seconds, metavar="SECONDS",
                   help="offset-search budget per arena (default from config)")
    c.add_argument("--dim", action="append", default=[], metavar="NAME=LO..HI[:STEP]",
                   help="keep this dim symbolic with a declared range (repeatable; HI may be "
                   "omitted; :STEP allows only LO, LO+STEP, ...): compile once, plan with "
                   "--strategy, measure at sampled shapes")
    c.add_argument("--strategy", choices=("exact", "upper_bound", "buckets", "all"),
                   help="dynamic plan with --dim: exact symbolic arena, one arena at the upper "
                   "bounds, buckets (exact + plans at --bucket values), or all of them side by "
                   "side (default from config: exact)")
    c.add_argument("--bucket", action="append", default=[], metavar="NAME=V1,V2,...",
                   help="bucket values of a dim for --strategy buckets (repeatable)")
    c.add_argument("--size-classes", action="store_true",
                   help="with --dim: round arenas and outputs up to geometric size classes, so "
                   "TVM's pooled allocator keeps few distinct sizes (bounded pool)")
    c.add_argument("--dispatch", action="append", default=[], metavar="NAME=V1,V2,...",
                   help="with --dim: specialize kernels using this dim at these values (plus "
                   "the generic kernel), chosen at run time (repeatable)")
    _on_off(c, "schedule",
            help="relax_memplan's CPU schedules (llvm): matmuls, convolutions, reductions "
            "and the other kernels its rules match (default from config: on; --no-schedule: "
            "TVM's unscheduled kernels, for comparisons)")
    _on_off(c, "fusion",
            help="our graph-level fusion before TVM's FuseOps: attention as one kernel "
            "(llvm and cuda), dropout removed; in both builds, like --schedule (default "
            "from config: on)")
    _add_lower_bound_flags(c)
    c.add_argument("--no-index-checks", action="store_true",
                   help="do not check index values (Gather ids, ...) at run time; an index "
                   "out of range then reads or writes outside its tensor")
    c.add_argument("--sample-shapes", type=int_at_least(2), default=None, metavar="N",
                   help="with --dim: shapes to run at (>= 2), the range ends first (default 3)")
    c.add_argument("--no-prepare", action="store_true",
                   help="import with TVM's ONNX frontend as it is, without our preparation "
                   "steps (relax_memplan.frontend.prepare)")
    _add_verbosity(c)
    _add_tool_parsers(sub)
    return parser


def _add_tool_parsers(sub) -> None:
    """The ``run``, ``inspect`` and ``bench`` subcommands."""
    r = sub.add_parser("run", help="run a library written by compile -o",
                       formatter_class=argparse.RawDescriptionHelpFormatter,
                       description="Load a library written by 'relax-memplan compile -o' and run it "
                       "once with the Relax VM\non the given inputs; print the output shapes. "
                       "The library is first checked against\nits manifest (LIB.so.json: "
                       "checksum, inputs, dim ranges, target): a damaged or\nmismatched "
                       "file is refused before it is loaded.",
                       epilog="examples:\n"
                       "  relax-memplan run model.so --input image=image.npy --output out.npz\n"
                       "  relax-memplan run bert.so --input input_ids=ids.npy "
                       "--input attention_mask=1")
    r.add_argument("library", metavar="LIB.so")
    r.add_argument("--input", action="append", default=[], metavar="NAME=FILE.npy|VALUE",
                   help="value of an input (repeatable; every input is needed): a .npy file, "
                   "or a number, which fills an input of fixed shape (mask=1)")
    r.add_argument("-o", "--output", action=_Once, metavar="OUT.npz",
                   help="write the outputs (output0, output1, ...)")
    r.add_argument("-q", "--quiet", action="store_true",
                   help="print errors and warnings only (no output shapes)")
    i = sub.add_parser("inspect", help="inputs, symbolic dims and unsupported ops of a model",
                       description="Summarize an ONNX model before compiling it: inputs (dtype, "
                       "dims with symbolic names), opsets, op counts, ops TVM cannot import, and "
                       "--dim flags for its symbolic dims (placeholder ranges).")
    i.add_argument("model", nargs="?", help="path to an .onnx file")
    i.add_argument("--json", action="store_true", help="print the summary as JSON")
    i.add_argument("--pipeline", action="store_true",
                   help="print the passes of the pipeline compile would run, in order, for the "
                   "target and options given here (no model needed)")
    _add_target_flags(i)
    i.add_argument("--planner", choices=("relax_memplan", "tvm"),
                   help="with --pipeline: whose memory planner (default relax_memplan)")
    _on_off(i, "schedule", help="with --pipeline: our CPU schedules (default from config: on)")
    _on_off(i, "fusion", help="with --pipeline: our fusion passes (default from config: on)")
    i.add_argument("--dim", action="append", default=[], metavar="NAME=LO..HI[:STEP]",
                   help="with --pipeline: a symbolic dim with a declared range (repeatable), as "
                   "compile --dim: the passes of a build with symbolic dims")
    i.add_argument("--config", action=_Once, metavar="YAML",
                   help="with --pipeline: configuration file")
    _add_verbosity(i)
    b = sub.add_parser("bench", help="latency: ours vs TVM's default build vs onnxruntime",
                       description="Build the model with relax_memplan's planner and with TVM's "
                       "default planner (same kernels), and time them and onnxruntime (same "
                       "thread count) in interleaved rounds; print min/median/max per call.")
    b.add_argument("model", nargs="?", help="path to an .onnx file (default: built-in example)")
    b.add_argument("--shape", action="append", default=[], metavar="NAME=D0,D1,...",
                   help="full shape of an input (repeatable); every symbolic dim needs one")
    b.add_argument("--input", action="append", default=[], metavar="NAME=VALUE|FILE.npy",
                   help="use this value for an input instead of random data")
    b.add_argument("--repeat", type=int_at_least(1), default=20, metavar="N",
                   help="timed calls per build (default 20)")
    b.add_argument("--warmup", type=int_at_least(0), default=3, metavar="K",
                   help="untimed calls per build first (default 3)")
    b.add_argument("--no-onnxruntime", action="store_true", help="time the two TVM builds only")
    _on_off(b, "schedule",
            help="both TVM builds with our CPU schedules (default from config: on; "
            "--no-schedule: TVM's unscheduled kernels)")
    _add_cpu_flags(b)
    _on_off(b, "fusion",
            help="our graph-level fusion in both TVM builds (default from config: on)")
    b.add_argument("--config", action=_Once, metavar="YAML",
                   help="configuration file (see configs/default.yaml): planner settings, "
                   "schedule, fusion, check_indices")
    b.add_argument("--json", action=_Once, metavar="JSON", help="also write the times as JSON")
    _add_verbosity(b)


def _on_off(parser, name: str, help: str) -> None:
    """``--NAME`` / ``--no-NAME``, mutually exclusive (``--fusion --no-fusion`` is refused,
    not decided by the last one), both setting ``NAME`` (None when neither is given)."""
    group = parser.add_mutually_exclusive_group()
    dest = name.replace("-", "_")
    group.add_argument(f"--{name}", dest=dest, action="store_const", const=True, default=None,
                       help=help)
    group.add_argument(f"--no-{name}", dest=dest, action="store_const", const=False,
                       help=f"turn --{name} off")


def _add_verbosity(p) -> None:
    group = p.add_mutually_exclusive_group()
    group.add_argument("-q", "--quiet", action="store_true",
                       help="no progress messages and no TVM log lines")
    group.add_argument("-v", "--verbose", action="store_true",
                       help="show TVM's log lines as they come (default: each distinct "
                       "line once, with its count, after the phase)")
