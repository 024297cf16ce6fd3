"""Run bert-tiny and the built-in example on a CUDA GPU: our planner against TVM's, side by side.

Each case is built twice for CUDA (our pipeline, and the same pipeline with TVM's
``StaticPlanBlockMemory`` alone), then run on ``tvm.cuda(0)`` through
``relax.VirtualMachine``:

* numerics: max abs error against onnxruntime on the CPU, same inputs;
* device bytes: every ``vm.builtin.alloc_storage`` counted by an instrument hook
  (naive allocator, :func:`relax_memplan.runtime.run_and_measure`), as on the CPU;
* time: median ms per call of ``vm.time_evaluator`` (pooled allocator, the VM default;
  it synchronizes the device).

Cases: the built-in example CNN, bert-tiny at batch 1 seq 16, and bert-tiny compiled once
with ``batch`` in [1, 4] and ``seq`` in [1, 128] symbolic (our ``exact`` plan against TVM's
planner given the same ranges), run at two shapes; ``attention``: our fused attention kernel
on bert-tiny and gpt2-tiny, fused against unfused against onnxruntime, relative error
<= 1e-4 (see ``benchmarks/gpu_attention.py``); ``layernorm``: our fused residual add +
layer norm kernel (``FuseAddLayerNorm``, dlight-scheduled for CUDA) alone at BERT-base's hidden
size (1024 rows x 768) against numpy, and gpt2-tiny built with our fusion passes
for CUDA against onnxruntime (there its 6 linear layers are folded out of their reshapes; no
add + layer norm pair is fused on CUDA: 3 have their sum read again, which the CUDA kernel does
not write, and 2 sit in matmul epilogues). Prints a table and writes JSON to
``benchmarks/results/gpu_check.json``. A few minutes on a GPU host.

Without a GPU (``tvm.cuda(0).exist`` is False) it prints a message and exits 0;
``--build-only`` then still builds every case (CUDA source only; nothing runs), which is
how it is checked on a CPU machine.

The CUDA kernels are compiled when the module is built on a GPU host, by TVM's
``tvm_callback_cuda_compile``: NVRTC by default (needs ``pip install cuda-bindings``), or
nvcc with ``TVM_CUDA_COMPILE_MODE=nvcc``; this script picks nvcc when the bindings are
missing and nvcc is on the PATH.

Usage: python benchmarks/gpu_check.py [--models DIR] [--json PATH] [--arch sm_90]
       [--cases example,bert,bert-dynamic,attention,layernorm] [--cuda-graph] [--build-only]
       [--attention-models bert-tiny,gpt2-tiny]

Each case runs in its own ``try``: a failure is printed as a ``FAILED`` line and the other
cases still run.

Exit status: 0 done (or no GPU); 3 an error above tolerance (whatever else happened);
else 1 a build or run failed.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Dict, List, Optional, Tuple

import numpy as np
import tvm
from tvm import relax

from relax_memplan import frontend
from relax_memplan.analysis.dims import evaluate_int
from relax_memplan.compile import build, max_abs_error
from relax_memplan.compile.build import choose_cuda_compiler
from relax_memplan.targets import make_target
from relax_memplan.errors import RelaxMemplanError
from relax_memplan.frontend.examples import example_cnn
from relax_memplan.frontend.prepare import STEP_NAMES
from relax_memplan.pipeline import PipelineOptions, PipelinePasses, fusion_counts, fusion_passes
from relax_memplan.runtime import run_and_measure
from relax_memplan.transform.plan_dynamic_memory import PlanDynamicMemory
from relax_memplan.transform.plan_static_memory import PlanStaticMemory
from relax_memplan.transform.record_storage import RecordStorage

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(Path(__file__).resolve().parent))  # gpu_attention, next to this file
from gpu_attention import MODELS as ATTENTION_MODELS  # noqa: E402
from gpu_attention import AttentionRow, check_attention, format_attention  # noqa: E402
DEFAULT_JSON = REPO / "benchmarks" / "results" / "gpu_check.json"
BERT_FILE = "bert-tiny-randw.onnx"
BERT_INPUTS = ("input_ids", "attention_mask", "token_type_ids")
GPT2_FILE = "gpt2-tiny-randw.onnx"
PLANNERS = ("relax_memplan", "tvm")

# GPU float math (erf, exp, reduction order) differs from onnxruntime's CPU kernels more
# than our CPU builds do: max|out - ref| <= RTOL * max|ref| + ATOL.
RTOL = 1e-3
ATOL = 1e-4
EXIT_FAILED = 1
EXIT_ABOVE_TOLERANCE = 3


@dataclass(frozen=True)
class Case:
    """One model and the shapes it is run at.

    ``shapes`` fixes the inputs at import (a static build); ``dim_ranges`` keeps the
    model's dims symbolic with these ranges and ``run_dims`` lists the dims to run at.
    """

    name: str
    model_file: Optional[str]  # in --models; None: the built-in example
    shapes: Optional[Dict[str, Tuple[int, ...]]] = None
    dim_ranges: Optional[Dict[str, Tuple[int, int]]] = None
    run_dims: Tuple[Dict[str, int], ...] = ()
    fusion: bool = False  # build with our fusion passes (both planners)


CASES = {
    "example": Case("built-in example", None),
    "bert": Case("bert-tiny b1 s16", BERT_FILE, shapes={n: (1, 16) for n in BERT_INPUTS}),
    "bert-dynamic": Case("bert-tiny b1..4 s1..128", BERT_FILE,
                         dim_ranges={"batch": (1, 4), "seq": (1, 128)},
                         run_dims=({"batch": 1, "seq": 16}, {"batch": 4, "seq": 128})),
    "layernorm": Case("gpt2-tiny fused b1 s16", GPT2_FILE, shapes={"input_ids": (1, 16)},
                      fusion=True),
}
ATTENTION = "attention"  # its own rows (benchmarks/gpu_attention.py)


@dataclass
class Row:
    """One build of one case at one shape (bytes in bytes, time in milliseconds)."""

    case: str
    planner: str
    dims: Dict[str, int] = field(default_factory=dict)
    build_s: float = 0.0
    planned_bytes: Optional[int] = None  # ours: arena at these dims; TVM: its static plan
    lower_bound_bytes: Optional[int] = None
    runtime_alloc_bytes: Optional[int] = None
    runtime_num_allocs: Optional[int] = None
    median_ms: Optional[float] = None
    max_abs_error: Optional[float] = None
    error_tolerance: Optional[float] = None
    error: Optional[str] = None

    @property
    def verified(self) -> Optional[bool]:
        if self.max_abs_error is None or self.error_tolerance is None:
            return None
        return self.max_abs_error <= self.error_tolerance




def _arch(target: tvm.target.Target) -> str:
    return str(target.attrs.get("arch", target.kind.name))


def _input_shapes(mod: tvm.IRModule, dims: Dict[str, int]) -> Dict[str, Tuple[int, ...]]:
    return {p.name: tuple(d if isinstance(d, int) else evaluate_int(d, dims) for d in p.ty.shape)
            for p in mod["main"].params}


def _build_case(case: Case, models_dir: Path, target, cuda_graph: bool, say):
    """Import and build both ways: (onnx model, module, info, {planner: (executable, planning
    passes, seconds)})."""
    onnx_model = example_cnn() if case.model_file is None else frontend.load_onnx(
        models_dir / case.model_file)
    dynamic = case.dim_ranges is not None
    mod, info = frontend.import_onnx(onnx_model, case.shapes, keep_dynamic=dynamic,
                                     prepare_steps=STEP_NAMES)
    builds = {}
    for planner in PLANNERS:
        say(f"{case.name}: building for {_arch(target)} with {planner}'s planner")
        plan = PlanStaticMemory() if planner == "relax_memplan" else None
        dyn = PlanDynamicMemory(strategy="exact") if planner == "relax_memplan" and dynamic else None
        record = RecordStorage()
        t0 = time.perf_counter()
        options = PipelineOptions(planner=planner, fusion=case.fusion,
                                  dim_ranges=case.dim_ranges if dynamic else {})
        passes = PipelinePasses(plan=plan, dynamic=dyn, record=record,
                                fusion=fusion_passes(target) if case.fusion else None)
        config = {"relax.backend.use_cuda_graph": cuda_graph}
        with tvm.transform.PassContext(config=config):
            ex = build(mod, target, options, passes)
        if case.fusion:
            say(f"{case.name}: fused {fusion_counts(passes.fusion)}")
        builds[planner] = (ex, plan, dyn, record, time.perf_counter() - t0)
    return onnx_model, mod, info, builds


def _planned_bytes(planner, plan, dyn, record, dims) -> Tuple[Optional[int], Optional[int]]:
    """(bytes of the static plan at ``dims``, lower bound) for the report."""
    if dyn is not None and "main" in dyn.plans and dyn.plans["main"].planned:
        arena, lower, _ = dyn.plans["main"].bytes_at(dims)
        return arena, lower
    if planner == "relax_memplan" and plan is not None and "main" in plan.plans:
        return plan.plans["main"].arena_bytes, plan.plans["main"].lower_bound_bytes
    summary = record.summaries.get("main")
    return (summary.planned_bytes if summary else None), None


def _run(row: Row, ex, arrays, reference, dev, number: int, repeat: int) -> None:
    measured = run_and_measure(ex, arrays, device=dev)
    row.runtime_alloc_bytes, row.runtime_num_allocs = measured.alloc_bytes, measured.num_allocs
    row.max_abs_error = max_abs_error(measured.outputs, reference)
    ref_max = max((float(np.max(np.abs(r))) for r in reference if np.asarray(r).size), default=0.0)
    row.error_tolerance = RTOL * ref_max + ATOL
    tvm.get_global_func("vm.builtin.memory_manager.clear")()
    vm = relax.VirtualMachine(ex, dev)
    args = [tvm.runtime.tensor(np.asarray(x, order="C"), dev) for x in arrays]
    timer = vm.time_evaluator("main", dev, number=number, repeat=repeat, min_repeat_ms=50)
    row.median_ms = timer(*args).median * 1e3


def check_case(case: Case, models_dir: Path, target, dev, run: bool, number: int, repeat: int,
               say, cuda_graph: bool = False) -> List[Row]:
    """Build ``case`` both ways and, when ``run``, run and measure each build at each shape."""
    try:
        onnx_model, mod, info, builds = _build_case(case, models_dir, target, cuda_graph, say)
    except RelaxMemplanError as err:  # build() turns any TVM failure into CompileError
        return [Row(case.name, p, error=f"build failed: {err}") for p in PLANNERS]
    rows = []
    for dims in case.run_dims or ({},):
        shapes = _input_shapes(mod, dims)
        feed = arrays = reference = None
        if run:
            point = dataclasses.replace(info, input_shapes={n: shapes.get(n, s)
                                                            for n, s in info.input_shapes.items()})
            feed = frontend.make_random_inputs(onnx_model, point, seed=0)
            arrays = list(feed.values())
            reference = frontend.run_onnxruntime(onnx_model, feed)
        for planner in PLANNERS:
            ex, plan, dyn, record, seconds = builds[planner]
            row = Row(case.name, planner, dict(dims), build_s=round(seconds, 2))
            row.planned_bytes, row.lower_bound_bytes = _planned_bytes(planner, plan, dyn, record, dims)
            if run:
                say(f"{case.name}: running {planner}'s build at {dims or 'its shapes'}")
                try:
                    _run(row, ex, arrays, reference, dev, number, repeat)
                except (RelaxMemplanError, RuntimeError, ValueError, TypeError) as err:
                    row.error = f"run failed: {' '.join(str(err).split())[:300]}"
            rows.append(row)
    return rows


LN_ROWS, LN_HIDDEN = 1024, 768  # BERT-base batch 8 x seq 128 rows, hidden 768


def _residual_layer_norm_module() -> tvm.IRModule:
    """``layer_norm(p + q)`` over (rows, hidden): one fused kernel."""
    bb = relax.BlockBuilder()
    tensor = relax.TensorType((LN_ROWS, LN_HIDDEN), "float32")
    vec = relax.TensorType((LN_HIDDEN,), "float32")
    p, q = relax.Var("p", tensor), relax.Var("q", tensor)
    g, b = relax.Var("g", vec), relax.Var("b", vec)
    with bb.function("main", [p, q, g, b]):
        with bb.dataflow():
            total = bb.emit(relax.op.add(p, q))
            y = bb.emit(relax.op.nn.layer_norm(total, g, b, axes=[-1], epsilon=1e-5))
            out = bb.emit_output(y)
        bb.emit_func_output(out)
    return bb.get()


def check_layernorm_kernel(target, dev, run: bool, number: int, repeat: int, say) -> Row:
    """The fused add + layer norm kernel alone, against numpy (float64)."""
    row = Row(f"add+LN kernel {LN_ROWS}x{LN_HIDDEN}", "relax_memplan")
    passes = fusion_passes(target)
    say(f"{row.case}: building for {_arch(target)}")
    t0 = time.perf_counter()
    ex = build(_residual_layer_norm_module(), target, PipelineOptions(),
               PipelinePasses(plan=PlanStaticMemory(), fusion=passes))
    row.build_s = round(time.perf_counter() - t0, 2)
    if fusion_counts(passes).get("add_layer_norm") != 1:
        raise RelaxMemplanError(f"the add + layer norm was not fused: {fusion_counts(passes)}")
    if not run:
        return row
    rng = np.random.default_rng(0)
    p, q = (rng.standard_normal((LN_ROWS, LN_HIDDEN)).astype("float32") + 2 for _ in range(2))
    g, b = (rng.standard_normal(LN_HIDDEN).astype("float32") for _ in range(2))
    x = p.astype("float64") + q
    ref = (x - x.mean(-1, keepdims=True)) / np.sqrt(x.var(-1, keepdims=True) + 1e-5) * g + b
    vm = relax.VirtualMachine(ex, dev)
    args = [tvm.runtime.tensor(a, dev) for a in (p, q, g, b)]
    y = vm["main"](*args).numpy()
    row.max_abs_error = float(np.max(np.abs(y - ref)))
    row.error_tolerance = RTOL * float(np.max(np.abs(ref))) + ATOL
    timer = vm.time_evaluator("main", dev, number=number, repeat=repeat, min_repeat_ms=50)
    row.median_ms = timer(*args).median * 1e3
    return row


#: Checks beyond the model cases, run with a case key: key -> function(target, dev, run,
#: number, repeat, say) returning rows.
EXTRA_CHECKS = {
    "layernorm": lambda *a: [check_layernorm_kernel(*a)],
}


def _run_case(key, case, models_dir, target, dev, run, args, say) -> List[Row]:
    """One case's rows; any exception becomes a row with a FAILED error (the others go on)."""
    parts = [(case.name, lambda: check_case(case, models_dir, target, dev, run, args.number,
                                            args.repeat, say, cuda_graph=args.cuda_graph))]
    if key in EXTRA_CHECKS:
        parts.insert(0, (key, lambda: EXTRA_CHECKS[key](target, dev, run, args.number,
                                                        args.repeat, say)))
    rows: List[Row] = []
    for name, part in parts:
        try:
            rows += part()
        except Exception as err:  # noqa: BLE001 - one check failing must not stop the others
            message = " ".join(str(err).split())[:300]
            print(f"FAILED {name}: {type(err).__name__}: {message}", flush=True)
            rows.append(Row(name, "-", error=f"FAILED: {type(err).__name__}: {message}"))
    return rows


