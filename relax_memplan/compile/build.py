"""Build a Relax module with our pipeline (or TVM's planner alone) and export the library.

A failed build becomes one :class:`~relax_memplan.errors.CompileError` line that says whether
TVM's own planner fails too (retried with the same kernel options).

LLVM 22's SLP vectorizer (the one in TVM 0.27's wheels) can emit invalid code for a small,
fully unrolled kernel with strided loads on CPUs whose gathers are slow (``znver3``,
``haswell``, ``znver4`` with ``+prefer-no-gather``): a 1x1 stride-2 convolution over a 6 x 5
map fails LLVM's module verifier ("Instruction does not dominate all uses"), whatever the
kernel's schedule. Such a build is linked again from the same lowered module with the SLP
vectorizer off (:data:`SLP_OFF`), and the report says so.
"""

from __future__ import annotations

import contextlib
import dataclasses
import importlib.util
import os
import shutil
from typing import Optional

import tvm

from ..errors import CompileError, RelaxMemplanError, summarize_error
from ..pipeline import PipelineOptions, PipelinePasses, build_pipeline
from ..transform.check_index_bounds import CheckIndexBounds
from ..transform.record_resident_bytes import RecordResidentBytes
from ..transform.record_storage import RecordStorage
from ..transform.refuse_self_defining_casts import refuse_self_defining_casts

__all__ = ["SLP_OFF", "build", "choose_cuda_compiler", "compile_module", "export_library",
           "without_slp"]

#: The LLVM option of the second link of a build that LLVM's verifier refused.
SLP_OFF = "-vectorize-slp=false"
_LLVM_VERIFIER = "LLVM module verification failed"


def without_slp(target: tvm.target.Target) -> tvm.target.Target:
    """``target`` with LLVM's SLP vectorizer turned off (``cl-opt`` :data:`SLP_OFF`)."""
    config = dict(target.export())
    config["cl-opt"] = [*config.get("cl-opt", []), SLP_OFF]
    return tvm.target.Target(config)


def compile_module(mod, target, relax_pipeline, tir_pipeline="default",
                   notes: Optional[list] = None, lowered: Optional[list] = None):
    """``tvm.compile(mod, target, relax_pipeline=..., tir_pipeline=...)``, linked again with
    LLVM's SLP vectorizer off where LLVM's module verifier refuses the code it made.

    Parameters
    ----------
    mod : tvm.IRModule
        A Relax module.
    target : tvm.target.Target
    relax_pipeline : tvm.transform.Pass
    tir_pipeline : str or tvm.transform.Pass
    notes : list of str, optional
        Gets one line when the second link was needed (for the report).
    lowered : list, optional
        Gets the module as the Relax pipeline left it (before code generation), for a report
        that reads the build's kernels and plan instead of running the pipeline again.

    Returns
    -------
    tvm.runtime.Executable

    Raises
    ------
    Exception
        What ``tvm.compile`` raises, where the second link fails too or is not tried (a
        failure other than LLVM's verifier, or a target other than ``llvm``).
    """
    target = tvm.target.Target(target) if not isinstance(target, tvm.target.Target) else target
    lowered = [] if lowered is None else lowered

    def keep(m, _ctx):
        lowered[:] = [m]
        return m

    pipeline = tvm.transform.Sequential(
        [relax_pipeline, tvm.transform.module_pass(keep, opt_level=0, name="KeepLowered")])
    try:
        return tvm.compile(mod, target, relax_pipeline=pipeline, tir_pipeline=tir_pipeline)
    except Exception as err:  # noqa: BLE001 - only LLVM's verifier failure is retried
        if _LLVM_VERIFIER not in str(err) or target.kind.name != "llvm" or not lowered:
            raise
    # the Relax pipeline has run: only the kernels are generated and linked again
    executable = tvm.compile(lowered[0], without_slp(target), relax_pipeline=None,
                             tir_pipeline=tir_pipeline)
    if notes is not None:
        notes.append("LLVM's verifier refused the code its SLP vectorizer made for a kernel "
                     "(an LLVM bug on this CPU); the kernels were generated again with the "
                     "SLP vectorizer off, so straight-line code is not vectorised")
    return executable


