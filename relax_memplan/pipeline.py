"""The relax_memplan compilation pipeline: TVM's per-target phases with our memory planner.

Phases (from ``tvm.relax.backend.<target>.pipeline``):

1. ``library_dispatch`` -- (ours) ``AnnotateDimRanges`` and ``CheckIndexBounds``
   (index-value checks, see that module), then the target's library dispatch passes, then on
   CPU ``ShareTransposedWeights`` (ours: a tied weight read transposed too stays one tensor);
2. ``legalize`` -- ``ClampEmptySlices`` (ours: empty dynamic slices), with ``fusion=True``
   ``FoldConstantsFirst`` (ours: TVM's FoldConstant once, so that the fusion passes' peak
   checks do not fold again for each rewrite they try)
   and our graph-level fusion (:func:`fusion_passes`),
   ``ExpandIntegerPower`` (ours: ``x**3`` as multiplications; TVM's CUDA ``pow`` gives NaN for
   a negative base), LegalizeOps,
   AnnotateTIROpPattern, FoldConstant, FuseOps, FuseTIR (and dlight GPU schedules for CUDA, with a rule that fails on a
   kernel skipped: :func:`~relax_memplan.schedules.gpu_schedule_pass`);
3. ``dataflow_lower`` -- RewriteDataflowReshape, ToNonDataflow,
   RemovePurityChecking, CallTIRRewrite;
4. ``finalize`` -- memory planning, then LowerAllocTensor, (ours)
   :class:`~relax_memplan.transform.hoist_loop_storage.HoistLoopStorage` (recursive loop
   bodies allocate once per call, not per iteration; our planner only), KillAfterLastUse,
   LowerRuntimeBuiltin, ComputePrimValue, VMShapeLower, AttachGlobalSymbol, and
   :class:`~relax_memplan.transform.annotate_no_alias.AnnotateNoAlias` (with
   either planner: without it, TVM 0.27's LLVM codegen drops ``noalias`` from
   every kernel of a symbolic-shape build, see that module).

With ``planner="relax_memplan"`` the finalize phase runs
:class:`~relax_memplan.transform.PlanStaticMemory` followed by TVM's
``StaticPlanBlockMemory`` (which then plans only what ours left, exactly as
TVM would). With ``planner="tvm"`` it is TVM's own memory planning, unchanged: the
baseline of every comparison in our reports (both planners get the same kernels,
``CheckIndexBounds``, ``ClampEmptySlices`` and ``AnnotateNoAlias`` included, so kernel time
and numerics never differ between them).

Unlike ``tvm.compile``'s bare default (``default_build_pipeline``), these
phases fold constants and fuse operators.

Importing this module registers the pipeline as
``relax.get_pipeline("relax_memplan", target=...)`` (the first use of a name of
:mod:`relax_memplan` imports it).
"""

from __future__ import annotations

import importlib
from pathlib import Path
from typing import Mapping, Optional, Sequence, Tuple, Union

import tvm
from tvm import relax

from .schedules.prepack import mark_constant_weights, split_prepacked_weights
from .transform.annotate_dim_ranges import AnnotateDimRanges
from .transform.annotate_no_alias import AnnotateNoAlias
from .transform.check_index_bounds import CheckIndexBounds
from .transform.clamp_empty_slices import ClampEmptySlices
from .transform.hoist_loop_storage import HoistLoopStorage
from .transform.insert_dim_range_check import InsertDimRangeCheck
from .transform.plan_dynamic_memory import PlanDynamicMemory
from .transform.plan_static_memory import PlanStaticMemory
from .transform.reorder_for_memory import ReorderForMemory
from .transform.expand_integer_power import ExpandIntegerPower
from .transform.fast_bounded_math import FastBoundedMath
from .transform.chunk_feed_forward import ChunkFeedForward
from .transform.fold_constants_first import FoldConstantsFirst
from .transform.fold_matmul_reshape import FoldMatmulReshape
from .transform.fuse_add_layer_norm import FuseAddLayerNorm
from .transform.fuse_attention import FuseAttention
from .transform.fuse_conv_chain import FuseConvChain
from .transform.fuse_normalization import FuseNormalization
from .transform.record_storage import RecordStorage
from .transform.remove_dropout import RemoveDropout
from .transform.share_transposed_weights import ShareTransposedWeights
from .transform.specialize_kernels import SpecializeKernels, backend_schedule
from .transform.conv_transpose_as_matmul import ConvTransposeAsMatmul
from .schedules import cpu_schedule_pass, gpu_schedule_pass, schedule_prim_func
from .schedules.cpu_matmul import simd_lanes

