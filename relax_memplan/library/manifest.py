"""The manifest beside a compiled library (``model.so.json``) and the checks made with it.

A library is a shared object that ``dlopen`` maps and runs: a flipped byte in its code
crashes the process (SIGILL, SIGSEGV) and one in its embedded weights gives wrong outputs
with exit status 0. So :func:`~relax_memplan.compile.export_library` writes, beside each
library, a JSON manifest with what a loader needs to trust the file:

- ``library``: the file's size in bytes and its SHA-256 (FIPS 180-4), covering the ELF
  headers, the code and the embedded constants alike;
- ``inputs``: each parameter of the entry function in call order, its dtype and its shape,
  where a string names a symbolic dim; ``dims``: each symbolic dim's declared range
  ``[lower, upper, step]`` (``upper`` null when unbounded);
- ``target``: the TVM target the kernels were compiled for; ``relax_memplan_version``,
  ``tvm_version``;
- ``constants_bytes`` and ``workspace_bytes`` when known: the constants embedded in the
  library and the largest kernel workspace (see :mod:`.resident`).

:func:`verify_library` runs before the library is mapped: no manifest is a warning (the
library was exported by other means and still runs); a manifest that does not describe the
file (size, digest), is not valid JSON, or names another TVM version is a one-line
:class:`LibraryIntegrityError`. :func:`check_inputs` compares the values a caller gives with
the manifest's inputs before the call.
"""

from __future__ import annotations

import hashlib
import json
import os
import warnings
from dataclasses import dataclass, field
from typing import Dict, Mapping, Optional, Sequence, Tuple, Union

import numpy as np

from .._version import __version__
from ..errors import ModelLoadError

__all__ = ["FORMAT", "FORMAT_VERSION", "LibraryIntegrityError", "LibraryManifest",
           "ManifestInput", "MANIFEST_SUFFIX", "MissingManifestWarning", "file_sha256", "manifest_path", "read_manifest", "verify_library", "write_manifest"]

FORMAT = "relax_memplan library manifest"
FORMAT_VERSION = 1
MANIFEST_SUFFIX = ".json"
"""The manifest of ``model.so`` is ``model.so.json``."""

_CHUNK_BYTES = 1 << 22


class LibraryIntegrityError(ModelLoadError):
    """A library does not match its manifest (damaged, cut, replaced or another model's), or
    the manifest itself is unreadable; the message names both files and what differs."""


class MissingManifestWarning(UserWarning):
    """A library has no manifest beside it: nothing proves that it is whole; it still runs."""


@dataclass(frozen=True)
class ManifestInput:
    """One parameter of the entry function.

    Attributes
    ----------
    name : str
    dtype : str
        Numpy dtype name (``float32``, ``int64``).
    shape : tuple of int or str
        Extents; a string is a symbolic dim, declared in :attr:`LibraryManifest.dims`.
    """

    name: str
    dtype: str
    shape: Tuple[Union[int, str], ...]

    def describe(self) -> str:
        """``input_ids[batch, 128]:int64``."""
        return f"{self.name}[{', '.join(str(d) for d in self.shape)}]:{self.dtype}"


