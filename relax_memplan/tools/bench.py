"""Latency of our build, TVM's default build and onnxruntime on one model (``relax-memplan bench``).

The three run the same inputs in interleaved rounds (ours, TVM's, onnxruntime, then again),
so that a slow phase of the machine hits all of them; the first ``warmup`` rounds are not
counted. Both TVM builds use the same kernels (:func:`relax_memplan.compile.build`, which
differs only in the memory planner) and the VM's default pooled allocator; onnxruntime runs
with as many intra-op threads as TVM's thread pool (``tvm.runtime.num_threads()``, set by
``TVM_NUM_THREADS``), its profiler off. Times are wall-clock per call, in milliseconds.
"""

from __future__ import annotations

import dataclasses
import statistics
import time
from dataclasses import dataclass, field
from typing import Callable, Dict, List, Optional, Sequence

import numpy as np

__all__ = ["LatencyStats", "BenchResult", "bench_onnx"]


@dataclass
class LatencyStats:
    """Per-call times of one runner.

    Attributes
    ----------
    name : str
    times_ms : list of float
        One per counted call, in milliseconds.
    """

    name: str
    times_ms: List[float] = field(default_factory=list)

    @property
    def min_ms(self) -> float:
        """Fastest call."""
        return min(self.times_ms)

    @property
    def median_ms(self) -> float:
        """Median call."""
        return statistics.median(self.times_ms)

    @property
    def max_ms(self) -> float:
        """Slowest call."""
        return max(self.times_ms)


@dataclass
class BenchResult:
    """What :func:`bench_onnx` measured.

    Attributes
    ----------
    model : str
    input_shapes : dict of str to list of int
    threads : int
        TVM's thread pool size, also given to onnxruntime.
    repeat, warmup : int
    rows : list of LatencyStats
        Ours, TVM's default, onnxruntime (when run), in that order.
    notes : list of str
    """

    model: str
    input_shapes: Dict[str, List[int]]
    threads: int
    repeat: int
    warmup: int
    rows: List[LatencyStats] = field(default_factory=list)
    notes: List[str] = field(default_factory=list)

    def to_dict(self) -> Dict:
        """JSON-ready dict: each row with its min/median/max and every time."""
        return {"model": self.model, "input_shapes": self.input_shapes, "threads": self.threads,
                "repeat": self.repeat, "warmup": self.warmup, "notes": list(self.notes),
                "rows": [{"name": r.name, "min_ms": r.min_ms, "median_ms": r.median_ms,
                          "max_ms": r.max_ms, "times_ms": list(r.times_ms)} for r in self.rows]}

    def format_text(self) -> str:
        """A table, one row per runner, with the median relative to the first row."""
        shapes = ", ".join(f"{n}{tuple(s)}" for n, s in self.input_shapes.items())
        lines = [f"model: {self.model}", f"inputs: {shapes}",
                 f"{self.repeat} timed calls each after {self.warmup} warm-up, interleaved; "
                 f"{self.threads} thread(s)", ""]
        width = max(len(r.name) for r in self.rows)
        lines.append(f"{'build':<{width}}  {'min ms':>9}  {'median ms':>9}  {'max ms':>9}  "
                     f"{'median / ours':>13}")
        base = self.rows[0].median_ms
        for r in self.rows:
            ratio = r.median_ms / base if base > 0 else float("nan")
            lines.append(f"{r.name:<{width}}  {r.min_ms:9.3f}  {r.median_ms:9.3f}  "
                         f"{r.max_ms:9.3f}  {ratio:13.2f}")
        lines += [f"note: {n}" for n in self.notes]
        return "\n".join(lines)


def _vm_runner(executable, arrays: Sequence[np.ndarray]) -> Callable[[], None]:
    import tvm
    from tvm import relax

    dev = tvm.cpu()
    vm = relax.VirtualMachine(executable, dev)
    args = [tvm.runtime.tensor(np.asarray(x, order="C"), dev) for x in arrays]
    main = vm["main"]
    return lambda: main(*args)


def _ort_runner(onnx_model, feed: Dict[str, np.ndarray], threads: int) -> Callable[[], None]:
    import onnxruntime

    from ..errors import ReferenceRunError
    from ..frontend.reference import _ort_message

    options = onnxruntime.SessionOptions()
    options.log_severity_level = 3
    options.intra_op_num_threads = threads
    options.inter_op_num_threads = 1
    options.enable_profiling = False
    try:
        session = onnxruntime.InferenceSession(onnx_model.SerializeToString(), sess_options=options,
                                               providers=["CPUExecutionProvider"])
    except Exception as err:  # onnxruntime's own error types; one clear line
        raise ReferenceRunError(f"onnxruntime cannot load the model: {_ort_message(err)}") from None
    return lambda: session.run(None, feed)


