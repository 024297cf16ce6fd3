"""Argument types and value parsers of ``relax-memplan`` (``--input``, repeated
``NAME=...`` options, output paths checked before any work)."""

from __future__ import annotations

import argparse
import math
import os
import sys
from pathlib import Path
from typing import TYPE_CHECKING, Dict, List, Optional, Sequence, Tuple

from ..errors import RelaxMemplanError, ShapeSpecError
from ..targets import check_cuda_arch, resolve_cpu

if TYPE_CHECKING:
    import numpy as np

__all__ = ["check_environment", "check_target_flags", "positive_seconds", "int_at_least", "check_output_path",
           "check_distinct_paths", "input_files", "parse_inputs", "parse_repeated"]


def positive_seconds(text: str) -> float:
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not a number of seconds") from None
    if not math.isfinite(value) or value <= 0:
        raise argparse.ArgumentTypeError(f"must be a finite number > 0, got {text}")
    return value


def _make_folder(option: str, path: str, folder: Path) -> None:
    """``folder`` and its missing parents created; once created, one line on stderr naming the
    first one (nothing when it existed; nothing printed before an error)."""
    if folder.is_dir():
        return
    top = _missing_top(folder)
    folder.mkdir(parents=True, exist_ok=True)
    print(f"relax-memplan: {option} {path}: created missing folder {top}", file=sys.stderr)


def _missing_top(folder: Path) -> Path:
    """The outermost folder of ``folder``'s chain that does not exist yet (``folder`` itself
    when its parent exists)."""
    while not folder.parent.exists() and folder.parent != folder:
        folder = folder.parent
    return folder


def check_output_path(option: str, path: str, directory: bool = False) -> None:
    """Fail before compiling when an output path cannot be written.

    Missing folders on the way are created, as ``tvm.contrib.utils``/``export_library``
    users expect ``-o out/model.so`` to work, and one line on stderr names the first one
    created (a folder appearing without a word hides a typo in the path).

    Raises
    ------
    RelaxMemplanError
        The path is a directory (a file expected) or a file (a directory expected), a file
        blocks a folder on the way, or the path cannot be written.
    """
    p = Path(path)
    if directory:
        if p.exists() and not p.is_dir():
            raise RelaxMemplanError(f"{option} {path}: exists and is not a directory")
        try:
            _make_folder(option, path, p)
        except OSError as err:
            raise RelaxMemplanError(f"{option} {path}: cannot create directory: {err.strerror}") from None
        return
    if p.is_dir():
        raise RelaxMemplanError(f"{option} {path}: is a directory")
    blocking = next((a for a in reversed(p.parents) if a.exists() and not a.is_dir()), None)
    if blocking is not None:
        raise RelaxMemplanError(f"{option} {path}: {blocking} is a file, not a directory")
    existed = p.exists()
    try:
        _make_folder(option, path, p.parent)
        with open(p, "ab"):
            pass
    except OSError as err:
        raise RelaxMemplanError(f"{option} {path}: cannot write: {err.strerror}") from None
    if not existed:
        p.unlink()


def _same_file(a: str, b: str) -> bool:
    """Whether two paths name one file: ``os.path.samefile`` when both exist (hard links,
    symlinks, ``./x`` vs ``x``), else equality of the resolved absolute paths."""
    try:
        if os.path.exists(a) and os.path.exists(b):
            return os.path.samefile(a, b)
        return Path(a).resolve() == Path(b).resolve()
    except OSError:
        return False


def check_distinct_paths(inputs: Sequence[Tuple[str, Optional[str]]],
                         outputs: Sequence[Tuple[str, Optional[str]]]) -> None:
    """Refuse, before any work, an output path naming an input file or another output.

    Unchecked, ``compile m.onnx --report m.onnx`` and ``compile x.so -o x.so`` replace the
    ONNX model with the report / library and exit 0.

    Parameters
    ----------
    inputs : sequence of (label, path or None)
        Files the command reads (model, library, config, ``--input`` .npy files); ``None``
        entries are skipped.
    outputs : sequence of (option, path or None)
        Files or folders the command writes, as the user named them (``-o``, ``--report``, ...).

    Raises
    ------
    RelaxMemplanError
        One line naming both: an output that is an input, or two outputs that are one file.
    """
    given_inputs = [(label, path) for label, path in inputs if path]
    given_outputs = [(option, path) for option, path in outputs if path]
    for k, (option, path) in enumerate(given_outputs):
        for label, source in given_inputs:
            if _same_file(path, source):
                raise RelaxMemplanError(f"{option} {path} is the {label} {source}: it would be "
                                        f"overwritten; choose another output name")
        for other, other_path in given_outputs[:k]:
            if _same_file(path, other_path):
                raise RelaxMemplanError(f"{option} {path} and {other} {other_path} are the same "
                                        f"file: give each output its own name")


def int_at_least(minimum: int):
    """An argparse type: an integer >= ``minimum``."""

    def parse(text: str) -> int:
        try:
            value = int(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"{text!r} is not an integer") from None
        if value < minimum:
            raise argparse.ArgumentTypeError(f"must be >= {minimum}, got {value}")
        return value

    return parse