__all__ = ["get_pipeline", "backend_phases", "fusion_passes", "fusion_counts", "PLANNERS",
           "CONV_CHAIN_MODES"]

PLANNERS = ("relax_memplan", "tvm")

#: ``fusion_passes(conv_chain=...)``: ``auto`` fuses conv chains where measured not slower (into
#: depthwise strided convs, and into dense ones whose pair gets the register-blocked kernel;
#: without our CPU schedules into any, TVM's legalized conv being an unscheduled loop nest),
#: ``memory`` into any strided conv (lowest peak; the generic kernel's dense consumers measured
#: 1.2x slower than our scheduled convs), ``off`` never. Values: the
#: ``FuseConvChain(consumers=...)`` with and without ``schedule``.
CONV_CHAIN_MODES = {"auto": ("blocked", "all"), "memory": ("all", "all"), "off": (None, None)}

_BACKEND_MODULES = {
    "llvm": "tvm.relax.backend.cpu_generic.pipeline",
    "c": "tvm.relax.backend.cpu_generic.pipeline",
    "cuda": "tvm.relax.backend.cuda.pipeline",
}


def _as_target(target: Union[str, dict, tvm.target.Target, None]) -> tvm.target.Target:
    if target is None:
        return tvm.target.Target("llvm")
    if isinstance(target, tvm.target.Target):
        return target
    return tvm.target.Target(target)


def fusion_passes(target: tvm.target.Target, conv_chain: str = "auto",
                  schedule: bool = False) -> list:
    """Our graph-level fusion passes, in the order they run (before ``LegalizeOps``).

    :class:`~relax_memplan.transform.fold_matmul_reshape.FoldMatmulReshape` (a matmul between
    reshapes to and from 2-d becomes the N-d matmul, so FuseOps fuses its epilogue),
    :class:`~relax_memplan.transform.remove_dropout.RemoveDropout`,
    :class:`~relax_memplan.transform.fuse_attention.FuseAttention` (its kernel scheduled for
    ``target``: CPU for llvm, CUDA for cuda),
    :class:`~relax_memplan.transform.fuse_normalization.FuseNormalization` (layer and RMS
    norms written as element-wise steps become the norm ops),
    :class:`~relax_memplan.transform.fuse_add_layer_norm.FuseAddLayerNorm` (its scheduled CPU
    kernel for ``llvm``/``c``, else a compute the target's default schedule rules schedule) and
    :class:`~relax_memplan.transform.chunk_feed_forward.ChunkFeedForward` (the feed-forward
    block over row chunks where the lowered peak drops), on every target; on llvm/c targets
    :class:`~relax_memplan.transform.fuse_conv_chain.FuseConvChain` last (a conv and the
    stride-2 conv reading it as one kernel where the live bytes improve; CPU kernel only, so not
    for cuda), for the consumers ``conv_chain`` selects (:data:`CONV_CHAIN_MODES`; ``schedule``:
    the build applies our CPU schedules, as ``get_pipeline(schedule=...)``). Give the
    list to ``get_pipeline(..., fusion_pass_list=...)`` and read :func:`fusion_counts` after the
    build.

    Raises
    ------
    ValueError
        An unknown ``conv_chain`` mode.
    """
    if conv_chain not in CONV_CHAIN_MODES:
        raise ValueError(f"conv_chain must be one of {list(CONV_CHAIN_MODES)}, "
                         f"got {conv_chain!r}")
    cpu = target.kind.name in ("llvm", "c")
    passes = [FoldMatmulReshape(), RemoveDropout(), FuseAttention(target=target),
              FuseNormalization(),
              FuseAddLayerNorm(kernel="cpu" if cpu else "compute", target=target),
              ChunkFeedForward(target=target)]
    consumers = CONV_CHAIN_MODES[conv_chain][0 if schedule else 1]
    if cpu and consumers is not None:
        passes.append(FuseConvChain(lanes=simd_lanes(target), target=target,
                                    consumers=consumers))
    return passes


