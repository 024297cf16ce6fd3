"""Symbolic-dim entry point, kept for existing callers: a thin wrapper over the one compile
path in :mod:`relax_memplan.compile` (deprecated: use
:func:`relax_memplan.compile.compile_model` with ``dim_ranges``)."""

from __future__ import annotations

from typing import Callable, Dict, Mapping, Optional, Sequence, Tuple

import numpy as np

from .compile import BuildOptions, CheckOptions, compile_model
from .compile.specs import parse_dim_spec, parse_values_spec
from .report.records import DynamicReport, ShapeMeasurement
from .transform.plan_dynamic_memory import PlanDynamicMemory
from .transform.plan_static_memory import PlanStaticMemory

__all__ = ["ShapeMeasurement", "DynamicReport", "parse_dim_spec", "parse_values_spec",
           "compile_onnx_dynamic"]


def compile_onnx_dynamic(
    model,
    dim_ranges: Mapping[str, Tuple[int, Optional[int]]],
    *,
    shapes: Optional[Mapping[str, Sequence[int]]] = None,
    strategy: str = "exact",
    plan_pass: Optional[PlanStaticMemory] = None,
    dynamic_pass: Optional[PlanDynamicMemory] = None,
    buckets: Optional[Mapping[str, Sequence[int]]] = None,
    size_classes: bool = False,
    size_class_growth: float = 4.0,
    dispatch: Optional[Mapping[str, Sequence[int]]] = None,
    schedule: bool = False,
    check_indices: bool = True,
    fusion: bool = True,
    sample_shapes: int = 3,
    measure: bool = True,
    verify: bool = False,
    input_values: Optional[Dict[str, np.ndarray]] = None,
    seed: int = 0,
    rtol: float = 1e-4,
    atol: float = 1e-5,
    prepare: bool = True,
    compare_with_tvm: bool = True,
    progress: Optional[Callable[[str], None]] = None,
    library_path=None,
):
    """Import with symbolic dims, build once with ``strategy``, measure at sampled shapes:
    :func:`relax_memplan.compile.compile_model` with ``dim_ranges``.

    Returns
    -------
    (executable, CompileReport)
    """
    options = BuildOptions(plan_pass=plan_pass, strategies=(strategy,), dynamic_pass=dynamic_pass,
                           buckets=dict(buckets or {}), size_classes=size_classes,
                           size_class_growth=size_class_growth, dispatch=dict(dispatch or {}),
                           schedule=schedule, check_indices=check_indices, fusion=fusion,
                           prepare=prepare,
                           compare_with_tvm=compare_with_tvm, library_path=library_path)
    check = CheckOptions(measure=measure, verify=verify, rtol=rtol, atol=atol, seed=seed,
                         sample_shapes=sample_shapes)
    result = compile_model(model, shapes, dim_ranges, options=options, check=check,
                           input_values=input_values, progress=progress)
    return result.executable, result.report
