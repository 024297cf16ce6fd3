"""Run one generated graph three ways and classify the outcome.

The oracle is onnxruntime (CPUExecutionProvider). The graph is imported once with the
package's own :func:`~relax_memplan.frontend.import_onnx` (a symbolic leading dim kept
symbolic), then built with TVM's default pipeline (``planner="tvm", schedule=False,
fusion=False``) and with ours under one or more *variants* (in-place reuse, concat in place,
fusion on or off). A graph with a symbolic dim is built once per variant with the dim range
``[1, DIM_MAX]`` and called at several sizes in one VM (the pooled allocator reuses buffers
between calls). Outputs are compared with :func:`compare`.

Outcomes, most serious first: ``crash_ours`` (our build or run fails where TVM's does not),
``wrong`` (ours differs from onnxruntime while TVM's default agrees), ``crash_tvm`` (TVM's
default build fails), ``tvm_bug`` (TVM's default differs from onnxruntime too),
``import_error`` (the import fails; the error names the node), ``skipped`` (onnxruntime gives
NaN/Inf on every input draw), ``ok``.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Dict, List, Optional, Sequence

import numpy as np
import onnx

__all__ = ["OUTCOMES", "VARIANTS", "DIM_MAX", "Result", "compare", "run_graph", "pick_variants"]

OUTCOMES = ("ok", "wrong", "tvm_bug", "crash_ours", "crash_tvm", "import_error", "skipped")
"""The outcome classes."""

VARIANTS = {"default": {}, "inplace": {"inplace": True},
            "concat": {"concat_inplace": True}, "no_fusion": {"fusion": False},
            "all_inplace": {"inplace": True, "concat_inplace": True}}
"""Variant name -> settings of our build (``inplace``/``concat_inplace`` of the planners,
``fusion`` of the pipeline)."""

DIM_MAX = 8
"""Upper end of the symbolic dim's declared range."""

RTOL, ATOL = 1e-4, 1e-5
"""Tolerance of :func:`compare`: ``|a - e| <= ATOL * scale + RTOL * |e|`` elementwise, with
``scale = max(1, max |e|)`` (the output's magnitude: float32 rounding in a sum of large terms
leaves an absolute error proportional to the terms, visible on the output's near-zero
elements). The same tolerance holds for every op, reductions and matmuls included."""

_ORDER = ("crash_ours", "wrong", "crash_tvm", "tvm_bug", "ok")
_TRIES = 3


@dataclass
class Result:
    """What one graph gave.

    Attributes
    ----------
    outcome : str
        One of :data:`OUTCOMES`.
    detail : str
        The first failure's message ('' when ok).
    variant : str
        The variant of the first failure ('' when none).
    sizes : list of int
        Sizes of the leading dim the builds were called at.
    input_seed : int
        Seed of the input draw compared.
    """

    outcome: str
    detail: str = ""
    variant: str = ""
    sizes: List[int] = field(default_factory=list)
    input_seed: int = 0


def compare(actual: Sequence[np.ndarray], expected: Sequence[np.ndarray]) -> Optional[str]:
    """None when ``actual`` matches ``expected``, else what differs.

    Parameters
    ----------
    actual, expected : sequence of numpy.ndarray
        The outputs of the build under test and those of the oracle.

    Returns
    -------
    str or None
    """
    if len(actual) != len(expected):
        return f"{len(actual)} outputs, expected {len(expected)}"
    for k, (a, e) in enumerate(zip(actual, expected)):
        a, e = np.asarray(a), np.asarray(e)
        if a.shape != e.shape:
            return f"output {k}: shape {a.shape}, expected {e.shape}"
        scale = max(1.0, float(np.max(np.abs(e)))) if e.size else 1.0
        if not np.allclose(a, e, rtol=RTOL, atol=ATOL * scale):
            err = float(np.max(np.abs(a.astype(np.float64) - e)))
            return f"output {k}: max abs error {err:.3g} (scale {scale:.3g})"
    return None


def pick_variants(seed: int, count: int = 2) -> List[str]:
    """``default`` and ``count - 1`` other variants, chosen by ``seed`` (deterministic)."""
    others = sorted(set(VARIANTS) - {"default"})
    rng = np.random.default_rng(seed + 7919)
    return ["default"] + [others[int(i)] for i in rng.permutation(len(others))[:count - 1]]


def _inputs(model: onnx.ModelProto, lead: int, seed: int) -> Dict[str, np.ndarray]:
    rng = np.random.default_rng(seed)
    out = {}
    for vi in model.graph.input:
        dims = [d.dim_value if d.HasField("dim_value") else lead
                for d in vi.type.tensor_type.shape.dim]
        if vi.type.tensor_type.elem_type == onnx.TensorProto.BOOL:
            out[vi.name] = np.array(rng.random() < 0.5)
        else:
            out[vi.name] = rng.normal(0, 1, dims).astype(np.float32)
    return out


def _oracle(model, sizes, seed):
    """(input seed, {size: (inputs, outputs)}) with finite outputs, or None after _TRIES."""
    from ...frontend.reference import run_onnxruntime  # imports onnxruntime lazily

    for attempt in range(_TRIES):
        s = seed * _TRIES + attempt
        runs = {n: (_inputs(model, n, s + 1000 * n),) for n in sizes}
        runs = {n: (i[0], run_onnxruntime(model, i[0])) for n, i in runs.items()}
        if all(np.isfinite(o).all() for _, outs in runs.values() for o in outs):
            return s, runs
    return None


