"""Our graph-level fusion vs TVM's FuseOps alone: kernels per call, lower bound, time, error.

Each model is imported with fixed shapes (batch 1, seq 128 by default) and built twice with the
same pipeline (our planner), ``fusion=False`` (TVM's FuseOps/FuseTIR alone) and
``fusion=True`` (:func:`relax_memplan.pipeline.fusion_passes` first). For each build:

* kernels per call: the packed calls one ``main`` call makes that are not ``vm.builtin.*``
  (counted by the VM's instrument hook);
* the lower bound of ``main``: the peak of live bytes at any step, in importer order, without
  in-place reuse (:class:`~relax_memplan.transform.PlanStaticMemory`), and our arena;
* median wall time of one call (``--repeat`` calls after ``--warmup``), the two builds
  interleaved so machine noise hits both;
* the max error relative to max|onnxruntime output|.

Reading the numbers (bert-tiny and gpt2-tiny, seq 128): 12 kernels fewer per call (per layer the
7 attention kernels, three of them transposes, become 1). The lower bound does not move at seq 128:
the peak of live bytes sits in the feed-forward block ((seq, 512) intermediate), not at the
(1, 2, seq, seq) score tensors the fusion removes; it moves where seq^2 * heads outgrows
seq * 4 * hidden. Wall times on the shared 2-core machine vary run to run by up to 2x: compare
the ratio within one run only.

Usage: python benchmarks/fusion_bench.py [--seq 128] [--schedule] [--json PATH]
"""

from __future__ import annotations

import argparse
import json
import time
from pathlib import Path

import numpy as np
import tvm
from tvm import relax

from relax_memplan.compiler import build
from relax_memplan.frontend import import_onnx, make_random_inputs, run_onnxruntime
from relax_memplan.transform.plan_static_memory import PlanStaticMemory

REPO = Path(__file__).resolve().parent.parent
MODELS = {"bert-tiny": "bert-tiny-randw.onnx", "gpt2-tiny": "gpt2-tiny-randw.onnx"}


def _kernels_per_call(vm, args) -> int:
    names = []

    def hook(_func, name, before_run, _ret, *_args):
        if before_run and not name.startswith("vm.builtin."):
            names.append(name)
        return 0

    vm.set_instrument(hook)
    vm["main"](*args)
    vm.set_instrument(lambda *_a: 0)
    return len(names)


def _median_call_s(vm, args, repeat: int) -> float:
    times = []
    for _ in range(repeat):
        t0 = time.perf_counter()
        vm["main"](*args)
        times.append(time.perf_counter() - t0)
    return float(np.median(times))


def bench_model(label: str, path: Path, seq: int, schedule: bool, repeat: int, warmup: int):
    probe, _ = import_onnx(path, keep_dynamic=True)
    names = [p.name for p in probe["main"].params]
    mod, info = import_onnx(path, {n: (1, seq) for n in names})
    feed = make_random_inputs(path, info, seed=0)
    expected = run_onnxruntime(path, feed)[0]
    args = [tvm.runtime.tensor(x) for x in feed.values()]
    builds = {}
    for fusion in (False, True):
        plan = PlanStaticMemory()
        ex = build(mod, "llvm", "relax_memplan", plan, None, fusion=fusion, schedule=schedule)
        vm = relax.VirtualMachine(ex, tvm.cpu())
        got = vm["main"](*args)
        got = (got[0] if isinstance(got, tvm.ir.Array) else got).numpy()
        main = plan.plans["main"]
        builds[fusion] = {
            "vm": vm,
            "row": {
                "kernels_per_call": _kernels_per_call(vm, args),
                "lower_bound_bytes": main.lower_bound_bytes,
                "arena_bytes": main.arena_bytes,
                "max_rel_error": float(np.abs(got - expected).max() / np.abs(expected).max()),
            },
        }
    for b in builds.values():
        for _ in range(warmup):
            b["vm"]["main"](*args)
    samples = {False: [], True: []}
    for _ in range(5):  # interleaved rounds
        for fusion, b in builds.items():
            samples[fusion].append(_median_call_s(b["vm"], args, max(1, repeat // 5)))
    for fusion, b in builds.items():
        b["row"]["median_call_ms"] = round(1e3 * float(np.median(samples[fusion])), 4)
    tvm_row, ours = builds[False]["row"], builds[True]["row"]
    return {"model": label, "seq": seq, "schedule": schedule, "fuseops_alone": tvm_row,
            "with_our_fusion": ours,
            "time_ratio": round(ours["median_call_ms"] / tvm_row["median_call_ms"], 3),
            "lower_bound_ratio": round(ours["lower_bound_bytes"] / tvm_row["lower_bound_bytes"], 3)}


def main(argv=None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--models", default=str(REPO.parent / "shared" / "models"))
    parser.add_argument("--seq", type=int, default=128)
    parser.add_argument("--schedule", action="store_true", help="our CPU matmul schedules too")
    parser.add_argument("--repeat", type=int, default=50)
    parser.add_argument("--warmup", type=int, default=5)
    parser.add_argument("--json", default=str(REPO / "benchmarks" / "results" / "fusion.json"))
    args = parser.parse_args(argv)
    rows = []
    print(f"{'model':<11}{'build':<14}{'kernels':>8}{'LB bytes':>11}{'arena':>11}"
          f"{'ms/call':>9}{'rel err':>9}")
    for label, file in MODELS.items():
        path = Path(args.models) / file
        if not path.exists():
            print(f"{label:<11} skipped: {path} not found")
            continue
        row = bench_model(label, path, args.seq, args.schedule, args.repeat, args.warmup)
        rows.append(row)
        for name in ("fuseops_alone", "with_our_fusion"):
            r = row[name]
            print(f"{label:<11}{name:<14}{r['kernels_per_call']:>8}{r['lower_bound_bytes']:>11,}"
                  f"{r['arena_bytes']:>11,}{r['median_call_ms']:>9.3f}{r['max_rel_error']:>9.1e}")
    out = Path(args.json)
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps({"rows": rows, "threads": tvm.runtime.num_threads()
                               if hasattr(tvm.runtime, "num_threads") else None}, indent=2) + "\n")
    print(f"wrote {out}")


if __name__ == "__main__":
    main()