def parse_inputs(specs: List[str]) -> Dict[str, np.ndarray]:
    import numpy as np  # when a command runs: the parser alone loads no numpy

    values: Dict[str, np.ndarray] = {}
    for spec in specs:
        name, sep, text = spec.partition("=")
        if not sep or not name or not text:
            raise ShapeSpecError(f"--input '{spec}' is not NAME=VALUE or NAME=FILE.npy")
        if name in values:
            raise ShapeSpecError(f"--input for '{name}' is given twice")
        if text.endswith(".npy"):
            try:
                values[name] = np.load(text)  # allow_pickle stays False: data, never code
            except OSError as err:
                raise ShapeSpecError(f"--input {name}: cannot read '{text}': "
                                     f"{err.strerror or err}") from None
            except ValueError:  # numpy's text here suggests loading pickles: not for data
                raise ShapeSpecError(f"--input {name}: '{text}' is not an array saved with "
                                     f"numpy.save (.npy format)") from None
            continue
        try:
            nums = [float(v) if any(ch in v for ch in ".eE") else int(v) for v in text.split(",")]
        except ValueError:
            raise ShapeSpecError(f"--input {name}: '{text}' is neither a .npy file nor a "
                                 f"number or comma-separated numbers") from None
        try:
            values[name] = np.array(nums[0] if len(nums) == 1 else nums)
        except OverflowError:
            raise ShapeSpecError(f"--input {name}: '{text}' is too large") from None
        if values[name].dtype == object:
            raise ShapeSpecError(f"--input {name}: '{text}' is too large for an integer tensor")
    return values


def input_files(specs: List[str]) -> List[Tuple[str, str]]:
    """(``--input NAME``, path) of each ``--input NAME=FILE.npy`` (read, never written)."""
    files = []
    for spec in specs:
        name, _, text = spec.partition("=")
        if text.endswith(".npy"):
            files.append((f"--input {name}", text))
    return files


def parse_repeated(specs: List[str], parse, option: str) -> Dict:
    """``NAME=...`` options given several times: parsed, a name given twice is an error."""
    out: Dict = {}
    for spec in specs:
        name, value = parse(spec)
        if name in out:
            raise ShapeSpecError(f"{option} for '{name}' is given twice")
        out[name] = value
    return out


LIBRARY_SUFFIXES = (".so", ".dylib", ".dll")
"""Extensions ``tvm.runtime.load_module`` loads a compiled library from."""


def check_target_flags(target: str, cuda_arch: Optional[str], cpu: Optional[str]) -> None:
    """Refuse --cuda-arch off cuda, --cpu/--portable off llvm, a bad arch or an unknown CPU.

    Raises
    ------
    RelaxMemplanError
        One line naming the flag (``TargetError`` for a bad value).
    """
    if cuda_arch is not None:
        if target != "cuda":
            raise RelaxMemplanError(f"--cuda-arch {cuda_arch}: only for --target cuda "
                                    f"(the target is {target})")
        check_cuda_arch(cuda_arch)
    if cpu is not None:
        if target != "llvm":
            raise RelaxMemplanError(f"--cpu {cpu}: only for --target llvm (the target is "
                                    f"{target})" if cpu != "portable" else
                                    f"--portable: only for --target llvm (the target is {target})")
        resolve_cpu(cpu, "--cpu")  # an unknown CPU name refused before the import


def check_environment(args) -> None:
    """Check optional dependencies and output paths before any work."""
    target = args.target
    check_target_flags(target, args.cuda_arch, getattr(args, "cpu", None))
    if args.verify and target == "cuda":
        raise RelaxMemplanError("--verify runs the build on the CPU; use it with --target llvm "
                                "(a cuda build is compiled only)")
    if args.verify:
        try:
            import onnxruntime  # noqa: F401
        except ImportError:
            raise RelaxMemplanError("--verify needs onnxruntime: pip install onnxruntime") from None
    if args.plot:
        try:
            from matplotlib.figure import Figure
        except ImportError:
            raise RelaxMemplanError('--plot needs matplotlib: pip install "relax_memplan[plot]"') from None
        formats = Figure().canvas.get_supported_filetypes()
        if Path(args.plot).suffix.lower().lstrip(".") not in formats:
            raise RelaxMemplanError(f"--plot {args.plot}: the file name must end in one of "
                                    f"{', '.join('.' + f for f in sorted(formats))}")
    if args.output and Path(args.output).suffix.lower() not in LIBRARY_SUFFIXES:
        raise RelaxMemplanError(f"-o {args.output}: a compiled library must end in "
                                f"{' or '.join(LIBRARY_SUFFIXES)} (tvm.runtime.load_module "
                                f"picks its loader by the extension)")
    if args.verify and args.no_measure:
        raise RelaxMemplanError("--verify runs the build; it cannot be combined with --no-measure")
    for option, path in (("-o", args.output), ("--report", args.report), ("--plot", args.plot)):
        if path:
            check_output_path(option, path)
    if args.dump_ir:
        check_output_path("--dump-ir", args.dump_ir, directory=True)


def check_num_threads_env(environ) -> None:
    """Refuse a ``TVM_NUM_THREADS`` that is not a positive integer.

    TVM 0.27 reads ``0``, ``-1`` or ``abc`` as one thread, without a word
    (``TVM_NUM_THREADS=0`` runs single-threaded silently).

    Raises
    ------
    RelaxMemplanError
        Naming the value and what to give instead.
    """
    text = environ.get("TVM_NUM_THREADS")
    if text is None:
        return
    try:
        ok = int(text) >= 1
    except ValueError:
        ok = False
    if not ok:
        raise RelaxMemplanError(f"TVM_NUM_THREADS={text!r}: must be a positive integer (TVM "
                                f"would use 1 thread); unset it to use every core")
