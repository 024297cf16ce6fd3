"""The phases of the relax_memplan pipeline, written out in the order they run.

Each phase is a plain list: TVM's own passes (those of ``tvm.relax.backend.cpu_generic`` and
``tvm.relax.backend.cuda``, spelled out here) and ours, in order. ``inspect --pipeline`` prints
this order for given options (:func:`pass_order`); ``tests/test_pipeline.py`` checks that
removing our passes leaves exactly TVM's backend lists, so a TVM release that changes them is
noticed.
"""

from __future__ import annotations

from typing import List, Optional, Tuple

import tvm
from tvm import relax

from .fusion import fusion_passes
from .options import PipelineOptions, PipelinePasses
from ..schedules import cpu_schedule_pass, gpu_schedule_pass
from ..schedules.prepack import mark_constant_weights, split_prepacked_weights
from ..transform.annotate_dim_ranges import AnnotateDimRanges
from ..transform.annotate_no_alias import AnnotateNoAlias
from ..transform.check_index_bounds import CheckIndexBounds
from ..transform.clamp_empty_slices import ClampEmptySlices
from ..transform.refuse_self_defining_casts import RefuseSelfDefiningCasts
from ..transform.conv_transpose_as_matmul import ConvTransposeAsMatmul
from ..transform.expand_integer_power import ExpandIntegerPower
from ..transform.fast_bounded_math import FastBoundedMath
from ..transform.fold_constants_first import FoldConstantsFirst
from ..transform.hoist_loop_storage import HoistLoopStorage
from ..transform.insert_dim_range_check import InsertDimRangeCheck
from ..transform.plan_dynamic_memory import PlanDynamicMemory
from ..transform.plan_static_memory import PlanStaticMemory
from ..transform.share_transposed_weights import ShareTransposedWeights
from ..transform.specialize_kernels import SpecializeKernels, backend_schedule

__all__ = ["SUPPORTED_KINDS", "make_passes", "phases"]

SUPPORTED_KINDS = ("llvm", "c", "cuda")
"""Target kinds with a Relax backend pipeline here."""

Phase = Tuple[str, List[tvm.transform.Pass]]


def _when(condition, *passes) -> list:
    """``passes`` without the Nones if ``condition``, else none (cheap passes only: the
    arguments are made either way)."""
    return [p for p in passes if p is not None] if condition else []


def make_passes(target: tvm.target.Target, options: PipelineOptions,
                given: Optional[PipelinePasses] = None) -> PipelinePasses:
    """The passes ``options`` ask for on ``target``: those of ``given`` (configured by the
    caller: a planner with its settings, ...) kept, the others made with their defaults; our
    planner's passes dropped when ``options.planner`` is TVM's. With declared dims
    (``options.dim_ranges``) and no dynamic planner given, a default
    :class:`~relax_memplan.transform.PlanDynamicMemory` plans the tensors they size.

    Raises
    ------
    ValueError
        An unknown conv chain mode (from :func:`~relax_memplan.pipeline.fusion_passes`).
    """
    g = given or PipelinePasses()
    ours = options.planner == "relax_memplan"
    kind = target.kind.name
    cpu_schedules = options.schedule and kind == "llvm"
    dispatch = g.dispatch
    if dispatch is None and options.dispatch:
        if cpu_schedules:
            from ..schedules import schedule_prim_func as by  # noqa: PLC0415
        else:
            by = backend_schedule(target)
        dispatch = SpecializeKernels(dict(options.dispatch), schedule=by)
    fusion = g.fusion
    if fusion is None and options.fusion:
        fusion = fusion_passes(target, options.fusion_conv_chain, cpu_schedules)
    index = g.index if g.index is not None else CheckIndexBounds(
        runtime_checks=options.check_indices and kind != "cuda")
    dynamic = g.dynamic
    if dynamic is None and ours and options.dim_ranges:
        # declared dims are kept symbolic: without the dynamic planner their tensors would be
        # left to TVM's planner, which sizes nothing symbolic
        dynamic = PlanDynamicMemory()
    return PipelinePasses(plan=(g.plan or PlanStaticMemory()) if ours else None,
                          dynamic=dynamic, record=g.record, index=index,
                          fusion=list(fusion) if fusion is not None else None,
                          dispatch=dispatch, reorder=g.reorder if ours else None,
                          hoist=(g.hoist or HoistLoopStorage()) if ours else None)