def build(mod, target, options: PipelineOptions, passes: PipelinePasses,
          resident_pass: Optional[RecordResidentBytes] = None, notes: Optional[list] = None,
          lowered: Optional[list] = None):
    """``tvm.compile`` with our pipeline for ``options``; a failure becomes a one-line
    :class:`CompileError` that says whether TVM's own planner fails too.

    Parameters
    ----------
    mod : tvm.IRModule
        The imported model.
    target : tvm.target.Target
        What to build for.
    options : PipelineOptions
        What the pipeline runs (``planner="tvm"``: TVM's planning on the same kernels).
    passes : PipelinePasses
        Configured passes to use; their records are read after the build. The index check is
        made here (run-time checks on CPU targets only) and set in ``passes.index``.
    resident_pass : RecordResidentBytes, optional
        Runs after the pipeline: the build's constants and kernel workspaces.
    notes : list of str, optional
        Gets a line when the kernels had to be generated again (:func:`compile_module`).
    lowered : list, optional
        Gets the module after the Relax pipeline (:func:`compile_module`).

    Raises
    ------
    CompileError
        The build fails. A failed build with our planner is retried with TVM's planner and
        the same kernel options (dim ranges, dispatch, schedule, fusion) without our planning
        passes: a failure caused by a kernel option then fails the retry too and is not
        blamed on our planner.
    RelaxMemplanError
        A declared dim range the model cannot serve (an index would leave its tensor).
    """
    refuse_self_defining_casts(mod)  # before the build: the retry below would meet it again
    passes.index = CheckIndexBounds(runtime_checks=options.check_indices
                                    and tvm.target.Target(target).kind.name != "cuda")
    pipeline, _ = build_pipeline(target, options, passes)
    recording = contextlib.nullcontext("default")
    if resident_pass is not None:
        pipeline = tvm.transform.Sequential([pipeline, resident_pass])
        recording = resident_pass.tir_pipeline(target)
    try:
        with recording as tir_pipeline:
            return compile_module(mod, target, pipeline, tir_pipeline or "default", notes,
                                  lowered)
    except Exception as err:  # TVM raises many types; re-raised as one clear error
        if passes.index.refused is not None:  # the model cannot serve a declared dim range
            raise passes.index.refused from None
        if options.planner == "tvm":
            raise CompileError.from_tvm(options.planner, err) from err
        # Whose fault? Build again with TVM's planner alone (same kernels) to say so.
        kernels = dataclasses.replace(options, planner="tvm", dump_dir=None)
        try:
            compile_module(mod, target, build_pipeline(
                target, kernels, PipelinePasses(dispatch=passes.dispatch))[0])
        except Exception:  # noqa: BLE001 - any failure means TVM itself cannot build it
            raise CompileError(
                f"TVM cannot build this model{_with_options(kernels, passes)} (it fails with "
                f"TVM's own memory planner too): {summarize_error(err)}") from err
        raise CompileError(
            f"the build with relax_memplan's planner failed although TVM's own planner builds "
            f"it (please report this): {summarize_error(err)}") from err


def export_library(executable: tvm.runtime.Executable, path, **manifest) -> None:
    """Write ``executable`` as a shared library that ``tvm.runtime.load_module`` loads, and
    its manifest ``<path>.json`` beside it (:mod:`relax_memplan.library.manifest`: the
    library's size and SHA-256, which ``relax-memplan run`` checks before loading).

    The executable is packed by :func:`relax_memplan.library.pack.pack_imports` on Linux
    (the weights included with the assembler's ``.incbin``, not through an LLVM constant:
    about 1 GB less peak memory on GPT-2), else as TVM packs it.

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
    from ..library.pack import pack_imports_hook
    from ..runtime import raise_if_interrupted

    raise_if_interrupted()  # never write a library from a build a Ctrl-C cut short
    try:
        os.makedirs(os.path.dirname(os.fspath(path)) or ".", exist_ok=True)
        hook = pack_imports_hook(manifest.get("target"))
        executable.export_library(os.fspath(path), **({"fpack_imports": hook} if hook else {}))
        write_manifest(path, **manifest)
    except (OSError, RuntimeError) as err:
        raise RelaxMemplanError(f"cannot write the library {os.fspath(path)}: "
                                f"{summarize_error(err)}") from None


def _with_options(options: PipelineOptions, passes: PipelinePasses) -> str:
    """`` with dispatch={...}, schedule=True`` for the kernel options in use, else ``""``."""
    shown = []
    if passes.dispatch is not None:
        shown.append(f"dispatch={dict(passes.dispatch.buckets)}")
    elif options.dispatch:
        shown.append(f"dispatch={dict(options.dispatch)}")
    if options.schedule:
        shown.append("schedule=True")
    if options.fusion:
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
