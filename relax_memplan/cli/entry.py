"""``relax-memplan``: compile ONNX models with relax_memplan's planner and report memory.

:func:`main` parses the command line (:mod:`.parser`) and runs one of the commands of
:mod:`.commands`: ``compile`` (:func:`relax_memplan.compile.compile_strategies`), ``run``
(:func:`relax_memplan.tools.run.run_library`), ``inspect``
(:func:`relax_memplan.tools.inspect.inspect_onnx`) and ``bench``
(:func:`relax_memplan.tools.bench.bench_onnx`). Only argument parsing and printing live in
this package.

Exit status: 0 success, 1 a clear error (printed on one line), 2 bad usage
(argparse's message and usage), 3 ``--verify`` found an error above tolerance or a
NaN/Inf not matched by the reference (at any sampled shape with ``--dim``),
130 interrupted (Ctrl-C), 141 the reader of the output went away.
"""

from __future__ import annotations

import gc
import os
import sys
from typing import List, Optional

from ..errors import RelaxMemplanError
from .args import check_num_threads_env
from .commands import COMMANDS, EXIT_VERIFY_FAILED
from .interrupt import EXIT_INTERRUPTED, INTERRUPTED_LINE, OutputGuard, exit_on_interrupt
from .parser import build_parser

__all__ = ["main", "EXIT_ERROR", "EXIT_VERIFY_FAILED", "EXIT_INTERRUPTED", "EXIT_BROKEN_PIPE"]

EXIT_ERROR = 1
EXIT_BROKEN_PIPE = 141


def _release_quietly(err: BaseException) -> None:
    """Drop what a failed import/build still references, with C++ stderr muted.

    TVM's C++ BlockBuilder logs "destroyed with remaining blocks" when an importer
    that failed half-way is garbage-collected; that would follow our one-line error.
    """
    sys.stderr.flush()
    saved = os.dup(2)
    try:
        with open(os.devnull, "w") as devnull:
            os.dup2(devnull.fileno(), 2)
            # muted first: dropping the traceback frees what only it held, right away
            err.__cause__ = err.__context__ = err.__traceback__ = None
            gc.collect()
    finally:
        os.dup2(saved, 2)
        os.close(saved)


def _output_files(args) -> List[str]:
    """The files the command may write, guarded so that a Ctrl-C leaves none half-written:
    compile's library (one per strategy with several), report and plot; run's outputs;
    bench's times."""
    if args.command == "compile":
        from ..compile import STRATEGIES, library_path_for
        from ..library.manifest import manifest_path

        libraries = ([args.output] + [library_path_for(args.output, s, True) for s in STRATEGIES]
                     if args.output else [])
        return libraries + [manifest_path(p) for p in libraries] + [args.report, args.plot]
    if args.command == "run":
        from ..tools.run import npz_path

        return [npz_path(args.output)] if args.output else []
    return [getattr(args, "json", None)] if args.command == "bench" else []


def main(argv: Optional[List[str]] = None) -> int:
    """Entry point of ``relax-memplan``; returns the exit status.

    Errors of this package (bad model, unsupported ONNX node, bad shape, bad
    config, TVM build failure, a run-time failure, onnxruntime refusing the
    inputs) are printed as one line without a traceback. Ctrl-C prints
    ``relax-memplan: interrupted`` and returns 130, also when TVM turned the
    KeyboardInterrupt into another error or it came while handling one; while TVM's C++
    code runs (the build), the process ends within about half a second with status 130
    (:func:`~relax_memplan.cli.interrupt.exit_on_interrupt`). Either way the output
    files the command had created or begun to overwrite are removed. Output piped
    into a reader that stops early (``| head``) ends quietly with 141 (128 + SIGPIPE).
    """
    args = build_parser().parse_args(argv)
    try:  # imports TVM: a Ctrl-C this early is the same one line, not a traceback
        from ..runtime import recording_interrupts
    except KeyboardInterrupt:
        print(INTERRUPTED_LINE, file=sys.stderr)
        return EXIT_INTERRUPTED

    guard = OutputGuard([])
    with recording_interrupts() as interrupted:
        try:
            try:
                guard = OutputGuard(_output_files(args))
                if args.command != "inspect":  # compile, run, bench run TVM's thread pool
                    check_num_threads_env(os.environ)
                with exit_on_interrupt(guard):  # also while TVM's C++ code runs
                    status = COMMANDS[args.command](args)
                if interrupted:  # a Ctrl-C that a fallback inside TVM's build swallowed
                    raise KeyboardInterrupt
                sys.stdout.flush()  # a closed pipe shows here, not at interpreter exit
                return status
            except RelaxMemplanError as err:
                if interrupted:
                    raise KeyboardInterrupt from None
                message = str(err)
                _release_quietly(err)
                del err
                print(f"relax-memplan: error: {message}", file=sys.stderr)
                return EXIT_ERROR
            except Exception:
                if interrupted:  # a Ctrl-C that TVM's FFI turned into another error
                    raise KeyboardInterrupt from None
                raise
        except KeyboardInterrupt as err:
            _release_quietly(err)  # the interrupted importer's BlockBuilder, muted
            del err
            guard.remove_partial()
            print(INTERRUPTED_LINE, file=sys.stderr)
            return EXIT_INTERRUPTED
        except BrokenPipeError:
            # the reader of our stdout is gone: no traceback, and none at exit either
            try:
                os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
            except (OSError, ValueError):  # a stdout with no file descriptor (captured)
                pass
            return EXIT_BROKEN_PIPE
