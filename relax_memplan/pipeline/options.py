"""What a relax_memplan pipeline runs (:class:`PipelineOptions`) and what its passes recorded
(:class:`PipelinePasses`)."""

from __future__ import annotations

from dataclasses import dataclass, field, fields
from typing import List, Mapping, Optional, Sequence, Tuple

import tvm

from ..transform.check_index_bounds import CheckIndexBounds
from ..transform.hoist_loop_storage import HoistLoopStorage
from ..transform.plan_dynamic_memory import PlanDynamicMemory
from ..transform.plan_static_memory import PlanStaticMemory
from ..transform.record_storage import RecordStorage
from ..transform.reorder_for_memory import ReorderForMemory
from ..transform.specialize_kernels import SpecializeKernels

__all__ = ["PLANNERS", "CONV_CHAIN_MODES", "PipelineOptions", "PipelinePasses"]

PLANNERS = ("relax_memplan", "tvm")

#: ``conv_chain``: ``auto`` fuses conv chains where measured not slower (into depthwise strided
#: convs, and into dense ones whose pair gets the register-blocked kernel; without our CPU
#: schedules into any, TVM's legalized conv being an unscheduled loop nest), ``memory`` into any
#: strided conv (lowest peak; the generic kernel's dense consumers measured 1.2x slower than our
#: scheduled convs), ``off`` never. Values: the ``FuseConvChain(consumers=...)`` with and
#: without ``schedule``.
CONV_CHAIN_MODES = {"auto": ("blocked", "all"), "memory": ("all", "all"), "off": (None, None)}


@dataclass(frozen=True)
class PipelineOptions:
    """What the pipeline runs. The YAML config (:meth:`relax_memplan.config.Config.
    pipeline_options`), the CLI and the Python API all make one of these.

    Attributes
    ----------
    planner : {"relax_memplan", "tvm"}
        Whose memory planner runs: ours (then TVM's ``StaticPlanBlockMemory`` plans what ours
        left), or TVM's alone, the baseline of every comparison.
    schedule : bool
        Our CPU schedules (llvm): matmul, convolution, GEMV, reductions, fallback, with
        ``FastBoundedMath`` and ``ConvTransposeAsMatmul`` before ``LegalizeOps``. On by
        default; ``False`` gives TVM's unscheduled kernels.
    fusion : bool
        Our graph-level fusion before ``LegalizeOps`` (:func:`~relax_memplan.pipeline.
        fusion_passes`); TVM's FuseOps/FuseTIR then fuse what is left.
    fusion_conv_chain : {"auto", "memory", "off"}
        Which conv chains ``FuseConvChain`` fuses (:data:`CONV_CHAIN_MODES`).
    check_indices : bool
        Check index values at run time where they are not proved in range (CPU targets).
    dim_ranges : mapping of str to (int, int or None[, int])
        Declared ranges of symbolic dims (elements, inclusive; optional step).
    dispatch : mapping of str to tuple of int
        Kernel specialization buckets (``{"seq": (64, 128)}``).
    dump_dir : str or path-like, optional
        Write the IR after each phase as ``<dump_dir>/<k>_<phase>.py``.

    Raises
    ------
    ValueError
        An unknown planner or conv chain mode.
    """

    planner: str = "relax_memplan"
    schedule: bool = True
    fusion: bool = True
    fusion_conv_chain: str = "auto"
    check_indices: bool = True
    dim_ranges: Mapping[str, Tuple] = field(default_factory=dict)
    dispatch: Mapping[str, Tuple[int, ...]] = field(default_factory=dict)
    dump_dir: Optional[object] = None

    def __post_init__(self):
        if self.planner not in PLANNERS:
            raise ValueError(f"unknown planner '{self.planner}'; use one of {PLANNERS}")
        if self.fusion_conv_chain not in CONV_CHAIN_MODES:
            raise ValueError(f"conv_chain must be one of {list(CONV_CHAIN_MODES)}, "
                             f"got {self.fusion_conv_chain!r}")
        object.__setattr__(self, "dim_ranges", dict(self.dim_ranges or {}))
        object.__setattr__(self, "dispatch",
                           {k: tuple(v) for k, v in (self.dispatch or {}).items()})

    @classmethod
    def names(cls) -> Tuple[str, ...]:
        """The field names (the keyword arguments ``get_pipeline`` takes as options)."""
        return tuple(f.name for f in fields(cls))


@dataclass
class PipelinePasses:
    """The instances of our passes in one pipeline, which record what they did: read them after
    the build (the report does).

    Attributes
    ----------
    plan : PlanStaticMemory, optional
        Our static planner (``plans``); None with TVM's planner.
    dynamic : PlanDynamicMemory, optional
        Our planner for symbolic sizes; None: symbolic tensors are left to TVM.
    record : RecordStorage, optional
        Records each function's storage after ``StaticPlanBlockMemory``.
    index : CheckIndexBounds, optional
        Index-value checks (``refused``, ``checked``, ``proved``).
    fusion : list of tvm.transform.Pass, optional
        Our fusion passes (:func:`~relax_memplan.pipeline.fusion_counts` reads them).
    dispatch : SpecializeKernels, optional
        Kernel specialization (``specialized``).
    reorder : ReorderForMemory, optional
        Memory-aware binding order (``blocks``); our planner only.
    hoist : HoistLoopStorage, optional
        Loop-body storage allocated once per call (``hoisted``/``skipped``); our planner only.
    """

    plan: Optional[PlanStaticMemory] = None
    dynamic: Optional[PlanDynamicMemory] = None
    record: Optional[RecordStorage] = None
    index: Optional[CheckIndexBounds] = None
    fusion: Optional[List[tvm.transform.Pass]] = None
    dispatch: Optional[SpecializeKernels] = None
    reorder: Optional[ReorderForMemory] = None
    hoist: Optional[HoistLoopStorage] = None


def as_options(options: Optional[PipelineOptions], overrides: Mapping) -> PipelineOptions:
    """``options`` (default ones when None) with the given fields replaced."""
    import dataclasses

    unknown = sorted(set(overrides) - set(PipelineOptions.names()))
    if unknown:
        raise TypeError(f"unknown pipeline option(s) {unknown}; PipelineOptions has "
                        f"{list(PipelineOptions.names())}")
    base = options if options is not None else PipelineOptions()
    return dataclasses.replace(base, **dict(overrides)) if overrides else base


def sequence_names(passes: Sequence[tvm.transform.Pass]) -> List[str]:
    """The registered names of ``passes`` (``tvm.transform.Pass.info.name``)."""
    return [p.info.name for p in passes]
