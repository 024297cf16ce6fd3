"""The llvm target of the CPU this process runs on.

TVM 0.27 rejects ``"llvm -mcpu=native"`` (no target strings with options), and
``{"kind": "llvm", "mcpu": "native"}`` is accepted but not resolved: LLVM logs
that ``native`` is invalid and compiles for ``generic`` (x86-64: SSE2, no FMA),
so the CPU matmul schedules fall short of what the machine can do. The host
CPU's name comes from ``tvm.target.codegen.llvm_get_system_cpu()`` (LLVM's
``sys::getHostCPUName``, e.g. ``"znver3"``), which is what
``tvm.target.Target.from_device(tvm.cpu())`` uses too (that one also sets
``mtriple`` to the triple LLVM was built for).
"""

from __future__ import annotations

import tvm
from tvm.target import Target, codegen

__all__ = ["host_target"]


def host_target() -> Target:
    """An llvm target for this machine's CPU: ``{"kind": "llvm", "mcpu": <host cpu>}``.

    Returns
    -------
    tvm.target.Target
        llvm with ``mcpu`` set to LLVM's name for the host CPU when LLVM knows
        one (valid for its default triple); plain ``llvm`` otherwise (no LLVM
        codegen, an unknown or ``generic`` CPU).
    """
    try:
        cpu = str(codegen.llvm_get_system_cpu())
        valid = bool(codegen.llvm_is_valid_cpu(cpu, str(codegen.llvm_get_system_triple())))
    except (AttributeError, tvm.error.TVMError, TypeError, ValueError):
        return Target("llvm")
    if not cpu or cpu == "generic" or not valid:
        return Target("llvm")
    return Target({"kind": "llvm", "mcpu": cpu})
