"""Peak live bytes a Relax function will have once TVM has fused and lowered it.

A graph-level fusion pass decides before ``LegalizeOps``, but the peak live bytes that our
planner works against (the lower bound in every report) are those of the lowered function, after
TVM's FuseOps/FuseTIR have merged elementwise chains: on the graph level an unfused GELU chain
looks like many live intermediates that FuseOps will remove, and hides the steps a fusion can
make worse. So this lowers a copy of the module the way our pipeline does up to memory
planning -- the target's ``legalize`` passes (LegalizeOps, AnnotateTIROpPattern, FoldConstant,
FuseOps, FuseTIR; no GPU schedule, which does not change tensors) and ``dataflow_lower`` passes
(RewriteDataflowReshape, ToNonDataflow, RemovePurityChecking, CallTIRRewrite) -- and computes,
with :func:`~relax_memplan.analysis.liveness.analyze_liveness`, the peak over steps of the bytes
of the live tensors our planners place (the unaligned lower bound,
:func:`~relax_memplan.planner.peak_live_bytes`): constant sizes, and symbolic sizes evaluated at
the function's ``tir_var_upper_bound`` (a symbolic tensor whose dims have no declared upper
bound is left out: its size is unknown here).
"""

from __future__ import annotations

import importlib
from typing import List

import tvm
from tvm import relax

from ..planner import Buffer, peak_live_bytes
from .dims import evaluate_bytes
from .liveness import SYMBOLIC_SHAPE, analyze_liveness

__all__ = ["lowered_peak_live_bytes", "lowered_live_bytes_by_step", "planned_lower_bound_bytes"]

_BACKENDS = {"llvm": "tvm.relax.backend.cpu_generic.pipeline",
             "c": "tvm.relax.backend.cpu_generic.pipeline",
             "cuda": "tvm.relax.backend.cuda.pipeline"}


def _backend(target):
    """(target, its Relax backend pipeline module)."""
    target = tvm.target.Target("llvm") if target is None else tvm.target.Target(target)
    kind = target.kind.name
    if kind not in _BACKENDS:
        raise ValueError(f"target kind '{kind}' is not supported; use one of {sorted(_BACKENDS)}")
    return target, importlib.import_module(_BACKENDS[kind])


def planned_lower_bound_bytes(mod: tvm.IRModule, func_name: str, alignment_bytes: int,
                              target=None) -> int:
    """The lower bound ``PlanStaticMemory`` reports for ``func_name`` without in-place reuse,
    computed on ``mod`` in its own binding order.

    For the report's "lower bound in the importer's order" when ``ReorderForMemory`` ran:
    give it the module that pass received (:attr:`ReorderForMemory.input_module`).

    Parameters
    ----------
    mod : tvm.IRModule
        A module after ``FuseTIR`` and before ``CallTIRRewrite``.
    func_name : str
    alignment_bytes : int
        Each tensor's size is rounded up to it, as in the planner.
    target : tvm.target.Target, optional
        Selects the backend's ``dataflow_lower`` passes (default ``llvm``).

    Returns
    -------
    int
        Sum over (device, storage scope) of the peak live bytes of the plannable tensors
        (constant sizes, aligned): the same tensors and rule as
        :attr:`relax_memplan.transform.plan_static_memory.ArenaPlan.lower_bound_bytes`.

    Raises
    ------
    ValueError
        If the target kind has no Relax backend here.
    """
    target, backend = _backend(target)
    with target:
        lowered = tvm.transform.Sequential(list(backend.dataflow_lower_passes(target)))(mod)
    groups = {}
    for t in analyze_liveness(lowered, func_name).plannable:
        size = -(-max(t.size_bytes, 1) // alignment_bytes) * alignment_bytes
        groups.setdefault((t.device_index, t.storage_scope), []).append(
            Buffer(id=t.uid, start=t.start, end=t.end, size_bytes=size))
    return sum(peak_live_bytes(b) for b in groups.values())


def lowered_peak_live_bytes(mod: tvm.IRModule, func_name: str, target=None) -> int:
    """Peak live bytes (bytes) of ``func_name`` in ``mod`` after TVM's fusion and lowering.

    Parameters
    ----------
    mod : tvm.IRModule
        A module before ``LegalizeOps`` (our fusion passes' input or output).
    func_name : str
        The Relax function to measure.
    target : tvm.target.Target, optional
        Selects the backend's passes (default ``llvm``).

    Returns
    -------
    int
        The maximum over program steps of the summed sizes of the live plannable tensors.

    Raises
    ------
    ValueError
        If the target kind has no Relax backend here.
    """
    return peak_live_bytes(_lowered_buffers(mod, func_name, target))


def lowered_live_bytes_by_step(mod: tvm.IRModule, func_name: str, target=None) -> List[int]:
    """Live bytes (bytes) of ``func_name`` at each program step after TVM's fusion and
    lowering (the tensors :func:`lowered_peak_live_bytes` counts; its result is the maximum of
    this list, or 0 for an empty list). Same parameters and errors."""
    buffers = _lowered_buffers(mod, func_name, target)
    steps = max((b.end for b in buffers), default=0)
    delta = [0] * (steps + 1)  # a sweep over the range ends: O(steps + buffers)
    for b in buffers:
        delta[b.start] += b.size_bytes
        delta[b.end] -= b.size_bytes
    live, total = [], 0
    for d in delta[:steps]:
        total += d
        live.append(total)
    return live


def _lowered_buffers(mod: tvm.IRModule, func_name: str, target) -> List[Buffer]:
    target, backend = _backend(target)
    passes = [p for p in backend.legalize_passes(target)
              if p.info.name in ("LegalizeOps", "AnnotateTIROpPattern", "FoldConstant",
                                 "FuseOps", "FuseTIR")]
    passes += list(backend.dataflow_lower_passes(target))
    one = tvm.IRModule({gv: f for gv, f in mod.functions_items()
                        if gv.name_hint == func_name or not isinstance(f, relax.Function)},
                       attrs=mod.attrs)
    with target:
        lowered = tvm.transform.Sequential(passes)(one)
    liveness = analyze_liveness(lowered, func_name)
    attrs = lowered[func_name].attrs
    upper = {str(k): int(v) for k, v in attrs["tir_var_upper_bound"].items()} \
        if attrs is not None and "tir_var_upper_bound" in attrs else {}
    buffers = []
    for t in liveness.tensors:
        size = t.size_bytes if t.plannable else None
        if t.reason == SYMBOLIC_SHAPE and upper:
            try:
                size = evaluate_bytes(t.size_expr, upper)
            except ValueError:  # a dim without a declared bound
                size = None
        if size is not None:
            buffers.append(Buffer(id=t.uid, start=t.start, end=t.end, size_bytes=max(size, 1)))
    return buffers
