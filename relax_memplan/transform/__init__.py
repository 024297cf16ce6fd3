"""The passes of relax_memplan, one per module (the registered name equals the class name).

Where each runs in :func:`relax_memplan.get_pipeline`: ``AnnotateDimRanges`` and
``CheckIndexBounds`` first, on the imported module; ``RefuseSelfDefiningCasts`` and
``ClampEmptySlices``, then with
``fusion=True`` ``FoldConstantsFirst`` and the fusion passes (``FoldMatmulReshape``,
``RemoveDropout``, ``FuseAttention``, ``FuseNormalization``, ``FuseAddLayerNorm``,
``ChunkFeedForward``, ``FuseConvChain`` on llvm/c targets), then ``ExpandIntegerPower``, ``FastBoundedMath`` (llvm
with ``schedule=True``) and ``ConvTransposeAsMatmul`` (same) before ``LegalizeOps``;
``SpecializeKernels`` after ``FuseTIR``; ``ReorderForMemory`` before ``CallTIRRewrite``;
``PlanDynamicMemory``, ``PlanStaticMemory`` and ``InsertDimRangeCheck`` in place of TVM's
``StaticPlanBlockMemory`` (after ``CallTIRRewrite``); ``RecordStorage`` after
``StaticPlanBlockMemory``; ``HoistLoopStorage`` right after ``LowerAllocTensor``;
``AnnotateNoAlias`` last.
"""

from .annotate_dim_ranges import AnnotateDimRanges
from .annotate_no_alias import AnnotateNoAlias
from .check_index_bounds import CheckIndexBounds
from .chunk_feed_forward import ChunkFeedForward
from .clamp_empty_slices import ClampEmptySlices
from .conv_transpose_as_matmul import ConvTransposeAsMatmul
from .expand_integer_power import ExpandIntegerPower
from .fast_bounded_math import FastBoundedMath
from .fold_constants_first import FoldConstantsFirst
from .fold_matmul_reshape import FoldMatmulReshape
from .fuse_add_layer_norm import FuseAddLayerNorm
from .fuse_attention import FuseAttention
from .fuse_conv_chain import FuseConvChain
from .fuse_normalization import FuseNormalization
from .hoist_loop_storage import HoistLoopStorage
from .refuse_self_defining_casts import RefuseSelfDefiningCasts
from .insert_dim_range_check import InsertDimRangeCheck
from .plan_dynamic_memory import PlanDynamicMemory
from .plan_static_memory import PlanStaticMemory
from .record_resident_bytes import RecordResidentBytes
from .record_storage import RecordStorage
from .remove_dropout import RemoveDropout
from .share_transposed_weights import ShareTransposedWeights
from .reorder_for_memory import ReorderForMemory
from .specialize_kernels import SpecializeKernels

__all__ = [
    "AnnotateDimRanges",
    "AnnotateNoAlias",
    "CheckIndexBounds",
    "ChunkFeedForward",
    "ClampEmptySlices",
    "RefuseSelfDefiningCasts",
    "ConvTransposeAsMatmul",
    "ExpandIntegerPower",
    "FastBoundedMath",
    "FoldConstantsFirst",
    "FoldMatmulReshape",
    "FuseAddLayerNorm",
    "FuseAttention",
    "FuseConvChain",
    "FuseNormalization",
    "HoistLoopStorage",
    "InsertDimRangeCheck",
    "PlanDynamicMemory",
    "PlanStaticMemory",
    "RecordResidentBytes",
    "RecordStorage",
    "RemoveDropout",
    "ShareTransposedWeights",
    "ReorderForMemory",
    "SpecializeKernels",
]