def fusion_counts(passes) -> dict:
    """What the fusion passes of one build did: pattern -> count (``attention``: attention
    blocks fused into one kernel, ``dropout``: dropouts removed, ``layer_norm``/``rms_norm``:
    norms written as element-wise steps made one norm op, ``add_layer_norm``/``add_rms_norm``:
    residual add + layer/RMS norm pairs fused into one kernel, ``matmul_reshape``: matmuls
    taken out of a reshape sandwich so that FuseOps fuses their epilogue,
    ``feed_forward_chunked``: feed-forward
    blocks computed over row chunks, ``conv_chain``: conv + strided conv pairs fused,
    ``conv_chain_refused``: chains found but not fused, because the intermediate has another
    reader, the live bytes would not improve or the threads' scratch would not be smaller,
    ``conv_chain_candidates``: strided convs the pass looked at, fused or not, each once: the
    same in every mode, the reasons of the others in
    :func:`~relax_memplan.report.fusion_summary.fusion_skips`); a pattern whose pass did not
    run is absent."""
    by_name = {p.info.name: p for p in passes}
    counts = {}
    if "FuseAttention" in by_name:
        counts["attention"] = int(by_name["FuseAttention"].fused)
    if "RemoveDropout" in by_name:
        counts["dropout"] = int(by_name["RemoveDropout"].removed)
    if "FoldMatmulReshape" in by_name:
        counts["matmul_reshape"] = int(by_name["FoldMatmulReshape"].folded)
    if "FuseNormalization" in by_name:
        counts.update({k: int(n) for k, n in by_name["FuseNormalization"].fused.items()})
    if "FuseAddLayerNorm" in by_name:
        counts.update({k: int(n)
                       for k, n in by_name["FuseAddLayerNorm"].fused_by_pattern.items()})
    if "ChunkFeedForward" in by_name:
        counts["feed_forward_chunked"] = int(by_name["ChunkFeedForward"].chunked)
    if "FuseConvChain" in by_name:
        counts["conv_chain"] = int(by_name["FuseConvChain"].fused)
        skipped = by_name["FuseConvChain"].skipped
        counts["conv_chain_refused"] = sum(skipped.get(k, 0)
                                           for k in ("other_consumer", "peak", "scratch"))
        counts["conv_chain_candidates"] = counts["conv_chain"] + sum(skipped.values())
    return counts


