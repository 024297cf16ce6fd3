"""Fixed-shape entry points, kept for existing callers: thin wrappers over the one compile
path in :mod:`relax_memplan.compile` (a fixed shape is the one-shape case).

New code: :func:`relax_memplan.compile.compile_model`.
"""

from __future__ import annotations

from typing import Dict, Optional, Sequence, Union

import numpy as np
import tvm

from .compile import (BuildOptions, CheckOptions, CompileResult, build, compile_and_measure,
                      compile_model, export_library, max_abs_error, reference_sensitivity)
from .compile.measure import ModelSource
from .transform.plan_static_memory import PlanStaticMemory

__all__ = ["CompileResult", "build", "compile_module", "compile_onnx", "export_library",
           "max_abs_error", "reference_sensitivity"]


def compile_module(
    mod: tvm.IRModule,
    inputs: Optional[Sequence[np.ndarray]] = None,
    *,
    target: Union[str, tvm.target.Target] = "llvm",
    plan_pass: Optional[PlanStaticMemory] = None,
    reference: Optional[Sequence[np.ndarray]] = None,
    rtol: float = 1e-4,
    atol: float = 1e-5,
    name: str = "module",
    notes: Sequence[str] = (),
    compare_with_tvm: bool = True,
    dump_dir=None,
    progress=None,
    schedule: bool = False,
    check_indices: bool = True,
    fusion: bool = True,
    library_path=None,
) -> CompileResult:
    """Build a fixed-shape Relax module with our pipeline (and TVM's), run it on ``inputs``
    when given (CPU targets), compare with ``reference`` when given, report memory.

    The arguments are those of :class:`~relax_memplan.compile.BuildOptions` and
    :class:`~relax_memplan.compile.CheckOptions`; ``name`` and ``notes`` go into the report.

    Raises
    ------
    CompileError, RelaxMemplanError, RunError, VerificationError
        As :func:`relax_memplan.compile.compile_strategies`.
    """
    options = BuildOptions(target=target, plan_pass=plan_pass, compare_with_tvm=compare_with_tvm,
                           dump_dir=dump_dir, schedule=schedule, check_indices=check_indices,
                           fusion=fusion,
                           library_path=library_path)
    check = CheckOptions(measure=inputs is not None, verify=reference is not None and
                         inputs is not None, rtol=rtol, atol=atol)
    source = ModelSource(mod=mod, name=name, notes=list(notes), given=inputs,
                         given_reference=reference)
    results = compile_and_measure(source, {}, [{}], options, check,
                                  progress or (lambda _msg: None))
    return results["static"]


def compile_onnx(
    model=None,
    shapes: Optional[Dict[str, Sequence[int]]] = None,
    *,
    target: Union[str, tvm.target.Target] = "llvm",
    plan_pass: Optional[PlanStaticMemory] = None,
    verify: bool = False,
    measure: bool = True,
    input_values: Optional[Dict[str, np.ndarray]] = None,
    seed: int = 0,
    rtol: float = 1e-4,
    atol: float = 1e-5,
    dump_dir=None,
    progress=None,
    prepare: bool = True,
    schedule: bool = False,
    check_indices: bool = True,
    fusion: bool = True,
    library_path=None,
) -> CompileResult:
    """Import an ONNX model with fixed shapes, compile, run, verify and report:
    :func:`relax_memplan.compile.compile_model` without dim ranges.

    ``shapes`` fixes the dynamic dims, all of them (a dim left free raises
    :class:`~relax_memplan.errors.UndeclaredDimError`); the other arguments are those of
    :class:`~relax_memplan.compile.BuildOptions` and :class:`~relax_memplan.compile.CheckOptions`.
    """
    options = BuildOptions(target=target, plan_pass=plan_pass, dump_dir=dump_dir,
                           prepare=prepare, schedule=schedule, check_indices=check_indices,
                           fusion=fusion,
                           library_path=library_path)
    check = CheckOptions(measure=measure, verify=verify, rtol=rtol, atol=atol, seed=seed)
    return compile_model(model, shapes, None, options=options, check=check,
                         input_values=input_values, progress=progress)