def bench_onnx(
    model=None,
    shapes: Optional[Dict[str, Sequence[int]]] = None,
    *,
    repeat: int = 20,
    warmup: int = 3,
    plan_pass=None,
    reorder_pass=None,
    reorder: bool = True,
    onnxruntime: bool = True,
    input_values: Optional[Dict[str, np.ndarray]] = None,
    seed: int = 0,
    prepare: bool = True,
    schedule: bool = True,
    cpu: str = "host",
    check_indices: bool = True,
    fusion: bool = True,
    fusion_conv_chain: str = "auto",
    progress: Optional[Callable[[str], None]] = None,
) -> BenchResult:
    """Time our build, TVM's default build and onnxruntime on one model, interleaved.

    Parameters
    ----------
    model : onnx.ModelProto or path, optional
        ``None``: the built-in example (:func:`relax_memplan.frontend.examples.example_cnn`).
    shapes : dict of str to sequence of int, optional
        Full input shapes (as ``--shape``); they must fix every symbolic dim of the model.
    repeat : int
        Timed calls per runner (>= 1).
    warmup : int
        Calls per runner before timing (>= 0).
    plan_pass : PlanStaticMemory, optional
        Our configured planner; default: the CLI's
        (:func:`relax_memplan.compile.default_planner_passes`: in-place writes and
        concatenation in place on).
    reorder_pass : ReorderForMemory, optional
        A configured memory-aware binding order for our build.
    reorder : bool
        Without ``reorder_pass``: reorder with a default ``ReorderForMemory`` (as the CLI),
        or keep the importer's order (``False``).
    onnxruntime : bool
        Also time onnxruntime (needs the package).
    input_values : dict of str to numpy.ndarray, optional
        Values for some inputs instead of random data.
    seed : int
        Seed of the random inputs.
    prepare : bool
        Run the ONNX preparation steps before import.
    schedule : bool
        Our CPU schedules in both TVM builds (default; ``False``: TVM's unscheduled kernels).
    cpu : str
        The CPU both builds are compiled for (``host``, ``portable`` or an LLVM CPU name:
        :func:`relax_memplan.targets.resolve_cpu`).
    check_indices : bool
        Run-time index checks in both TVM builds.
    fusion : bool
        Our graph-level fusion (:func:`relax_memplan.pipeline.fusion_passes`) in both TVM
        builds (``False``: TVM's FuseOps/FuseTIR alone).
    fusion_conv_chain : {"auto", "memory", "off"}
        Which conv chains the fusion fuses (:data:`~relax_memplan.pipeline.CONV_CHAIN_MODES`).
    progress : callable, optional
        Called with ``(message)`` before each phase.

    Returns
    -------
    BenchResult

    Raises
    ------
    ValueError
        ``repeat < 1`` or ``warmup < 0``.
    ModelLoadError, ShapeSpecError, CompileError, ReferenceRunError
        As :func:`relax_memplan.compile.compile_model`; ``UndeclaredDimError`` (a
        ``ShapeSpecError``) for a symbolic dim that ``shapes`` leaves free, before the import.
    RunError
        A call failed (one line: which runner, the input shapes, the reason).
    """
    import tvm

    from .. import frontend
    from ..compile import build, default_planner_passes
    from ..compile.model import model_name
    from ..compile.shapes import check_dims_up_front
    from ..targets import make_target
    from ..errors import RunError, summarize_error
    from ..frontend.examples import example_cnn
    from ..frontend.prepare import STEP_NAMES
    from ..pipeline import PipelineOptions, PipelinePasses, fusion_passes

    if repeat < 1 or warmup < 0:
        raise ValueError(f"repeat must be >= 1 and warmup >= 0, got {repeat} and {warmup}")
    say = progress or (lambda _m: None)
    name = model_name(model)
    onnx_model = (example_cnn() if model is None
                  else model if hasattr(model, "graph") else frontend.load_onnx(model))
    check_dims_up_front(onnx_model, shapes, {}, command="bench")  # no size guessed
    say(f"importing {name}")
    mod, info = frontend.import_onnx(onnx_model, shapes, prepare_steps=STEP_NAMES if prepare else ())
    feed = frontend.make_random_inputs(onnx_model, info, seed=seed, values=input_values)
    arrays = list(feed.values())
    default_plan, default_reorder = default_planner_passes(reorder=reorder)
    plan_pass = plan_pass if plan_pass is not None else default_plan
    reorder_pass = reorder_pass if reorder_pass is not None else default_reorder
    say("building with relax_memplan's planner")
    target = make_target("llvm", cpu=cpu)
    options = PipelineOptions(schedule=schedule, check_indices=check_indices, fusion=fusion,
                              fusion_conv_chain=fusion_conv_chain)

    def passes():  # a fresh list per build: the passes keep what they did
        return fusion_passes(tvm.target.Target(target), fusion_conv_chain, schedule) \
            if fusion else None

    ours = build(mod, target, options, PipelinePasses(plan=plan_pass, reorder=reorder_pass,
                                                      fusion=passes()))
    say("building with TVM's default planner (same kernels)")
    theirs = build(mod, target, dataclasses.replace(options, planner="tvm"),
                   PipelinePasses(fusion=passes()))
    threads = tvm.runtime.num_threads()
    shapes_text = ", ".join(f"{n}{tuple(s)}" for n, s in info.input_shapes.items())
    runners = [("relax_memplan", _vm_runner(ours, arrays)),
               ("TVM default", _vm_runner(theirs, arrays))]
    if onnxruntime:
        runners.append(("onnxruntime", _ort_runner(onnx_model, feed, threads)))
    result = BenchResult(model=name, input_shapes={n: list(s) for n, s in info.input_shapes.items()},
                         threads=threads, repeat=repeat, warmup=warmup,
                         rows=[LatencyStats(n) for n, _ in runners],
                         notes=[n for n in info.notes if n.split(":")[0] not in STEP_NAMES])
    say(f"running {warmup} + {repeat} interleaved rounds")
    for round_index in range(warmup + repeat):
        for row, (_, call) in zip(result.rows, runners):
            start = time.perf_counter()
            try:
                call()
            except Exception as err:  # noqa: BLE001 - TVM/onnxruntime raise many types
                raise RunError(f"running {row.name} on inputs {shapes_text} failed: "
                               f"{summarize_error(err)}") from None
            elapsed_ms = (time.perf_counter() - start) * 1e3
            if round_index >= warmup:
                row.times_ms.append(elapsed_ms)
    return result