def backend_phases(
    target: tvm.target.Target,
    plan_pass: Optional[PlanStaticMemory] = None,
    record_pass: Optional[RecordStorage] = None,
    dynamic_pass: Optional[PlanDynamicMemory] = None,
    dim_ranges: Optional[Mapping[str, Tuple[Optional[int], Optional[int]]]] = None,
    dispatch: Optional[Mapping[str, Sequence[int]]] = None,
    dispatch_pass: Optional[SpecializeKernels] = None,
    schedule: bool = False,
    index_pass: Optional[CheckIndexBounds] = None,
    fusion: bool = True,
    fusion_pass_list: Optional[Sequence[tvm.transform.Pass]] = None,
    reorder_pass: Optional[ReorderForMemory] = None,
    hoist_pass: Optional[HoistLoopStorage] = None,
):
    """TVM's per-target phases, with the memory planner chosen.

    Parameters
    ----------
    target : tvm.target.Target
        ``llvm`` (CPU) or ``cuda``.
    plan_pass : PlanStaticMemory, optional
        Our planner, inserted before ``StaticPlanBlockMemory``; ``None`` keeps
        TVM's planner alone.
    record_pass : RecordStorage, optional
        Inserted right after ``StaticPlanBlockMemory`` to record what each
        function allocates.
    dynamic_pass : PlanDynamicMemory, optional
        Our planner for symbolic sizes, inserted (after the dim-range check)
        before ``plan_pass``.
    dim_ranges : mapping of str to (int or None, int or None[, int]), optional
        Declared dim ranges, optionally with a step: ``AnnotateDimRanges`` runs first and, with our
        planner, ``InsertDimRangeCheck`` checks them at run time.
    dispatch : mapping of str to sequence of int, optional
        Shape buckets (``{"seq": [64, 128]}``): ``SpecializeKernels`` runs
        right after ``FuseTIR`` (after ``MarkConstantWeights`` with ``schedule=True``
        on llvm, so that its versions share one prepacked weight), scheduling each version with
        :func:`~relax_memplan.schedules.schedule_prim_func` (llvm with
        ``schedule=True``), else with the target's default
        (:func:`~relax_memplan.transform.specialize_kernels.backend_schedule`).
    dispatch_pass : SpecializeKernels, optional
        A configured instance to insert instead (its ``specialized`` attribute
        is filled while the pipeline runs); takes precedence over ``dispatch``.
    schedule : bool
        For an llvm target, append
        :func:`~relax_memplan.schedules.cpu_schedule_pass` (CPU matmul/GEMV/
        reduction schedules) at the end of the ``legalize`` phase, and run
        :class:`~relax_memplan.transform.fast_bounded_math.FastBoundedMath` before
        ``LegalizeOps`` (after our fusion passes, which match ``softmax``/``erf``/``tanh``):
        ``tanh``, ``sigmoid``, ``erf`` and ``softmax`` become TVM's vectorizable approximations.
    index_pass : CheckIndexBounds, optional
        Runs first in ``library_dispatch`` (after ``AnnotateDimRanges``), on the imported
        module: index values that would leave their tensor are refused or checked.
    fusion : bool
        Run our graph-level fusion passes (:func:`fusion_passes`) first in the ``legalize``
        phase, before ``LegalizeOps`` (default); TVM's FuseOps/FuseTIR then fuse what is left.
    fusion_pass_list : list of tvm.transform.Pass, optional
        Configured fusion passes (from :func:`fusion_passes`) to run instead, with
        ``fusion=True``; read :func:`fusion_counts` of them after the build.
    reorder_pass : ReorderForMemory, optional
        Runs first in ``dataflow_lower`` (after FuseTIR and the schedules, before
        ``CallTIRRewrite``): binding order of least peak live bytes.
    hoist_pass : HoistLoopStorage, optional
        A configured instance (read its ``hoisted``/``skipped`` after the build); with our
        planner a default one runs right after ``LowerAllocTensor`` when this is ``None``.

    Returns
    -------
    list of (str, list of tvm.transform.Pass)
        Phase name and its passes, in order.

    Raises
    ------
    ValueError
        If the target kind has no Relax backend pipeline here.
    """
    kind = target.kind.name
    if kind not in _BACKEND_MODULES:
        raise ValueError(
            f"target kind '{kind}' is not supported; use one of {sorted(_BACKEND_MODULES)}"
        )
    backend = importlib.import_module(_BACKEND_MODULES[kind])
    finalize = []
    ours = plan_pass is not None or dynamic_pass is not None
    for p in backend.finalize_passes(target):
        if p.info.name == "StaticPlanBlockMemory" and ours:
            finalize += [q for q in (dynamic_pass, plan_pass) if q is not None]
            # last of ours, so its check becomes the very first binding
            finalize.append(InsertDimRangeCheck())
        finalize.append(p)
        if p.info.name == "StaticPlanBlockMemory" and record_pass is not None:
            finalize.append(record_pass)
        if p.info.name == "LowerAllocTensor" and ours:
            # recursive loop bodies: their storage allocated once per call, not per iteration
            finalize.append(hoist_pass if hoist_pass is not None else HoistLoopStorage())
    finalize.append(AnnotateNoAlias())
    annotate = [AnnotateDimRanges(dim_ranges)] if dim_ranges else []
    if index_pass is not None:
        annotate.append(index_pass)
    # before LegalizeOps: TVM's pow gives NaN for a negative base on CUDA (expand_integer_power)
    legalize = [ExpandIntegerPower()] + list(backend.legalize_passes(target))
    if schedule and kind == "llvm":
        # vector tanh/sigmoid/erf/softmax: LLVM turns a vector llvm.exp into one libm call
        # per lane (SiLU, tanh and erf GELU)
        legalize.insert(1, FastBoundedMath())
    if fusion:
        # the conv-chain consumers follow ``schedule`` (dense ones fused are slower than our
        # scheduled convs: yolov8n, one thread, 40.4 ms with them fused, 27.0 ms without)
        legalize = list(fusion_pass_list or fusion_passes(
            target, schedule=schedule and kind == "llvm")) + legalize
        # constants folded once, before the fusion passes: their peak checks lower each
        # rewritten module, whose FoldConstant would otherwise evaluate every constant again
        # (gpt2-tiny: 1.9 CPU s per lowering); TVM's FoldConstant after LegalizeOps stays
        legalize.insert(0, FoldConstantsFirst())
    # before LegalizeOps (and any folding): TVM's dynamic_strided_slice gives a negative extent
    # for an empty slice
    legalize.insert(0, ClampEmptySlices())
    if kind == "cuda":
        # dlight's GPU rules, each failure of a rule meaning "try the next one"
        legalize = [gpu_schedule_pass(target) if p.info.name == "ApplyDefaultSchedule" else p
                    for p in legalize]
    if dispatch_pass is None and dispatch:
        by = schedule_prim_func if schedule and kind == "llvm" else backend_schedule(target)
        dispatch_pass = SpecializeKernels(dispatch, schedule=by)
    if dispatch_pass is not None:
        fuse_tir = [i for i, p in enumerate(legalize) if p.info.name == "FuseTIR"]
        at = fuse_tir[-1] + 1 if fuse_tir else len(legalize)
        # constant weights marked first: the bucket versions share one prepacked weight
        marks = [mark_constant_weights()] if schedule and kind == "llvm" else []
        legalize[at:at] = marks + [dispatch_pass]
    if schedule and kind == "llvm":
        # kernel-equals-stride transposed convolutions as a matmul (no zero-dilated input)
        at = [i for i, p in enumerate(legalize) if p.info.name == "LegalizeOps"]
        legalize.insert(at[0] if at else 0, ConvTransposeAsMatmul())
        # constant weights get the kernels' packed layout at compile time: we mark them
        # (layout_free_buffers), our rules add the layout-rewrite block, TVM splits it into
        # its own PrimFunc and FoldConstant runs it on the constant (schedules/prepack.py)
        marks = [] if dispatch_pass is not None else [mark_constant_weights()]
        legalize += marks + [cpu_schedule_pass(target), split_prepacked_weights()]
    return [
        # a tied weight stays one tensor: before any folding makes its transpose a second one
        ("library_dispatch", annotate + backend.library_dispatch_passes(target)
         + ([ShareTransposedWeights()] if kind == "llvm" else [])),
        ("legalize", legalize),
        ("dataflow_lower", ([reorder_pass] if reorder_pass is not None else [])
         + list(backend.dataflow_lower_passes(target))),
        ("finalize", finalize),
    ]