def phases(target: tvm.target.Target, options: PipelineOptions,
           passes: PipelinePasses) -> List[Phase]:
    """The four phases for ``target``: ``library_dispatch``, ``legalize``, ``dataflow_lower``,
    ``finalize``, each a list of passes in the order they run.

    Parameters
    ----------
    target : tvm.target.Target
        ``llvm``/``c`` (CPU) or ``cuda``.
    options : PipelineOptions
        What runs (planner, schedules, fusion, dims, dispatch).
    passes : PipelinePasses
        The configured instances of our passes that record what they did (from
        :meth:`PipelinePasses.create`); the lists hold these very objects.

    Raises
    ------
    ValueError
        A target kind without a Relax backend pipeline here.
    """
    kind = target.kind.name
    if kind not in SUPPORTED_KINDS:
        raise ValueError(f"target kind '{kind}' is not supported; use one of "
                         f"{sorted(SUPPORTED_KINDS)}")
    cuda = kind == "cuda"
    cpu_schedules = options.schedule and kind == "llvm"
    ours = options.planner == "relax_memplan"
    transform = relax.transform
    library_dispatch = [
        *_when(options.dim_ranges, AnnotateDimRanges(options.dim_ranges)),
        *_when(True, passes.index),
        relax.backend.DispatchSampling(),
        relax.backend.DispatchSortScan(),
        # a tied weight stays one tensor: before any folding makes its transpose a second one
        *_when(kind == "llvm", ShareTransposedWeights()),
    ]
    legalize = [
        # a cast TVM's FuseTIR would die on: an error instead of a crash
        RefuseSelfDefiningCasts(),
        # before LegalizeOps and any folding: TVM's dynamic_strided_slice gives a negative
        # extent for an empty slice
        ClampEmptySlices(),
        # constants folded once before the fusion passes: their peak checks lower each rewritten
        # module, whose FoldConstant would otherwise evaluate every constant again
        *_when(options.fusion, FoldConstantsFirst(), *(passes.fusion or [])),
        # TVM's CUDA pow gives NaN for a negative base
        ExpandIntegerPower(),
        # vector tanh/sigmoid/erf/softmax: LLVM turns a vector llvm.exp into a libm call per lane
        *_when(cpu_schedules, FastBoundedMath()),
        # kernel-equals-stride transposed convolutions as a matmul (no zero-dilated input)
        *_when(cpu_schedules, ConvTransposeAsMatmul()),
        transform.LegalizeOps(),
        transform.AnnotateTIROpPattern(),
        transform.FoldConstant(),
        transform.FuseOps(),
        transform.FuseTIR(),
        # constant weights marked before the bucket versions are made: they share one
        # prepacked weight
        *_when(cpu_schedules, mark_constant_weights()),
        *_when(True, passes.dispatch),
        # dlight's GPU rules, a rule's failure meaning "try the next one"
        *([gpu_schedule_pass(target)] if cuda else []),
        # our CPU rules add a layout-rewrite block for each marked weight; TVM splits it into
        # its own PrimFunc and FoldConstant runs it on the constant (schedules/prepack.py)
        *([cpu_schedule_pass(target), split_prepacked_weights()] if cpu_schedules else []),
    ]
    dataflow_lower = [
        *_when(ours, passes.reorder),
        transform.RewriteDataflowReshape(),
        transform.ToNonDataflow(),
        transform.RemovePurityChecking(),
        transform.CallTIRRewrite(),
    ]
    finalize = [
        *_when(ours, passes.dynamic, passes.plan),
        # last of ours before TVM's planner, so that its check becomes the very first binding
        *_when(ours, InsertDimRangeCheck()),
        transform.StaticPlanBlockMemory(),
        *_when(True, passes.record),
        *_when(cuda, transform.RewriteCUDAGraph()),
        transform.LowerAllocTensor(),
        # recursive loop bodies: their storage allocated once per call, not per iteration
        *_when(ours, passes.hoist),
        transform.KillAfterLastUse(),
        transform.LowerRuntimeBuiltin(),
        transform.ComputePrimValue(),
        transform.VMShapeLower(),
        transform.AttachGlobalSymbol(),
        # with either planner: TVM 0.27's LLVM codegen drops noalias from the kernels of a
        # symbolic-shape build without it
        AnnotateNoAlias(),
    ]
    return [("library_dispatch", library_dispatch), ("legalize", legalize),
            ("dataflow_lower", dataflow_lower), ("finalize", finalize)]
