"""Compilation targets: the CUDA architecture a ``cuda`` build is compiled for.

TVM 0.27 rejects target strings with options (``"cuda -arch=sm_90"``) and a plain ``"cuda"``
target guesses ``sm_50`` when it finds no CUDA toolkit, with a warning. The arch is chosen
here instead, in this order: the one given (``--cuda-arch``, config ``cuda_arch``), the
installed GPU's (``tvm.cuda(0).compute_version``), else :data:`DEFAULT_CUDA_ARCH`.

The arch check needs no TVM (the config loader uses it); TVM is imported only to look for a
GPU and to make the target.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Optional

from .errors import TargetError

__all__ = ["DEFAULT_CUDA_ARCH", "CudaArch", "check_cuda_arch", "cuda_source", "installed_cuda_arch",
           "resolve_cuda_arch", "make_target"]

DEFAULT_CUDA_ARCH = "sm_80"
"""Arch of a ``cuda`` build on a machine without a GPU when none is given (Ampere: runs on
A100 and later GPUs; give ``--cuda-arch`` for another)."""

_CUDA_ARCH = re.compile(r"^sm_[1-9][0-9]{1,2}[a-z]?$")
"""``sm_80``, ``sm_90a``, ``sm_100``: what nvcc's ``-arch`` and TVM's ``arch`` accept."""


def check_cuda_arch(arch, option: str = "--cuda-arch") -> str:
    """``arch`` if it names a CUDA architecture (``sm_`` and the compute capability, e.g.
    ``sm_80``, ``sm_90a``).

    Raises
    ------
    TargetError
        ``arch`` is not such a name (the message names ``option`` and the value).
    """
    if not isinstance(arch, str) or not _CUDA_ARCH.match(arch):
        raise TargetError(f"{option} {arch!r} is not a CUDA architecture: expected sm_ and the "
                          f"compute capability, e.g. sm_80 (A100) or sm_90 (H100)")
    return arch


def installed_cuda_arch() -> Optional[str]:
    """The arch of CUDA device 0 (``"sm_90"`` for compute capability 9.0), or None when
    this machine has no CUDA GPU (or TVM sees none)."""
    import tvm

    device = tvm.cuda(0)
    if not device.exist:
        return None
    return "sm_" + str(device.compute_version).replace(".", "")


@dataclass(frozen=True)
class CudaArch:
    """The arch of a ``cuda`` build and where it came from.

    Attributes
    ----------
    arch : str
        ``sm_XX``.
    source : str
        ``"given"``, ``"installed GPU"`` or ``"default"`` (no GPU here, none given).
    """

    arch: str
    source: str

    def describe(self) -> str:
        """``sm_80 (the default: no CUDA GPU here; set --cuda-arch)`` and the like."""
        if self.source == "given":
            return self.arch
        if self.source == "installed GPU":
            return f"{self.arch} (the installed GPU's)"
        return f"{self.arch} (the default: no CUDA GPU here; set --cuda-arch)"


def resolve_cuda_arch(arch: Optional[str] = None) -> CudaArch:
    """The arch given (checked), else the installed GPU's, else :data:`DEFAULT_CUDA_ARCH`.

    Raises
    ------
    TargetError
        A given ``arch`` that is not ``sm_XX``.
    """
    if arch is not None:
        return CudaArch(check_cuda_arch(arch), "given")
    installed = installed_cuda_arch()
    if installed is not None:
        return CudaArch(installed, "installed GPU")
    return CudaArch(DEFAULT_CUDA_ARCH, "default")


def make_target(kind: str, cuda_arch: Optional[str] = None):
    """A ``tvm.target.Target`` of ``kind``; for ``cuda`` with the arch of
    :func:`resolve_cuda_arch` (``{"kind": "cuda", "arch": "sm_90"}``).

    Raises
    ------
    TargetError
        A bad ``cuda_arch``.
    """
    import tvm

    if kind != "cuda":
        return tvm.target.Target(kind)
    return tvm.target.Target({"kind": "cuda", "arch": resolve_cuda_arch(cuda_arch).arch})


def cuda_source(executable) -> str:
    """CUDA C source of every ``cuda`` device module a built executable imports, joined.

    Parameters
    ----------
    executable : tvm.relax.VMExecutable
        What ``tvm.compile(..., target=<cuda>)`` returned (no GPU needed).

    Returns
    -------
    str
        The generated ``__global__`` kernels (empty when the executable has no cuda module).
    """
    stack, sources = [executable.mod], []
    while stack:
        module = stack.pop()
        if module.kind == "cuda":
            sources.append(module.inspect_source())
        stack.extend(module.imports)
    return "\n".join(sources)
