"""The llvm target of the CPU this process runs on.

TVM 0.27 rejects ``"llvm -mcpu=native"`` (no target strings with options), and
``{"kind": "llvm", "mcpu": "native"}`` is accepted but not resolved: LLVM logs
that ``native`` is invalid and compiles for ``generic`` (x86-64: SSE2, no FMA),
so the CPU matmul schedules fall short of what the machine can do. The host
CPU's name comes from ``tvm.target.codegen.llvm_get_system_cpu()`` (LLVM's
``sys::getHostCPUName``, e.g. ``"znver3"``), which is what
``tvm.target.Target.from_device(tvm.cpu())`` uses too (that one also sets
``mtriple`` to the triple LLVM was built for).

Gathers
-------
With the host CPU's features (AVX2, AVX-512), LLVM's loop vectoriser turns the
scalar loops of kernels no schedule rule took (pooling windows, strided or
``floordiv`` indices) into vector *gathers* (``vgatherqps``), which are slower
than the scalar loop on AMD Zen and on Intel CPUs with the gather (GDS) microcode
mitigation: mnist's 2x2 max-pool ran 2.5 us for the host CPU against 0.9 us for
plain ``llvm`` (SSE2, no gathers). :func:`host_target` therefore adds LLVM's x86
tuning features ``+prefer-no-gather`` and ``+prefer-no-scatter`` (the cost model
then keeps such loops scalar or shuffles instead; contiguous vector code, all our
schedules emit, is unchanged): the same kernel then takes 0.9 us. TVM 0.27 cannot
give one PrimFunc another llvm target than the rest of the build (every llvm
function goes to one LLVM module compiled for the build's target; a PrimFunc's
``target`` attribute does not change its ``target-cpu``), so this per-build
tuning flag is what replaces plain-``llvm`` code generation for such kernels.
"""

from __future__ import annotations

import tvm
from tvm.target import Target, codegen

__all__ = ["host_target", "NO_GATHER_FEATURES"]

NO_GATHER_FEATURES = ("+prefer-no-gather", "+prefer-no-scatter")
"""LLVM x86 tuning features :func:`host_target` adds (cost model only: no instruction set
is removed)."""


def host_target(prefer_no_gather: bool = True) -> Target:
    """An llvm target for this machine's CPU: ``{"kind": "llvm", "mcpu": <host cpu>}``.

    Parameters
    ----------
    prefer_no_gather : bool
        On x86 CPUs, also set ``mattr`` to :data:`NO_GATHER_FEATURES` (see the module
        docstring: LLVM's auto-vectorised gathers make unscheduled kernels slower than
        plain ``llvm``). Ignored on other architectures and where LLVM does not know the
        feature.

    Returns
    -------
    tvm.target.Target
        llvm with ``mcpu`` set to LLVM's name for the host CPU when LLVM knows
        one (valid for its default triple), and on x86 ``mattr`` =
        :data:`NO_GATHER_FEATURES`; plain ``llvm`` otherwise (no LLVM codegen, an
        unknown or ``generic`` CPU).
    """
    try:
        cpu = str(codegen.llvm_get_system_cpu())
        valid = bool(codegen.llvm_is_valid_cpu(cpu, str(codegen.llvm_get_system_triple())))
    except (AttributeError, tvm.error.TVMError, TypeError, ValueError):
        return Target("llvm")
    if not cpu or cpu == "generic" or not valid:
        return Target("llvm")
    target = Target({"kind": "llvm", "mcpu": cpu})
    if prefer_no_gather and _is_x86():
        tuned = Target({"kind": "llvm", "mcpu": cpu, "mattr": list(NO_GATHER_FEATURES)})
        if _has_feature(tuned, "prefer-no-gather"):
            return tuned
    return target


def _is_x86() -> bool:
    return str(codegen.llvm_get_system_triple()).startswith(("x86_64", "i386", "i686"))


def _has_feature(target: Target, name: str) -> bool:
    """Whether LLVM knows feature ``name`` and ``target`` enables it."""
    try:
        return bool(codegen.llvm_cpu_has_features(name, target))
    except (AttributeError, tvm.error.TVMError, TypeError, ValueError):
        return False
