"""Options of the compile path: how to build (:class:`BuildOptions`) and how to check the
build (:class:`CheckOptions`), shared by the CLI and the Python API."""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Mapping, Optional, Sequence, Tuple, Union

import tvm

from ..config import PlannerConfig
from ..errors import ConfigError
from ..pipeline import PipelineOptions
from ..targets import CpuTarget, CudaArch, make_target, resolve_cpu, resolve_cuda_arch
from ..transform.plan_dynamic_memory import PlanDynamicMemory
from ..transform.plan_static_memory import PlanStaticMemory
from ..transform.reorder_for_memory import ReorderForMemory

__all__ = ["BuildOptions", "CheckOptions", "STRATEGIES", "library_path_for",
           "default_planner_passes"]

STRATEGIES = ("upper_bound", "exact", "buckets")
"""Dynamic strategies, in the order ``--strategy all`` shows them."""


def default_planner_passes(planner=None, time_limit_s: Optional[float] = None,
                           inplace: Optional[bool] = None, reorder: Optional[bool] = None):
    """Fresh ``(PlanStaticMemory, ReorderForMemory or None)`` configured as the YAML
    config's ``planner`` section says (:class:`relax_memplan.config.PlannerConfig`; its
    defaults when None), each given value (not None) replacing the config's: what the CLI's
    ``compile``/``bench`` and a default :class:`BuildOptions` plan with.

    Raises
    ------
    ConfigError
        ``planner`` given as something else than a ``PlannerConfig``.
    """
    if planner is None:
        planner = PlannerConfig()
    elif not isinstance(planner, PlannerConfig):
        raise ConfigError(f"planner must be a PlannerConfig, got {type(planner).__name__}")
    plan_pass = PlanStaticMemory(
        alignment_bytes=planner.alignment_bytes, algorithms=planner.algorithms,
        time_limit_s=time_limit_s if time_limit_s is not None else planner.time_limit_s,
        inplace=planner.inplace if inplace is None else inplace,
        concat_inplace=planner.concat_inplace)
    reorder = planner.reorder if reorder is None else reorder
    return plan_pass, ReorderForMemory() if reorder else None