def _build(mod, symbolic: bool, ours: bool, settings: dict):
    import tvm

    from ...compile.build import compile_module
    from ...pipeline import get_pipeline
    from ...targets import make_target
    from ...transform.plan_dynamic_memory import PlanDynamicMemory
    from ...transform.plan_static_memory import PlanStaticMemory

    target = make_target("llvm")
    if not ours:
        pipe = get_pipeline(target, planner="tvm", schedule=False, fusion=False)
        return tvm.compile(mod, target, relax_pipeline=pipe)
    kwargs = {"fusion": settings.get("fusion", True),
              "plan_pass": PlanStaticMemory(time_limit_s=0.2,
                                            inplace=settings.get("inplace", False),
                                            concat_inplace=settings.get("concat_inplace", False))}
    if symbolic:
        from .generator import SYMBOLIC_DIM

        kwargs["dim_ranges"] = {SYMBOLIC_DIM: (1, DIM_MAX)}
        kwargs["dynamic_pass"] = PlanDynamicMemory(time_limit_s=0.2,
                                                   inplace=settings.get("inplace", False))
    return compile_module(mod, target, get_pipeline(target, **kwargs))


def _run_all(executable, runs) -> Dict[int, List[np.ndarray]]:
    """Outputs at each size, every call in one VM (pooled allocator)."""
    import tvm
    from tvm import relax

    from ...runtime.vm import to_numpy_list

    vm = relax.VirtualMachine(executable, tvm.cpu())
    return {n: to_numpy_list(vm["main"](*[tvm.runtime.tensor(np.asarray(v)) for v in
                                          inputs.values()])) for n, (inputs, _) in runs.items()}


def _check(mod, symbolic, ours, settings, runs) -> Optional[str]:
    """None, 'crash: ...' or 'wrong: ...' for one build over all sizes."""
    try:
        outputs = _run_all(_build(mod, symbolic, ours, settings), runs)
    except Exception as err:  # noqa: BLE001 - TVM raises many types; classified
        return "crash: " + " ".join(str(err).split())[:300]
    for n, got in outputs.items():
        diff = compare(got, runs[n][1])
        if diff is not None:
            return f"wrong at size {n}: {diff}"
    return None


def run_graph(model: onnx.ModelProto, seed: int, symbolic: bool, static_dim: int = 1,
              variants: Optional[Sequence[str]] = None, tvm_on_failure: bool = False) -> Result:
    """Run ``model`` with onnxruntime, TVM's default pipeline and ours; classify.

    Parameters
    ----------
    model : onnx.ModelProto
    seed : int
        Seeds the input draws and the size choice.
    symbolic : bool
        Whether the model's leading dim is symbolic (then 2-3 sizes are run in one VM).
    static_dim : int
        The leading dim's size when not symbolic.
    variants : sequence of str, optional
        Names of :data:`VARIANTS` to build; default :func:`pick_variants` of ``seed``.
    tvm_on_failure : bool
        Build TVM's default pipeline only when one of ours disagrees with onnxruntime (to
        classify it): about half the time per graph, for a sample that looks for our bugs
        only; a graph that TVM alone gets wrong then reads ``ok``.

    Returns
    -------
    Result
    """
    from ...errors import ReferenceRunError, RelaxMemplanError
    from ...frontend.importer import import_onnx

    rng = np.random.default_rng(seed)
    sizes = sorted({int(v) for v in rng.choice(range(1, DIM_MAX + 1), 3)}) if symbolic \
        else [static_dim]
    try:
        oracle = _oracle(model, sizes, seed)
    except ReferenceRunError as err:
        return Result("skipped", str(err), sizes=sizes)
    if oracle is None:
        return Result("skipped", "onnxruntime gives NaN/Inf on every input draw", sizes=sizes)
    input_seed, runs = oracle
    try:
        mod, _ = import_onnx(model, keep_dynamic=symbolic)
    except RelaxMemplanError as err:
        return Result("import_error", str(err), sizes=sizes, input_seed=input_seed)
    except Exception as err:  # noqa: BLE001 - not one of ours: still the import's failure
        return Result("import_error", f"{type(err).__name__}: {err}"[:300], sizes=sizes,
                      input_seed=input_seed)
    tvm_fault = None if tvm_on_failure else _check(mod, symbolic, False, {}, runs)
    faults = []
    for name in (variants if variants is not None else pick_variants(seed)):
        ours = _check(mod, symbolic, True, VARIANTS[name], runs)
        if ours is not None:
            faults.append((name, ours))
    if tvm_on_failure and faults:
        tvm_fault = _check(mod, symbolic, False, {}, runs)
    found = [(_classify(ours, tvm_fault), name, ours) for name, ours in faults]
    if tvm_fault is not None and not found:
        found.append(("crash_tvm" if tvm_fault.startswith("crash") else "tvm_bug", "tvm",
                      tvm_fault))
    if not found:
        return Result("ok", sizes=sizes, input_seed=input_seed)
    outcome, name, detail = min(found, key=lambda f: _ORDER.index(f[0]))
    return Result(outcome, detail, name, sizes, input_seed)


def _classify(ours: str, tvm_fault: Optional[str]) -> str:
    if tvm_fault is None:
        return "crash_ours" if ours.startswith("crash") else "wrong"
    return "crash_tvm" if tvm_fault.startswith("crash") else "tvm_bug"
