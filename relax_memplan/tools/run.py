"""Run a library written by ``relax-memplan compile -o`` with the Relax VM (``relax-memplan run``)."""

from __future__ import annotations

import os
import shlex
from dataclasses import dataclass
from typing import Dict, List, Mapping, Sequence

import numpy as np

from ..errors import ModelLoadError, RelaxMemplanError
from ..library.elf import library_format

__all__ = ["RunOutputs", "check_library_file", "fill_numbers", "function_params", "npz_path", "refuse_compiled_library", "run_command",
           "run_library", "save_outputs"]


@dataclass
class RunOutputs:
    """What one call of a compiled function returned.

    Attributes
    ----------
    param_names : list of str
        The function's parameters, in the order they were passed.
    outputs : list of numpy.ndarray
        The results, flattened (a tuple result in order).
    """

    param_names: List[str]
    outputs: List[np.ndarray]


_LIBRARY_SUFFIXES = (".so", ".dylib", ".dll")


def refuse_compiled_library(path, command: str) -> None:
    """Refuse a compiled library given where an ONNX model is expected, by its content (the
    check ``run`` makes), before protobuf reads it.

    Without it, ``compile lib.so`` and ``inspect lib.so`` say "Wire format was corrupt".

    Parameters
    ----------
    path : str or os.PathLike or None
        The model path given to ``command``; ``None`` (built-in example) and a path that is
        not a readable file are left to the model loader's own messages.
    command : str
        The subcommand, for the message (``compile``, ``inspect``, ``bench``).

    Raises
    ------
    ModelLoadError
        The file starts like an ELF, Mach-O or PE library.
    """
    if path is None or not os.path.isfile(path):
        return
    try:
        with open(path, "rb") as f:
            kind = library_format(f.read(4))
    except OSError:
        return
    if kind is not None:
        raise ModelLoadError(f"{path} is a compiled library ({kind}), not an ONNX model: "
                             f"{command} reads an .onnx file; use `{run_command(path)}` "
                             f"to run a library")


def run_command(path, input_names: Sequence[str] = ()) -> str:
    """The ``relax-memplan run`` command line for a library, each argument quoted for a POSIX
    shell (``shlex.quote``: a path with spaces or quotes pastes as one argument), with one
    ``--input NAME=NAME.npy`` per input name given (the hint pastes as it is printed).
    """
    words = ["relax-memplan", "run", os.fspath(path)]
    for name in input_names:
        words += ["--input", f"{name}={name}.npy"]
    return " ".join(shlex.quote(w) for w in words)


def _is_onnx_model(path) -> bool:
    """Whether the file parses as an ONNX ``ModelProto`` with a graph (whatever its name)."""
    try:
        import onnx
        from google.protobuf.message import DecodeError
    except ImportError:
        return os.fspath(path).lower().endswith(".onnx")
    try:
        with open(path, "rb") as f:
            model = onnx.ModelProto.FromString(f.read())
    except (DecodeError, ValueError, RuntimeWarning):
        return False
    return model.HasField("graph") and len(model.graph.node) > 0


def _check_content(path) -> None:
    """Decide by the file's content, not its name (an ONNX model renamed .so must not reach
    TVM's loader, nor a library renamed .onnx be called an ONNX model).

    Raises
    ------
    ModelLoadError
        An ONNX model, or a shared library whose name does not end in .so/.dylib/.dll (TVM's
        loader picks its reader by the extension).
    """
    with open(path, "rb") as f:
        head = f.read(4)
    kind = library_format(head)
    name = os.fspath(path)
    if kind is not None:
        if not name.lower().endswith(_LIBRARY_SUFFIXES):
            raise ModelLoadError(f"{path} is a compiled library ({kind}) without a library "
                                 f"extension: tvm.runtime.load_module picks its loader by the "
                                 f"extension; rename it to end in .so")
        return
    if _is_onnx_model(path):
        library = _library_name_for(name)
        command = " ".join(shlex.quote(w) for w in ("relax-memplan", "compile", os.fspath(path),
                                                      "-o", library))
        raise ModelLoadError(f"{path} is an ONNX model, not a compiled library: compile it "
                             f"first with `{command}`")


def _library_name_for(model_path: str) -> str:
    """A library name for ``compile MODEL -o ...`` beside the model that is not the model itself
    (for an ONNX model named x.so, ``-o x.so`` would overwrite it); in the current folder
    when the model's folder cannot be written (a read-only models folder)."""
    stem = os.path.splitext(model_path)[0]
    if not os.access(os.path.dirname(os.path.abspath(model_path)), os.W_OK):
        stem = os.path.splitext(os.path.basename(model_path))[0]
    library = stem + ".so"
    return stem + "_lib.so" if os.path.normpath(library) == os.path.normpath(model_path) else library


def npz_path(path) -> str:
    """The file :func:`save_outputs` writes: ``numpy.savez`` appends ``.npz`` when missing."""
    path = os.fspath(path)
    return path if path.endswith(".npz") else path + ".npz"


def _load(path, inputs=None):
    """The library verified against its manifest (and ``inputs`` against its inputs) and
    loaded with a VM on it (CPU), its weights resident once
    (:func:`relax_memplan.library.load_library`)."""
    from ..library import load_library

    check_library_file(path)
    return load_library(path, inputs=inputs)


