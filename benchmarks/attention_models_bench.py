"""Attention fusion on the full-size transformers: blocks fused, lower bound, latency, numerics.

For each model (``<dir>/<name>.onnx`` with its ``.inputs.npz``, as
``shared/models/full_size/export.py`` and ``benchmarks/export_transformers.py`` write them):

* ``fused_static`` / ``fused_dynamic``: attention blocks FuseAttention fuses (of its
  candidates) at the inputs' shapes and with the symbolic ``batch``/``seq`` kept
  (``FoldConstantsFirst`` and the fusion passes before it, no code generation);
* per build (``fusion`` off / on; our pipeline, TVM's default build -- plain ``llvm``, no CPU
  schedules -- each in a fresh process): the lower bound of ``main`` (peak live bytes of our
  plan), latency (median of ``--runs`` calls after a warm-up, ``TVM_NUM_THREADS`` as set,
  default 2) and the max abs error against onnxruntime relative to its largest output.

Processes run in turn, fusion off then on per model, so a drift of the shared machine's load
hits both. Writes JSON (``--json``) and prints a table.

Usage: python benchmarks/attention_models_bench.py [--models DIR/NAME[@SEQ][:bound],...]
[--runs 10] [--json PATH]; ``@SEQ`` sets the sequence length of a text model
(``bert_base@512``); ``:bound`` builds the default pipeline for the lower bounds only and runs
(numerics, latency) our CPU-scheduled build on the host target instead: the unscheduled build
takes minutes per call at such lengths on the shared machine.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import time
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
DEFAULT = ("/tmp/full_size/bert_base,/tmp/full_size/bert_base@512:bound,/tmp/full_size/gpt2,"
           "/tmp/full_size/vit_b_16,/tmp/full_size/whisper_tiny_encoder,"
           "/tmp/full_size/bert_base_legacy")


def _inputs(spec):
    import numpy as np

    path, _, seq = spec.split(":")[0].partition("@")
    feeds = dict(np.load(f"{path}.inputs.npz"))
    if seq:
        rng = np.random.default_rng(0)
        feeds = {n: (rng.integers(0, 1000, (v.shape[0], int(seq))).astype(v.dtype)
                     if n == "input_ids" else np.ones((v.shape[0], int(seq)), v.dtype)
                     if n == "attention_mask" else np.zeros((v.shape[0], int(seq)), v.dtype))
                 for n, v in feeds.items()}
    return f"{path}.onnx", feeds


def fused_counts(spec) -> dict:
    """FuseAttention's record at static shapes and with symbolic dims."""
    import tvm

    from relax_memplan.frontend import import_onnx
    from relax_memplan.transform.clamp_empty_slices import ClampEmptySlices
    from relax_memplan.transform.fold_constants_first import FoldConstantsFirst
    from relax_memplan.transform.fold_matmul_reshape import FoldMatmulReshape
    from relax_memplan.transform.fuse_attention import FuseAttention
    from relax_memplan.transform.remove_dropout import RemoveDropout

    path, feeds = _inputs(spec)
    out = {}
    for key, shapes, dynamic in (("static", {n: v.shape for n, v in feeds.items()}, False),
                                 ("dynamic", None, True)):
        try:
            mod, _ = import_onnx(path, shapes, keep_dynamic=dynamic)
        except Exception as err:  # noqa: BLE001 - a row, not a crash: the import's own error
            out[key] = f"import failed: {str(err)[:160]}"
            continue
        fuse = FuseAttention()
        tvm.transform.Sequential([ClampEmptySlices(), FoldConstantsFirst(), FoldMatmulReshape(),
                                  RemoveDropout(), fuse])(mod)
        out[key] = fuse.records[0].summary()
    return out