def _fmt(n, spec=",") -> str:
    return "-" if n is None else format(n, spec)


def format_table(rows: List[Row]) -> str:
    header = (f"{'case':<24}{'planner':<15}{'dims':<18}{'LB':>11}{'planned':>11}{'run bytes':>12}"
              f"{'allocs':>7}{'ms':>9}{'max err':>10}  ok")
    lines = [header, "-" * len(header)]
    for r in rows:
        dims = ",".join(f"{k}={v}" for k, v in r.dims.items()) or "static"
        ok = {True: "yes", False: "NO", None: "-"}[r.verified]
        lines.append(f"{r.case:<24}{r.planner:<15}{dims:<18}{_fmt(r.lower_bound_bytes):>11}"
                     f"{_fmt(r.planned_bytes):>11}{_fmt(r.runtime_alloc_bytes):>12}"
                     f"{_fmt(r.runtime_num_allocs, 'd'):>7}{_fmt(r.median_ms, '.3f'):>9}"
                     f"{_fmt(r.max_abs_error, '.2g'):>10}  {ok}")
        if r.error:
            lines.append(f"    FAILED: {r.case} {r.planner}: {r.error}")
    return "\n".join(lines)


def _run_cases(args, models_dir: Path, target, dev, run: bool, say, notes: List[str]):
    """(rows of the model cases, rows of the attention case), each case in its own try."""
    rows: List[Row] = []
    attention_rows = []
    for key in args.cases.split(","):
        if key == ATTENTION:
            try:
                attention_rows = check_attention(models_dir, target, dev, run, say,
                                                 models=args.attention_models.split(","))
            except Exception as err:  # noqa: BLE001
                attention_rows = [AttentionRow(ATTENTION, "-", 0,
                                               error=f"{type(err).__name__}: {err}")]
            continue
        case = CASES[key]
        if case.model_file is not None and not (models_dir / case.model_file).exists():
            notes.append(f"{case.name}: skipped, {models_dir / case.model_file} not found")
            say(notes[-1])
            continue
        rows += _run_case(key, case, models_dir, target, dev, run, args, say)
    return rows, attention_rows


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--models", default=str(REPO.parent / "shared" / "models"),
                        help="folder holding bert-tiny-randw.onnx")
    parser.add_argument("--json", help=f"where to write the results (default {DEFAULT_JSON} "
                        "after a GPU run; --build-only writes only when this is given)")
    parser.add_argument("--arch", help="CUDA arch, e.g. sm_90 (default: GPU 0's, or sm_80 "
                        "with --build-only and no GPU)")
    parser.add_argument("--cases", default=",".join(list(CASES) + [ATTENTION]),
                        help=f"comma-separated, from {', '.join(CASES)}, {ATTENTION}")
    parser.add_argument("--attention-models", default=",".join(ATTENTION_MODELS),
                        help="models of the attention case")
    parser.add_argument("--build-only", action="store_true",
                        help="build every case but run nothing (works without a GPU)")
    parser.add_argument("--cuda-graph", action="store_true",
                        help="build with relax.backend.use_cuda_graph (RewriteCUDAGraph captures "
                        "the static kernel sequences; both planners)")
    parser.add_argument("--number", type=int, default=20, help="calls per timed repeat")
    parser.add_argument("--repeat", type=int, default=5, help="timed repeats (median taken)")
    args = parser.parse_args(argv)
    unknown = [c for c in args.cases.split(",") if c not in CASES and c != ATTENTION]
    unknown += [m for m in args.attention_models.split(",") if m not in ATTENTION_MODELS]
    if unknown:
        parser.error(f"unknown case(s) or model(s) {unknown}; choose cases from "
                     f"{list(CASES) + [ATTENTION]}, models from {list(ATTENTION_MODELS)}")
    dev = tvm.cuda(0)
    run = not args.build_only
    if run and not dev.exist:
        print("gpu_check: no CUDA GPU here (tvm.cuda(0).exist is False): nothing measured. "
              "Run it on a GPU host, or use --build-only to check the builds.")
        return 0
    say = lambda msg: print(f"[gpu_check] {msg}", file=sys.stderr, flush=True)  # noqa: E731
    notes = []
    if run:
        try:
            note = choose_cuda_compiler()
        except RelaxMemplanError as err:
            print(f"gpu_check: error: {err}", file=sys.stderr)
            return EXIT_FAILED
        if note:
            notes.append(note)
            say(note)
    try:
        target = make_target("cuda", args.arch)  # given, else GPU 0's, else sm_80
    except RelaxMemplanError as err:
        print(f"gpu_check: error: {err}", file=sys.stderr)
        return EXIT_FAILED
    rows, attention_rows = _run_cases(args, Path(args.models), target, dev, run, say, notes)
    print(f"device: {dev.device_name if dev.exist else 'none (build only)'}; "
          f"target {_arch(target)}; cuda graph {'on' if args.cuda_graph else 'off'}; "
          f"tolerance {RTOL} * max|ref| + {ATOL}")
    print(format_table(rows))
    if attention_rows:
        print("\nfused attention (rel err = max|out - ref| / max|ref| <= 1e-4 for fused builds;"
              " ms per main call, kernels synced one by one)")
        print(format_attention(attention_rows))
    for note in notes:
        print(f"note: {note}")
    out = Path(args.json) if args.json else (DEFAULT_JSON if run else None)
    if out is not None:
        out.parent.mkdir(parents=True, exist_ok=True)
        payload = {
            "device": dev.device_name if dev.exist else None,
            "target": str(target),
            "tvm_version": tvm.__version__,
            "build_only": not run,
            "cuda_graph": args.cuda_graph,
            "rtol": RTOL,
            "atol": ATOL,
            "notes": notes,
            "rows": [dict(dataclasses.asdict(r), verified=r.verified) for r in rows],
            "attention_rows": [dict(dataclasses.asdict(r), verified=r.verified)
                               for r in attention_rows],
        }
        out.write_text(json.dumps(payload, indent=2) + "\n", encoding="utf-8")
        print(f"written {out}")
    if any(r.verified is False for r in rows + attention_rows):
        return EXIT_ABOVE_TOLERANCE
    if any(r.error for r in rows + attention_rows):
        return EXIT_FAILED
    return 0


if __name__ == "__main__":
    sys.exit(main())