def get_pipeline(
    target: Union[str, dict, tvm.target.Target, None] = None,
    planner: str = "relax_memplan",
    plan_pass: Optional[PlanStaticMemory] = None,
    record_pass: Optional[RecordStorage] = None,
    dump_dir: Union[str, Path, None] = None,
    dynamic_pass: Optional[PlanDynamicMemory] = None,
    dim_ranges: Optional[Mapping[str, Tuple[Optional[int], Optional[int]]]] = None,
    dispatch: Optional[Mapping[str, Sequence[int]]] = None,
    dispatch_pass: Optional[SpecializeKernels] = None,
    schedule: bool = False,
    check_indices: bool = True,
    index_pass: Optional[CheckIndexBounds] = None,
    fusion: bool = True,
    fusion_pass_list: Optional[Sequence[tvm.transform.Pass]] = None,
    reorder_pass: Optional[ReorderForMemory] = None,
    hoist_pass: Optional[HoistLoopStorage] = None,
) -> tvm.transform.Pass:
    """The Relax pipeline to give ``tvm.compile(mod, target, relax_pipeline=...)``.

    Parameters
    ----------
    target : str, dict or tvm.target.Target, optional
        Compilation target; default ``llvm``.
    planner : {"relax_memplan", "tvm"}
        Whose static memory planner runs.
    plan_pass : PlanStaticMemory, optional
        A configured instance of our pass (its ``plans`` attribute is filled
        while the pipeline runs, which the report reads); a default one is made
        when ``planner == "relax_memplan"`` and this is ``None``.
    record_pass : RecordStorage, optional
        Records the per-function storage summary after static planning.
    dump_dir : str or Path, optional
        If given, the IR after each phase is written to
        ``<dump_dir>/<k>_<phase>.py`` (TVMScript).
    dynamic_pass : PlanDynamicMemory, optional
        Our planner for symbolic sizes (``relax_memplan`` planner only); without
        it symbolic tensors are left to TVM.
    dim_ranges : mapping of str to (int or None, int or None[, int]), optional
        Declared ranges of symbolic dims (both planners get the attributes;
        ours also checks them at run time).
    dispatch : mapping of str to sequence of int, optional
        Shape buckets for kernel specialization (see :func:`backend_phases`).
    dispatch_pass : SpecializeKernels, optional
        A configured ``SpecializeKernels``, used instead of one made from
        ``dispatch``; read its ``specialized`` attribute after the build.
    schedule : bool
        Schedule CPU kernels (llvm only; see :func:`backend_phases`).
    check_indices : bool
        Check index values at run time where they are not proved in range
        (:class:`~relax_memplan.transform.check_index_bounds.CheckIndexBounds`, both planners;
        CPU targets only, the check kernels have no GPU schedule). Index ranges that
        certainly leave a table at a declared dim value are refused at compile time either way.
    index_pass : CheckIndexBounds, optional
        A configured instance to run instead of one made from ``check_indices`` (read its
        ``refused``, ``checked`` and ``proved`` attributes after the build).
    fusion : bool
        Our graph-level fusion before ``LegalizeOps`` (see :func:`fusion_passes`); on by
        default, as in the CLI and the config (``False``: TVM's FuseOps/FuseTIR alone).
    fusion_pass_list : list of tvm.transform.Pass, optional
        Configured fusion passes to run instead of new ones, with ``fusion=True`` (read
        :func:`fusion_counts` of them after the build).
    reorder_pass : ReorderForMemory, optional
        Memory-aware binding order (``relax_memplan`` planner only; see
        :func:`backend_phases`); read its ``blocks`` after the build.
    hoist_pass : HoistLoopStorage, optional
        A configured instance (``relax_memplan`` planner only; read its ``hoisted`` and
        ``skipped`` after the build).

    Returns
    -------
    tvm.transform.Pass
        A module pass running the four phases under ``target``.

    Raises
    ------
    ValueError
        Unknown planner or unsupported target kind.
    """
    if planner not in PLANNERS:
        raise ValueError(f"unknown planner '{planner}'; use one of {PLANNERS}")
    tgt = _as_target(target)
    if planner == "relax_memplan" and plan_pass is None:
        plan_pass = PlanStaticMemory()
    mine = planner == "relax_memplan"
    if index_pass is None:
        index_pass = CheckIndexBounds(runtime_checks=check_indices and tgt.kind.name != "cuda")
    phases = backend_phases(tgt, plan_pass if mine else None, record_pass,
                            dynamic_pass if mine else None, dim_ranges,
                            dispatch=dispatch, dispatch_pass=dispatch_pass,
                            schedule=schedule, index_pass=index_pass, fusion=fusion,
                            fusion_pass_list=fusion_pass_list,
                            reorder_pass=reorder_pass if mine else None,
                            hoist_pass=hoist_pass)
    dump = Path(dump_dir) if dump_dir is not None else None

    @tvm.transform.module_pass(opt_level=0, name=f"RelaxMemplanPipeline_{planner}")
    def _pipeline(mod: tvm.IRModule, _ctx) -> tvm.IRModule:
        with tgt:
            for k, (name, passes) in enumerate(phases):
                mod = tvm.transform.Sequential(passes, name=name)(mod)
                if dump is not None:
                    dump.mkdir(parents=True, exist_ok=True)
                    (dump / f"{k}_{name}.py").write_text(mod.script(), encoding="utf-8")
        return mod

    return _pipeline


if "relax_memplan" not in relax.pipeline.PIPELINE_MAP:
    relax.pipeline.register_pipeline("relax_memplan")(get_pipeline)