def check_library_file(path) -> None:
    """Refuse, before any input is read, what cannot be a compiled library: a missing path, a
    folder, an ONNX model (with the ``compile`` command that makes its library).

    Raises
    ------
    ModelLoadError
        One line naming the path and what it is.
    """
    if os.path.isdir(path):
        raise ModelLoadError(f"{path} is a folder, not a library file: give the .so file that "
                             f"`relax-memplan compile MODEL -o FILE.so` wrote")
    if not os.path.isfile(path):
        raise ModelLoadError(f"{path}: no such library file")
    _check_content(path)


def function_params(vm, func_name: str = "main") -> List[str]:
    """Parameter names of ``func_name`` in a Relax VM, in call order (the ONNX graph order for
    a model compiled by :func:`relax_memplan.compile.compile_model`).

    Raises
    ------
    RelaxMemplanError
        The VM has no function of that name.
    """
    try:
        arity = vm._get_function_arity(func_name)
    except Exception:  # noqa: BLE001 - TVM says "not found" with a backtrace
        raise RelaxMemplanError(f"the library has no function '{func_name}'") from None
    return [vm._get_function_param_name(func_name, i) for i in range(arity)]


def run_library(path, inputs: Mapping[str, np.ndarray], func_name: str = "main") -> RunOutputs:
    """Load a compiled library and call ``func_name`` once on named inputs.

    Parameters
    ----------
    path : str or os.PathLike
        A library written by ``relax-memplan compile -o`` (or ``Executable.export_library``).
    inputs : mapping of str to numpy.ndarray
        One value per parameter of the function, by name.
    func_name : str
        The VM function to call.

    Returns
    -------
    RunOutputs

    Raises
    ------
    ModelLoadError
        The file is missing, is an ONNX model (compile it first), does not match its
        manifest (damaged, cut, another model's: :class:`~relax_memplan.library.manifest.
        LibraryIntegrityError`), was built for CUDA and there is no CUDA GPU here, or is
        otherwise not a Relax VM library.
    ShapeSpecError
        An input is missing or named that the function does not take (the message lists them).
    RunError
        The call failed: an input's shape or dtype differs from the library's (input and
        expected shape named), a dim outside its declared range,
        an index out of range (one line, the input shapes named).
    """
    from ..library.inputs import check_input_names
    from ..runtime import run_checked

    arrays = {n: np.asarray(v) for n, v in inputs.items()}
    loaded = _load(path, arrays if func_name == "main" else None)
    names = function_params(loaded.vm, func_name)
    check_input_names(inputs, names, func_name)
    result = run_checked(loaded.module, [arrays[n] for n in names], f"library {path}", func_name=func_name)
    return RunOutputs(param_names=names, outputs=result.outputs)


def fill_numbers(path, values: Mapping[str, np.ndarray], numbers) -> Dict[str, np.ndarray]:
    """Values for ``run_library`` with each number typed on the command line cast to its
    input's dtype and, for an input of fixed shape, filling that shape (``--input mask=1``).

    Parameters
    ----------
    path : str or os.PathLike
        The library; its manifest (``LIB.so.json``) gives each input's dtype and shape.
    values : mapping of str to numpy.ndarray
        The parsed ``--input`` values.
    numbers : collection of str
        The names whose value was a number (or comma-separated numbers), not a ``.npy`` file.

    Returns
    -------
    dict of str to numpy.ndarray
        ``values`` with those names replaced; unchanged when the library has no manifest and
        no number is given.

    Raises
    ------
    ShapeSpecError
        A number for an input with symbolic dims (its shape is not known: give a ``.npy``
        file), a number that its input's dtype cannot hold, or a number for a library without
        its manifest (its inputs' shapes and dtypes are not known before loading).
    """
    from ..errors import ShapeSpecError
    from ..frontend.reference import cast_value
    from ..library import manifest_path, read_manifest

    manifest = read_manifest(path) if os.path.isfile(path) else None
    if manifest is None and numbers and os.path.isfile(path):
        name = sorted(numbers)[0]
        raise ShapeSpecError(f"--input {name}: a number fills an input from the shape and dtype "
                             f"in the library's manifest, and {manifest_path(path)} is missing: "
                             f"give a .npy file (or compile the library again with -o)")
    specs = {i.name: i for i in manifest.inputs} if manifest is not None else {}
    out = dict(values)
    for name in numbers:
        spec = specs.get(name)
        if spec is None:
            continue
        value = cast_value(name, values[name], spec.dtype)
        if value.ndim == 0 and spec.shape:
            if not all(isinstance(d, int) for d in spec.shape):
                raise ShapeSpecError(f"--input {name}: a number fills an input of fixed shape; "
                                     f"{spec.describe()} has symbolic dims: give a .npy file")
            value = np.full(spec.shape, value)
        out[name] = value
    return out


def save_outputs(path, outputs: List[np.ndarray]) -> Dict[str, np.ndarray]:
    """Write outputs to an ``.npz`` file as ``output0``, ``output1``, ...; returns the dict.

    Raises
    ------
    RelaxMemplanError
        The file cannot be written.
    """
    named = {f"output{i}": out for i, out in enumerate(outputs)}
    try:
        np.savez(os.fspath(path), **named)
    except OSError as err:
        raise RelaxMemplanError(f"cannot write {path}: {err.strerror or err}") from None
    return named