def one_build(spec, fusion: bool, runs: int, schedule: bool = False) -> dict:
    """Build with fusion on or off, run, time and check (called in a fresh process);
    ``runs=0``: build only."""
    import numpy as np
    import tvm
    from tvm import relax

    from relax_memplan.compile import build
    from relax_memplan.frontend import import_onnx, run_onnxruntime
    from relax_memplan.pipeline import PipelineOptions, PipelinePasses
    from relax_memplan.transform.plan_static_memory import PlanStaticMemory

    path, feeds = _inputs(spec)
    mod, _ = import_onnx(path, {n: v.shape for n, v in feeds.items()})
    plan = PlanStaticMemory(time_limit_s=1.0)
    start = time.perf_counter()
    from relax_memplan.schedules import host_target

    target = host_target() if schedule else "llvm"
    ex = build(mod, target, PipelineOptions(fusion=fusion, schedule=schedule),
               PipelinePasses(plan=plan))
    compile_s = time.perf_counter() - start
    row = {"fusion": fusion, "schedule": schedule,
           "lower_bound_bytes": plan.plans["main"].lower_bound_bytes,
           "compile_s": round(compile_s, 1)}
    if not runs:
        return row
    vm = relax.VirtualMachine(ex, tvm.cpu())
    args = [tvm.runtime.tensor(v) for v in feeds.values()]
    got = vm["main"](*args)
    got = [x.numpy() for x in (got if isinstance(got, tvm.ir.Array) else [got])]
    times = []
    for _ in range(runs):
        t0 = time.perf_counter()
        vm["main"](*args)
        times.append(time.perf_counter() - t0)
    ref = run_onnxruntime(path, feeds)
    err = max(float(np.abs(g - r).max() / max(np.abs(r).max(), 1e-6)) for g, r in zip(got, ref))
    return dict(row, ms_median=round(1e3 * statistics.median(times), 2),
                ms_min=round(1e3 * min(times), 2), rel_err_vs_ort=err)


def _child(spec, fusion, runs, schedule=False):
    cmd = [sys.executable, __file__, "--child", spec, "--fusion", str(int(fusion)),
           "--runs", str(runs)] + (["--schedule"] if schedule else [])
    env = dict(os.environ, PYTHONPATH=str(REPO))
    env.setdefault("TVM_NUM_THREADS", "2")
    done = subprocess.run(cmd, env=env, capture_output=True, text=True, check=False)
    lines = [x for x in done.stdout.splitlines() if x.startswith("{")]
    if done.returncode or not lines:
        return {"fusion": fusion, "error": (done.stderr.strip().splitlines() or ["?"])[-1][:300]}
    return json.loads(lines[-1])


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--models", default=DEFAULT)
    parser.add_argument("--runs", type=int, default=10)
    parser.add_argument("--json", default=str(REPO / "benchmarks" / "results" /
                                              "attention_models.json"))
    parser.add_argument("--child", help=argparse.SUPPRESS)
    parser.add_argument("--fusion", type=int, default=1, help=argparse.SUPPRESS)
    parser.add_argument("--schedule", action="store_true", help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    sys.path.insert(0, str(REPO))
    if args.child:
        print(json.dumps(one_build(args.child, bool(args.fusion), args.runs, args.schedule)))
        return 0
    rows = []
    for spec in args.models.split(","):
        row = {"model": Path(spec).name.replace(":bound", ""), "threads": os.environ.get("TVM_NUM_THREADS", "2"),
               "load_avg_1min": round(os.getloadavg()[0], 1), **fused_counts(spec)}
        bound_only = spec.endswith(":bound")
        row["builds"] = [_child(spec, fusion, 0 if bound_only else args.runs)
                         for fusion in (False, True)]
        if bound_only:
            row["builds"] += [_child(spec, fusion, args.runs, schedule=True)
                              for fusion in (False, True)]
        plain, fused = row["builds"][:2]
        if "error" not in plain and "error" not in fused:
            row["lower_bound_ratio"] = round(fused["lower_bound_bytes"]
                                             / plain["lower_bound_bytes"], 3)
        timed = row["builds"][-2:]
        if all("ms_median" in b for b in timed):
            row["latency_ratio"] = round(timed[1]["ms_median"] / timed[0]["ms_median"], 3)
            row["latency_build"] = "schedule (host target)" if bound_only else "default (llvm)"
        rows.append(row)
        print(json.dumps(row), flush=True)
    out = Path(args.json)
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps({"rows": rows}, indent=1) + "\n")
    print(f"wrote {out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
