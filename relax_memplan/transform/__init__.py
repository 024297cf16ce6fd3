"""The passes of relax_memplan, one per module (the registered name equals the class name).

Where each runs in :func:`relax_memplan.get_pipeline`: ``AnnotateDimRanges`` and
``CheckIndexBounds`` first, on the imported module; ``FoldMatmulReshape``, ``RemoveDropout``,
``FuseAttention`` and ``FuseAddLayerNorm`` (with ``fusion=True``), ``ExpandIntegerPower`` and
``ClampEmptySlices`` before ``LegalizeOps``, then ``FastBoundedMath`` (llvm with
``schedule=True``); ``ReorderForMemory`` before ``CallTIRRewrite``; ``SpecializeKernels`` after ``FuseTIR``; ``PlanDynamicMemory``,
``PlanStaticMemory`` and ``InsertDimRangeCheck`` in place of TVM's ``StaticPlanBlockMemory``
(after ``CallTIRRewrite``); ``RecordStorage`` after ``StaticPlanBlockMemory``.
"""

from .annotate_dim_ranges import AnnotateDimRanges
from .check_index_bounds import CheckIndexBounds
from .clamp_empty_slices import ClampEmptySlices
from .expand_integer_power import ExpandIntegerPower
from .fast_bounded_math import FastBoundedMath
from .fold_matmul_reshape import FoldMatmulReshape
from .fuse_add_layer_norm import FuseAddLayerNorm
from .fuse_attention import FuseAttention
from .insert_dim_range_check import InsertDimRangeCheck
from .plan_dynamic_memory import PlanDynamicMemory
from .plan_static_memory import PlanStaticMemory
from .record_resident_bytes import RecordResidentBytes
from .record_storage import RecordStorage
from .remove_dropout import RemoveDropout
from .reorder_for_memory import ReorderForMemory
from .specialize_kernels import SpecializeKernels

__all__ = [
    "AnnotateDimRanges",
    "CheckIndexBounds",
    "ClampEmptySlices",
    "ExpandIntegerPower",
    "FastBoundedMath",
    "FoldMatmulReshape",
    "FuseAddLayerNorm",
    "FuseAttention",
    "InsertDimRangeCheck",
    "PlanDynamicMemory",
    "PlanStaticMemory",
    "RecordResidentBytes",
    "RecordStorage",
    "RemoveDropout",
    "ReorderForMemory",
    "SpecializeKernels",
]
