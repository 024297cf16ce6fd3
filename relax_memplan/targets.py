"""Compilation targets: the CPU an ``llvm`` build is compiled for, and the CUDA architecture
of a ``cuda`` build.

CPU
---
An ``llvm`` build is compiled for this machine's CPU by default (``cpu="host"``:
:func:`~relax_memplan.schedules.host_target`, e.g. ``mcpu=znver3`` with AVX2/AVX-512), which is
what our CPU schedules are written for: plain ``llvm`` is x86-64's baseline (SSE2, no FMA) and
runs the same kernels 2-5x slower. A library shipped to other machines is built for a named
CPU (``cpu="skylake-avx512"``: any CPU name LLVM knows, checked here) or for any CPU of the
architecture (``cpu="portable"``: plain ``llvm``).

CUDA
----

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

__all__ = ["DEFAULT_CUDA_ARCH", "CPU_CHOICES", "CpuTarget", "check_cpu", "resolve_cpu",
           "CudaArch", "check_cuda_arch", "cuda_source", "installed_cuda_arch",
           "resolve_cuda_arch", "make_target"]

DEFAULT_CUDA_ARCH = "sm_80"
"""Arch of a ``cuda`` build on a machine without a GPU when none is given (Ampere: runs on
A100 and later GPUs; give ``--cuda-arch`` for another)."""

CPU_CHOICES = ("host", "portable")
"""Values of ``cpu`` besides an LLVM CPU name: this machine's CPU (the default), or any CPU
of the architecture (plain ``llvm``)."""

_CPU_NAME = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_.+-]{0,63}$")

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


def check_cpu(cpu, option: str = "cpu") -> str:
    """``cpu`` if it is ``host``, ``portable`` or spelled like an LLVM CPU name (the name itself
    is checked against LLVM by :func:`resolve_cpu`, which needs TVM).

    Raises
    ------
    TargetError
        ``cpu`` is not a string of letters, digits and ``-_.+`` (the message names ``option``).
    """
    if not isinstance(cpu, str) or not _CPU_NAME.match(cpu):
        raise TargetError(f"{option} {cpu!r} is not a CPU: give host (this machine's CPU, the "
                          f"default), portable (any CPU of this architecture) or an LLVM CPU "
                          f"name such as skylake-avx512 or znver3")
    return cpu


@dataclass(frozen=True)
class CpuTarget:
    """The CPU of an ``llvm`` build and where it came from.

    Attributes
    ----------
    mcpu : str
        LLVM's CPU name the code is generated for (``generic``: the architecture's baseline).
    source : str
        ``"host"`` (this machine's CPU), ``"given"`` (a named CPU) or ``"portable"``.
    """

    mcpu: str
    source: str

    def describe(self) -> str:
        """``rocketlake (this machine's CPU; for other machines --cpu NAME or --portable)``
        and the like: the report's target line."""
        if self.source == "host":
            return f"{self.mcpu} (this machine's CPU; for other machines --cpu NAME or --portable)"
        if self.source == "portable":
            return "portable (any CPU of this architecture: baseline vector instructions only)"
        return f"{self.mcpu} (given)"

    def target(self):
        """The ``tvm.target.Target`` (llvm) for this CPU."""
        import tvm

        if self.source == "host":
            from .schedules.host import host_target

            return host_target()
        if self.source == "portable":
            return tvm.target.Target("llvm")
        return tvm.target.Target({"kind": "llvm", "mcpu": self.mcpu})


def resolve_cpu(cpu: str = "host", option: str = "cpu") -> CpuTarget:
    """The CPU an ``llvm`` build is compiled for: ``host`` (default), ``portable`` or an LLVM
    CPU name, checked against the LLVM TVM was built with.

    Parameters
    ----------
    cpu : str
        The name.
    option : str
        Where it was given, for the error (``cpu``: ``BuildOptions.cpu``; the CLI passes
        ``--cpu`` or the config file's ``cpu`` key).

    Raises
    ------
    TargetError
        ``cpu`` is not ``host``/``portable`` and LLVM does not know it for this machine's
        architecture.
    """
    check_cpu(cpu, option)
    if cpu == "portable":
        return CpuTarget("generic", "portable")
    from tvm.target import codegen

    if cpu == "host":
        from .schedules.host import host_target

        mcpu = host_target().attrs.get("mcpu")
        return CpuTarget(str(mcpu), "host") if mcpu else CpuTarget("generic", "portable")
    triple = str(codegen.llvm_get_system_triple())
    if not codegen.llvm_is_valid_cpu(cpu, triple):
        raise TargetError(f"{option} {cpu!r}: LLVM does not know this CPU for {triple}; give an "
                          f"LLVM CPU name (llc -mcpu=help lists them), host or portable")
    return CpuTarget(cpu, "given")


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


def make_target(kind: str, cuda_arch: Optional[str] = None, cpu: str = "host"):
    """A ``tvm.target.Target`` of ``kind``: for ``llvm`` the CPU of :func:`resolve_cpu`
    (``{"kind": "llvm", "mcpu": "znver3", ...}``), for ``cuda`` the arch of
    :func:`resolve_cuda_arch` (``{"kind": "cuda", "arch": "sm_90"}``).

    Raises
    ------
    TargetError
        A bad ``cuda_arch`` or ``cpu``.
    """
    import tvm

    if kind == "llvm":
        return resolve_cpu(cpu).target()
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
