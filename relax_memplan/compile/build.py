"""Build a Relax module with our pipeline (or TVM's planner alone) and export the library.

A failed build becomes one :class:`~relax_memplan.errors.CompileError` line that says whether
TVM's own planner fails too (retried with the same kernel options).
"""

from __future__ import annotations

import contextlib
import importlib.util
import os
import shutil
from typing import Optional

import tvm

from ..errors import CompileError, RelaxMemplanError, summarize_error
from ..pipeline import get_pipeline
from ..transform.check_index_bounds import CheckIndexBounds
from ..transform.record_resident_bytes import RecordResidentBytes
from ..transform.record_storage import RecordStorage

__all__ = ["build", "choose_cuda_compiler", "export_library"]


_KERNEL_OPTIONS = ("dim_ranges", "dispatch", "dispatch_pass", "schedule", "check_indices", "fusion")
"""``get_pipeline`` options that change the kernels, not the memory plan: kept by the retry
with TVM's planner that decides whose fault a failed build is."""


def build(mod, target, planner: str, plan_pass, record: Optional[RecordStorage], dump_dir=None,
          resident_pass: Optional[RecordResidentBytes] = None, **pipeline_kwargs):
    """``tvm.compile`` with our pipeline; a failure becomes a one-line :class:`CompileError`
    that says whether TVM's own planner fails too. ``resident_pass`` runs after the
    pipeline (the build's constants and kernel workspaces).

    To say so, a failed build with our planner is retried with TVM's planner and the same
    kernel options (``dim_ranges``, ``dispatch``/``dispatch_pass``, ``schedule``, ``fusion``),
    without our
    planning passes (``plan_pass``, ``dynamic_pass``): a failure caused by a kernel option then
    fails the retry too and is not blamed on our planner."""
    index_pass = CheckIndexBounds(runtime_checks=pipeline_kwargs.get("check_indices", True)
                                  and tvm.target.Target(target).kind.name != "cuda")
    pipeline = get_pipeline(target, planner=planner, plan_pass=plan_pass, record_pass=record,
                            dump_dir=dump_dir, index_pass=index_pass, **pipeline_kwargs)
    recording = contextlib.nullcontext("default")
    if resident_pass is not None:
        pipeline = tvm.transform.Sequential([pipeline, resident_pass])
        recording = resident_pass.tir_pipeline(target)
    try:
        with recording as tir_pipeline:
            return tvm.compile(mod, target, relax_pipeline=pipeline,
                               tir_pipeline=tir_pipeline or "default")
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


def export_library(executable: tvm.runtime.Executable, path, **manifest) -> None:
    """Write ``executable`` as a shared library that ``tvm.runtime.load_module`` loads, and
    its manifest ``<path>.json`` beside it (:mod:`relax_memplan.library.manifest`: the
    library's size and SHA-256, which ``relax-memplan run`` checks before loading).

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
    **manifest
        What the manifest says besides the checksum: ``target``, ``inputs``
        (:class:`~relax_memplan.library.manifest.ManifestInput`), ``dims``, ``model``,
        ``constants_bytes``, ``workspace_bytes`` (:func:`~relax_memplan.library.manifest.
        write_manifest`).

    Raises
    ------
    RelaxMemplanError
        The library or its manifest cannot be written (one line: the path and the reason).
    """
    from ..library.manifest import write_manifest
    from ..runtime import raise_if_interrupted

    raise_if_interrupted()  # never write a library from a build a Ctrl-C cut short
    try:
        os.makedirs(os.path.dirname(os.fspath(path)) or ".", exist_ok=True)
        executable.export_library(os.fspath(path))
        write_manifest(path, **manifest)
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
    if kernel_options.get("fusion"):
        shown.append("fusion=True")
    return f" with {', '.join(shown)}" if shown else ""


def choose_cuda_compiler() -> Optional[str]:
    """Make TVM's CUDA compile callback usable on this GPU host, before a CUDA build.

    On a host with a GPU, ``tvm.compile`` for ``cuda`` compiles the kernels' CUDA C with
    ``tvm_callback_cuda_compile``: NVRTC through the ``cuda-bindings`` package by default, or
    nvcc with ``TVM_CUDA_COMPILE_MODE=nvcc``. Without a GPU nothing is compiled (the build
    keeps the CUDA source) and this function is not needed.

    Returns
    -------
    str or None
        A note when it set ``TVM_CUDA_COMPILE_MODE=nvcc`` (cuda-bindings missing, nvcc on the
        PATH); ``None`` when nothing needed changing (a mode already set, or cuda-bindings
        installed).

    Raises
    ------
    RelaxMemplanError
        Neither cuda-bindings nor nvcc is available.
    """
    if os.environ.get("TVM_CUDA_COMPILE_MODE"):
        return None
    if importlib.util.find_spec("cuda") is not None and importlib.util.find_spec("cuda.bindings"):
        return None
    if shutil.which("nvcc"):
        os.environ["TVM_CUDA_COMPILE_MODE"] = "nvcc"
        return "cuda-bindings not installed: compiling kernels with nvcc (TVM_CUDA_COMPILE_MODE=nvcc)"
    raise RelaxMemplanError("cannot compile CUDA kernels: neither cuda-bindings (pip install "
                            "cuda-bindings, for NVRTC) nor nvcc on the PATH")