@dataclass(frozen=True)
class BuildOptions:
    """How the model is imported and built.

    Attributes
    ----------
    target : str or tvm.target.Target
        ``llvm`` (built, run, verified) or ``cuda`` (built only, fixed shapes or symbolic
        dims). A ``tvm.target.Target`` is used as it is.
    cuda_arch : str, optional
        ``sm_XX`` of a ``cuda`` build given by name; default: the installed GPU's, else
        :data:`relax_memplan.targets.DEFAULT_CUDA_ARCH` (``sm_80``).
    cpu : str
        CPU of an ``llvm`` build given by name: ``host`` (this machine's CPU, the default),
        ``portable`` (plain ``llvm``: any CPU of the architecture) or an LLVM CPU name
        (:func:`relax_memplan.targets.resolve_cpu`).
    plan_pass : PlanStaticMemory, optional
        Settings of our planner (alignment, algorithms, time limit, in-place). Default: the
        CLI's planner, :func:`default_planner_passes` (in-place writes and concatenation in
        place on), made fresh for each ``BuildOptions``.
    reorder : bool
        Memory-aware binding order (:class:`ReorderForMemory`, as the CLI's ``--reorder``,
        on by default). ``False``: the importer's order. Ignored when ``reorder_pass`` is
        given.
    reorder_pass : ReorderForMemory, optional
        A configured reorder pass (read its ``blocks`` after the build); default: a fresh
        one when ``reorder`` is true, none otherwise.
    strategies : sequence of str
        Dynamic strategies to build (with symbolic dims): each of :data:`STRATEGIES`.
        Ignored for a fixed-shape build (strategy ``"static"``).
    dynamic_pass : PlanDynamicMemory, optional
        A configured dynamic planner, used instead of one made from the strategy (one
        strategy only; read its ``plans`` after the call).
    buckets : mapping of str to sequence of int
        Bucket values of the ``buckets`` strategy.
    size_classes : bool
        Round arenas and symbolic outputs up to geometric size classes.
    size_class_growth : float
        Ratio between consecutive size classes.
    dispatch : mapping of str to sequence of int
        Kernel specialization values (:class:`~relax_memplan.transform.SpecializeKernels`).
    schedule : bool
        Apply our CPU schedules (:mod:`relax_memplan.schedules`: matmul, convolution, GEMV,
        row reduction, then :class:`~relax_memplan.schedules.SpatialFallback`) to every build
        for an ``llvm`` target (on by default; ``False``: TVM's unscheduled kernels, the
        baseline of kernel comparisons).
    check_indices : bool
        Check index values at run time where not proved in range (every build).
    fusion : bool
        Our graph-level fusion before ``LegalizeOps`` (attention as one kernel, dropout
        removed: :func:`~relax_memplan.pipeline.fusion_passes`), in every build like the other
        kernel options, TVM's comparison build included; the report counts what fused. On by
        default.
    prepare : bool
        Run the ONNX preparation steps before TVM's importer.
    compare_with_tvm : bool
        Also build (and run) with TVM's planner alone.
    dump_dir : path, optional
        Write the IR after each phase of our pipeline there.
    library_path : path, optional
        Write our build there right after building it (several strategies: one file each,
        :func:`library_path_for`).
    """

    target: Union[str, tvm.target.Target] = "llvm"
    cuda_arch: Optional[str] = None
    cpu: str = "host"
    plan_pass: Optional[PlanStaticMemory] = None
    reorder: bool = True
    reorder_pass: Optional[ReorderForMemory] = None
    strategies: Tuple[str, ...] = ("exact",)
    dynamic_pass: Optional[PlanDynamicMemory] = None
    buckets: Mapping[str, Sequence[int]] = field(default_factory=dict)
    size_classes: bool = False
    size_class_growth: float = 4.0
    dispatch: Mapping[str, Sequence[int]] = field(default_factory=dict)
    schedule: bool = True
    check_indices: bool = True
    fusion: bool = True
    fusion_conv_chain: str = "auto"
    prepare: bool = True
    compare_with_tvm: bool = True
    dump_dir: Optional[object] = None
    library_path: Optional[object] = None

    def __post_init__(self):
        # the Python API plans as the CLI does: a BuildOptions() left at its defaults gets
        # the config's planner (in-place, concat in place, reorder), not the bare passes'
        if self.plan_pass is None or (self.reorder_pass is None and self.reorder):
            plan, reorder = default_planner_passes()
            if self.plan_pass is None:
                object.__setattr__(self, "plan_pass", plan)
            if self.reorder_pass is None and self.reorder:
                object.__setattr__(self, "reorder_pass", reorder)

    def pipeline_options(self, planner: str = "relax_memplan",
                         dim_ranges: Optional[Mapping[str, tuple]] = None) -> PipelineOptions:
        """The :class:`~relax_memplan.pipeline.PipelineOptions` of a build with ``planner``
        (``"tvm"``: TVM's comparison build, same kernel options) at ``dim_ranges``."""
        return PipelineOptions(
            planner=planner, schedule=self.schedule, fusion=self.fusion,
            fusion_conv_chain=self.fusion_conv_chain, check_indices=self.check_indices,
            dim_ranges=dict(dim_ranges or {}), dump_dir=self.dump_dir if planner != "tvm"
            else None)

    @property
    def tvm_target(self) -> tvm.target.Target:
        """:attr:`target` as a ``tvm.target.Target`` (``cuda``: with the arch of
        :func:`relax_memplan.targets.resolve_cuda_arch`)."""
        if isinstance(self.target, str):
            return make_target(self.target, self.cuda_arch, self.cpu)
        return self.target

    @property
    def cpu_used(self) -> Optional[CpuTarget]:
        """The CPU an ``llvm`` build is compiled for and where it came from (None for other
        targets; a ``tvm.target.Target`` given as it is: its ``mcpu``)."""
        if isinstance(self.target, str):
            return resolve_cpu(self.cpu) if self.target == "llvm" else None
        if self.target.kind.name != "llvm":
            return None
        mcpu = self.target.attrs.get("mcpu")
        return CpuTarget(str(mcpu), "given") if mcpu else CpuTarget("generic", "portable")

    @property
    def cuda_arch_used(self) -> Optional[CudaArch]:
        """The arch a ``cuda`` build uses and where it came from (None for other targets)."""
        if isinstance(self.target, str):
            return resolve_cuda_arch(self.cuda_arch) if self.target == "cuda" else None
        arch = self.target.attrs.get("arch") if self.target.kind.name == "cuda" else None
        return CudaArch(str(arch), "given") if arch is not None else None


@dataclass(frozen=True)
class CheckOptions:
    """How the builds are run and checked.

    Attributes
    ----------
    measure : bool
        Run the builds and count the bytes they allocate (naive VM allocator).
    verify : bool
        Compare with onnxruntime at each shape (onnxruntime runs first) and measure how much
        its output moves on a second random input (``input_sensitivity``).
    rtol, atol : float
        Tolerance ``rtol * max|finite reference| + atol``, per shape.
    seed : int
        Seed of the sampled shapes and random inputs.
    sample_shapes : int
        Shapes to run at with symbolic dims (>= 2: the range ends first).

    Raises
    ------
    ConfigError
        A negative or non-finite tolerance, a seed that is not an integer >= 0, or
        ``sample_shapes`` < 2 (as the config's ``verify`` section refuses them).
    """

    measure: bool = True
    verify: bool = False
    rtol: float = 1e-4
    atol: float = 1e-5
    seed: int = 0
    sample_shapes: int = 3

    def __post_init__(self):
        # the tolerance is a check: a negative one would fail every output, NaN none
        for key in ("rtol", "atol"):
            value = getattr(self, key)
            if isinstance(value, bool) or not isinstance(value, (int, float)) \
                    or not math.isfinite(value) or value < 0:
                raise ConfigError(f"CheckOptions.{key} must be a finite number >= 0, "
                                  f"got {value!r}")
        for key, least in (("seed", 0), ("sample_shapes", 2)):
            value = getattr(self, key)
            if isinstance(value, bool) or not isinstance(value, int) or value < least:
                raise ConfigError(f"CheckOptions.{key} must be an integer >= {least}, "
                                  f"got {value!r}")


def library_path_for(path, strategy: str, several: bool) -> str:
    """Where the library of ``strategy`` goes: ``path`` itself, or with several strategies
    ``model.exact.so`` beside ``model.so``."""
    import os

    path = os.fspath(path)
    if not several:
        return path
    stem, ext = os.path.splitext(path)
    return f"{stem}.{strategy}{ext}"
