"""RecordResidentBytes: an analysis-only pass that records the constants a build embeds and
the workspace of each kernel (:mod:`relax_memplan.analysis.resident`).

Two points of ``tvm.compile``: the pass itself runs after the whole Relax pipeline
(``relax_memplan.compile.build`` appends it), when the constants are final (folded,
prepacked); :meth:`RecordResidentBytes.tir_pipeline` wraps TVM's default TIR pipeline for
the target and, after it, reads each kernel's allocations as lowered -- after
``CompactBufferAllocation`` shrank a buffer computed under a loop to its per-iteration
region and ``StorageRewrite`` merged buffers, before ``LowerTVMBuiltin`` turns those larger
than the stack limit into workspace-pool calls. Both return the module unchanged and read
and write no function attributes.
"""

from __future__ import annotations

import contextlib
import itertools
from typing import Iterator, Optional

import tvm
from tvm import tirx

from ..analysis.resident import ResidentBytes, constant_tensors, kernel_workspace

__all__ = ["RecordResidentBytes"]

_NAMES = itertools.count()


@tvm.transform.module_pass(opt_level=0, name="RecordResidentBytes")
class RecordResidentBytes:
    """Record a :class:`~relax_memplan.analysis.resident.ResidentBytes`; the module is unchanged.

    Parameters
    ----------
    threads : int, optional
        Threads to count per-thread workspace for; default TVM's thread pool size
        (``tvm.runtime.num_threads()``, set by ``TVM_NUM_THREADS``).

    Attributes
    ----------
    resident : ResidentBytes
        Constants filled when the pass runs, kernels when the TIR pipeline of
        :meth:`tir_pipeline` has run.
    """

    def __init__(self, threads: Optional[int] = None):
        threads = threads if threads is not None else tvm.runtime.num_threads()
        self.resident = ResidentBytes(threads=int(threads))

    def transform_module(self, mod: tvm.IRModule, _ctx) -> tvm.IRModule:
        self.resident.num_constants, self.resident.constants_bytes = constant_tensors(mod)
        return mod

    def _record_kernels(self, mod: tvm.IRModule) -> tvm.IRModule:
        kernels = [kernel_workspace(gv.name_hint, func) for gv, func in mod.functions_items()
                   if isinstance(func, tirx.PrimFunc)]
        self.resident.kernels = [k for k in kernels if k.shared_bytes or k.per_thread_bytes]
        return mod

    @contextlib.contextmanager
    def tir_pipeline(self, target) -> Iterator[Optional[str]]:
        """The name of a TIR pipeline to give ``tvm.compile(..., tir_pipeline=...)``: TVM's
        default for ``target`` followed by the workspace record, registered while the
        ``with`` block runs. ``None`` for a non-CPU target (its kernels' buffers are device
        memory, not a CPU workspace)."""
        target = tvm.target.Target(target) if not isinstance(target, tvm.target.Target) \
            else target
        if target.kind.name not in ("llvm", "c"):
            yield None
            return
        name = f"relax_memplan_resident_{next(_NAMES)}"
        record = tvm.transform.module_pass(lambda mod, _ctx: self._record_kernels(mod),
                                           opt_level=0, name="RecordKernelWorkspace")

        def factory():
            lower, host, device = tvm.tirx.get_default_tir_pipeline(target)
            return tvm.transform.Sequential([lower, record]), host, device

        pipelines = tvm.tirx.compilation_pipeline.PIPELINE_MAP
        pipelines[name] = factory
        try:
            yield name
        finally:
            pipelines.pop(name, None)