@dataclass(frozen=True)
class LibraryManifest:
    """What ``model.so.json`` holds (see the module docstring for the JSON layout).

    Attributes
    ----------
    library_size_bytes : int
    library_sha256 : str
        Hex digest of the whole library file.
    target : str, optional
        ``str(tvm.target.Target)`` of the build (``None`` when the writer did not know it).
    relax_memplan_version, tvm_version : str
        The versions that wrote the library.
    function : str
        The entry function (``main``).
    inputs : tuple of ManifestInput
        In call order; empty when the writer did not know them.
    dims : dict of str to (int, int or None, int)
        Declared range ``(lower, upper, step)`` of each symbolic dim, in elements.
    model : str, optional
        The model the library was compiled from (its path as given).
    constants_bytes, workspace_bytes : int, optional
        The distinct constants embedded in the library and the largest kernel workspace
        with the build's thread count, in bytes (:mod:`.resident`).
    """

    library_size_bytes: int
    library_sha256: str
    target: Optional[str] = None
    relax_memplan_version: str = __version__
    tvm_version: str = ""
    function: str = "main"
    inputs: Tuple[ManifestInput, ...] = ()
    dims: Mapping[str, Tuple[int, Optional[int], int]] = field(default_factory=dict)
    model: Optional[str] = None
    constants_bytes: Optional[int] = None
    workspace_bytes: Optional[int] = None

    def to_dict(self) -> Dict:
        """The JSON object written to the manifest file."""
        return {"format": FORMAT, "format_version": FORMAT_VERSION,
                "library": {"size_bytes": self.library_size_bytes,
                            "sha256": self.library_sha256},
                "model": self.model, "function": self.function,
                "inputs": [{"name": i.name, "dtype": i.dtype, "shape": list(i.shape)}
                           for i in self.inputs],
                "dims": {n: list(r) for n, r in self.dims.items()},
                "target": self.target, "relax_memplan_version": self.relax_memplan_version,
                "tvm_version": self.tvm_version, "constants_bytes": self.constants_bytes,
                "workspace_bytes": self.workspace_bytes}

    @classmethod
    def from_dict(cls, data, where: str) -> "LibraryManifest":
        """Parse a manifest's JSON object.

        Raises
        ------
        LibraryIntegrityError
            Not a manifest of this format, or a key missing or of the wrong type (named).
        """
        def need(mapping, key, kind, what=None):
            value = mapping.get(key) if isinstance(mapping, dict) else None
            if not isinstance(value, kind) or isinstance(value, bool) and kind is not bool:
                raise LibraryIntegrityError(f"{where}: not a valid library manifest (key "
                                            f"'{what or key}' missing or of the wrong type)")
            return value

        if not isinstance(data, dict) or data.get("format") != FORMAT:
            raise LibraryIntegrityError(f"{where}: not a relax_memplan library manifest")
        if data.get("format_version") != FORMAT_VERSION:
            raise LibraryIntegrityError(f"{where}: manifest format version "
                                        f"{data.get('format_version')!r}, this relax_memplan "
                                        f"reads version {FORMAT_VERSION}")
        library = need(data, "library", dict)
        inputs = tuple(ManifestInput(need(i, "name", str, "inputs.name"),
                                     need(i, "dtype", str, "inputs.dtype"),
                                     tuple(need(i, "shape", list, "inputs.shape")))
                       for i in need(data, "inputs", list))
        dims = {n: tuple(r) if isinstance(r, list) else r
                for n, r in need(data, "dims", dict).items()}
        if not all(isinstance(r, tuple) and len(r) == 3 and all(isinstance(x, int) or x is None for x in r)
                   for r in dims.values()):
            raise LibraryIntegrityError(f"{where}: not a valid library manifest (key 'dims' "
                                        f"holds something other than [lower, upper, step])")
        _check_fields(data, inputs, where)
        optional = {k: data.get(k) for k in ("model", "constants_bytes", "workspace_bytes")}
        return cls(library_size_bytes=need(library, "size_bytes", int, "library.size_bytes"),
                   library_sha256=need(library, "sha256", str, "library.sha256"),
                   target=data.get("target"), function=need(data, "function", str),
                   relax_memplan_version=need(data, "relax_memplan_version", str),
                   tvm_version=need(data, "tvm_version", str), inputs=inputs, dims=dims,
                   **optional)


def _check_fields(data, inputs, where: str) -> None:
    """What the loader and ``run`` act on, checked before they do: the target is a string (or
    null), the entry function a name, each input a distinct name with a NumPy dtype and
    extents that are integers >= 0 or symbolic (a dim's name or expression).

    Raises
    ------
    LibraryIntegrityError
        Naming the key and what it holds.
    """
    def bad(key, what):
        return LibraryIntegrityError(f"{where}: not a valid library manifest (key '{key}' "
                                     f"{what})")

    target = data.get("target")
    if target is not None and (not isinstance(target, str) or not target.strip()):
        raise bad("target", f"is {target!r}, not a target string or null")
    if not isinstance(data.get("function"), str) or not data["function"].isidentifier():
        raise bad("function", f"is {data['function']!r}, not a function name")
    names = [i.name for i in inputs]
    if len(set(names)) != len(names) or not all(names):
        raise bad("inputs", f"names {names} are not distinct non-empty names")
    for i in inputs:
        try:
            np.dtype(i.dtype)
        except TypeError:
            raise bad("inputs.dtype", f"of {i.name!r} is {i.dtype!r}, not a NumPy dtype") \
                from None
        for d in i.shape:
            if isinstance(d, bool) or not (isinstance(d, int) and d >= 0
                                           or isinstance(d, str) and d.strip()):
                raise bad("inputs.shape", f"of {i.name!r} holds {d!r}: an extent is an "
                          f"integer >= 0 or a symbolic dim's name")


def manifest_path(library) -> str:
    """The manifest of a library: ``model.so`` -> ``model.so.json``."""
    return os.fspath(library) + MANIFEST_SUFFIX


