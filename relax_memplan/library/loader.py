"""Load a compiled library with its weights resident once.

What TVM 0.27 does with the constants of a library written by ``export_library``: the Relax
VM executable, constants included, is serialized into one byte array,
``__tvm_ffi__library_bin``, in the library's read-only data (``.rodata``). ``load_module``
``dlopen``\\ s the file, which maps that array from the file, then reads it
(``ProcessLibraryBin`` in tvm-ffi's ``library_module.cc``): a copy of the executable's bytes
into a ``std::string``, another into ``ffi::Bytes``, and from those each constant into a newly
allocated ``Tensor`` (``VMExecutable::LoadConstantSection``). The two copies are freed after
loading; the mapped pages the read touched stay in the process's resident set as file-backed
pages (``RssFile``), beside the tensors (``RssAnon``): BERT-base, 418 MiB of weights, holds
835 MiB more after loading than before.

:func:`release_embedded_constants` hands those pages back with ``madvise(MADV_DONTNEED)`` on
the array's whole pages. The mapping is private and never written (``.rodata``), so a later
read would fault the page in again from the file with the same bytes; nothing reads it again
after loading. The pages stay in the kernel's page cache, shared and reclaimable, not in the
process. The peak while loading is unchanged (the array, the two copies and the tensors).

A library loaded with plain ``tvm.runtime.load_module`` still runs as before and keeps the
mapped pages; calling :func:`release_embedded_constants` on its path afterwards drops them.
"""

from __future__ import annotations

import ctypes
import mmap
import os
import sys
from dataclasses import dataclass
from typing import Mapping, Optional

from ..errors import ModelLoadError, summarize_error
from .inputs import check_inputs
from .manifest import LibraryManifest, manifest_path, verify_library

__all__ = ["EMBEDDED_SYMBOL", "LoadedLibrary", "load_library", "release_embedded_constants"]

EMBEDDED_SYMBOL = "__tvm_ffi__library_bin"
"""tvm-ffi's symbol of the serialized modules: a little-endian ``u64`` byte count, then the
bytes (``tvm::ffi::symbol::tvm_ffi_library_bin``)."""

_MADV_DONTNEED = 4  # <sys/mman.h> on Linux


@dataclass
class LoadedLibrary:
    """A library loaded for calls.

    Attributes
    ----------
    path : str
    module : tvm.runtime.Module
        What ``tvm.runtime.load_module`` returned.
    vm : tvm.runtime.vm.VirtualMachine
    manifest : LibraryManifest or None
        The verified manifest; ``None`` when the library has none (a warning was issued).
    released_bytes : int
        File-backed bytes of the embedded executable handed back after loading.
    """

    path: str
    module: object
    vm: object
    manifest: Optional[LibraryManifest]
    released_bytes: int


def release_embedded_constants(path) -> int:
    """Drop the resident file pages of a loaded library's serialized executable.

    Call it after ``tvm.runtime.load_module(path)``: the constants then live only in the
    tensors the loader made. Linux only (elsewhere nothing is done).

    Parameters
    ----------
    path : str or os.PathLike
        The library file, already loaded in this process.

    Returns
    -------
    int
        Bytes handed back (whole pages inside the array); 0 when the library is not loaded
        here, has no embedded executable, or the platform has no ``madvise``.
    """
    if not sys.platform.startswith("linux"):
        return 0
    try:  # the handle TVM's dlopen made: same file, so the same loaded object
        handle = ctypes.CDLL(os.path.abspath(os.fspath(path)),
                             mode=os.RTLD_NOLOAD | os.RTLD_LAZY)
        head = ctypes.c_uint64.in_dll(handle, EMBEDDED_SYMBOL)
    except (OSError, ValueError):
        return 0
    start = ctypes.addressof(head)
    end = start + ctypes.sizeof(head) + head.value
    if head.value > os.path.getsize(path):  # not the layout this module knows
        return 0
    page = mmap.PAGESIZE
    first, last = -(-start // page) * page, end // page * page
    if last <= first:
        return 0
    libc = ctypes.CDLL(None, use_errno=True)
    libc.madvise.argtypes = [ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int]
    libc.madvise.restype = ctypes.c_int
    return last - first if libc.madvise(first, last - first, _MADV_DONTNEED) == 0 else 0


def _loader_message(path: str, err: Exception) -> Optional[str]:
    """Our one line for TVM's loader error (a CUDA library without a GPU, ...), or None.
    With TVM's runtime alone :mod:`relax_memplan.runtime` cannot be imported (it needs
    ``tvm.relax``): TVM's own message is kept."""
    import tvm

    if tvm.base._RUNTIME_ONLY:
        return None
    from ..runtime.vm_errors import describe_loader_error

    return describe_loader_error(path, str(err), tvm.cuda(0).exist)


def load_library(path, device=None, *, memory_cfg: Optional[str] = None,
                 verify: bool = True, inputs: Optional[Mapping[str, object]] = None
                 ) -> LoadedLibrary:
    """Verify a library against its manifest, load it, release the embedded constants' file
    pages and make a Relax VM on it.

    Parameters
    ----------
    path : str or os.PathLike
        A library written by ``relax-memplan compile -o`` (or
        :func:`relax_memplan.compile.export_library`).
    device : tvm.runtime.Device, optional
        Default ``tvm.cpu()``.
    memory_cfg : {"naive", "pooled"}, optional
        The VM's allocator (default: TVM's, pooled).
    verify : bool
        Check the manifest first (:func:`~.manifest.verify_library`).
    inputs : mapping of str to array, optional
        Values of a call to come, checked against the manifest's inputs before the VM is
        made (:func:`~.manifest.check_inputs`).

    Returns
    -------
    LoadedLibrary

    Raises
    ------
    ModelLoadError
        No such file; the file does not match its manifest (:class:`~.manifest.
        LibraryIntegrityError`); an ELF file cut short; a CUDA library without a GPU; any
        other file TVM cannot load as a Relax VM library (one line).
    ShapeSpecError
        ``inputs`` do not fit the manifest's (names, dtypes, shapes, dim ranges).
    """
    import tvm
    from tvm.runtime.vm import VirtualMachine

    from .elf import check_elf_complete

    path = os.fspath(path)
    if os.path.isdir(path):
        raise ModelLoadError(f"{path} is a folder, not a library file")
    if not os.path.isfile(path):
        raise ModelLoadError(f"{path}: no such library file")
    if verify and os.path.exists(manifest_path(path)):
        manifest = verify_library(path)  # the whole file: size, digest, TVM version
        check_elf_complete(path)
    else:
        check_elf_complete(path)  # a cut file: that one line, not a warning as well
        manifest = verify_library(path) if verify else None
    device = device if device is not None else tvm.cpu()
    try:
        module = tvm.runtime.load_module(path)
    except Exception as err:  # noqa: BLE001 - TVM raises many types; one clear message
        message = _loader_message(path, err)
        raise ModelLoadError(message or f"{path}: cannot load as a Relax VM library: "
                                        f"{summarize_error(err)}") from None
    released = release_embedded_constants(path)
    if manifest is not None and inputs is not None:  # after loading: a CUDA library without
        check_inputs(manifest, inputs)                # a GPU says so first
    kwargs = {} if memory_cfg is None else {"memory_cfg": memory_cfg}
    vm = VirtualMachine(module, device, **kwargs)
    return LoadedLibrary(path=path, module=module, vm=vm, manifest=manifest,
                         released_bytes=released)