def file_sha256(path) -> str:
    """Hex SHA-256 of a file, read in 4 MiB chunks into one buffer (the file's pages stay in
    the page cache, not in this process's resident memory)."""
    digest = hashlib.sha256()
    buffer = bytearray(_CHUNK_BYTES)
    view = memoryview(buffer)
    with open(path, "rb", buffering=0) as f:
        while True:
            n = f.readinto(buffer)
            if not n:
                return digest.hexdigest()
            digest.update(view[:n])


def _tvm_version() -> str:
    import tvm

    return str(tvm.__version__)


def write_manifest(library, *, target=None, inputs: Sequence[ManifestInput] = (),
                   dims: Optional[Mapping[str, Sequence]] = None, model=None,
                   constants_bytes: Optional[int] = None,
                   workspace_bytes: Optional[int] = None) -> LibraryManifest:
    """Write ``<library>.json`` for a library file just written; returns what it wrote.

    Raises
    ------
    OSError
        The manifest cannot be written (the caller turns it into its own error).
    """
    dims = {n: (int(r[0]), None if r[1] is None else int(r[1]), int(r[2]) if len(r) > 2 else 1)
            for n, r in (dims or {}).items()}
    manifest = LibraryManifest(
        library_size_bytes=os.path.getsize(library), library_sha256=file_sha256(library),
        target=None if target is None else str(target), tvm_version=_tvm_version(), inputs=tuple(inputs), dims=dims,
        model=None if model is None else str(model), constants_bytes=constants_bytes,
        workspace_bytes=workspace_bytes)
    path = manifest_path(library)
    partial = path + ".partial"
    with open(partial, "w", encoding="utf-8") as f:
        json.dump(manifest.to_dict(), f, indent=1)
        f.write("\n")
    os.replace(partial, path)  # never a half-written manifest under the final name
    return manifest


def read_manifest(library) -> Optional[LibraryManifest]:
    """The manifest beside ``library``, or ``None`` when there is none.

    Raises
    ------
    LibraryIntegrityError
        The manifest exists but cannot be read or parsed (the message names it).
    """
    path = manifest_path(library)
    if not os.path.exists(path):
        return None
    try:
        with open(path, encoding="utf-8") as f:
            data = json.load(f)
    except (OSError, UnicodeDecodeError, ValueError) as err:
        raise LibraryIntegrityError(f"{path}: cannot read the library manifest "
                                    f"({type(err).__name__}: {str(err).splitlines()[0]})") from None
    return LibraryManifest.from_dict(data, path)


def _looks_like_a_library(path) -> bool:
    from .elf import library_format

    with open(path, "rb") as f:
        return library_format(f.read(4)) is not None


def verify_library(library) -> Optional[LibraryManifest]:
    """Check a library against its manifest before it is loaded.

    Checks, in order: the file's size, its SHA-256 (a flipped byte anywhere), the TVM
    version (the VM's bytecode and the runtime's ABI are TVM's). Without a manifest a
    :class:`MissingManifestWarning` is issued and ``None`` returned (no warning for a file
    that is no shared library at all: the loader's error says so).

    Parameters
    ----------
    library : str or os.PathLike
        The library file (which must exist).

    Returns
    -------
    LibraryManifest or None

    Raises
    ------
    LibraryIntegrityError
        One line naming the library, its manifest and what differs.
    """
    manifest = read_manifest(library)
    path = manifest_path(library)
    if manifest is None:
        if not _looks_like_a_library(library):  # TVM's loader says what it is not
            return None
        warnings.warn(f"{os.fspath(library)} has no manifest ({os.path.basename(path)}): "
                      f"it is loaded unchecked (compile -o writes one)", MissingManifestWarning,
                      stacklevel=2)
        return None
    size = os.path.getsize(library)
    if size != manifest.library_size_bytes:
        raise LibraryIntegrityError(
            f"{os.fspath(library)} is {size:,} bytes, its manifest {os.path.basename(path)} says "
            f"{manifest.library_size_bytes:,}: the file is cut, damaged or not the library "
            f"the manifest describes; compile it again")
    digest = file_sha256(library)
    if digest != manifest.library_sha256:
        raise LibraryIntegrityError(
            f"{os.fspath(library)} does not match its manifest {os.path.basename(path)} "
            f"(SHA-256 {digest[:12]}..., manifest {manifest.library_sha256[:12]}...): the file "
            f"is damaged or not the library the manifest describes; compile it again")
    here = _tvm_version()
    if manifest.tvm_version != here:
        raise LibraryIntegrityError(
            f"{os.fspath(library)} was built with TVM {manifest.tvm_version}, this is TVM "
            f"{here}: compile it again with this TVM")
    return manifest
