"""Kernels with sigmoid / tanh in our scheduled build: time per kernel and error vs onnxruntime.

For each model with ``Sigmoid`` / ``Tanh`` nodes (yolov8n's SiLU, silero's LSTM gates, magika's
and gpt2-tiny's tanh GELU) at the fixed shapes of ``latency_bench.py``: our build
(``get_pipeline(host_target(), schedule=True)``, so ``FastBoundedMath``) is timed per kernel with
the VM's instrument hook; printed are the kernels whose name holds ``sigmoid`` or ``tanh`` and
their sum (ms per call, mean of ``--repeats`` calls), the whole call's kernel time, and the
largest absolute difference of the outputs from onnxruntime's. Run it in two checkouts to compare
two implementations of the pass (the numbers of one run are one checkout's).

``--clock thread`` (the default) times kernels in CPU time of the calling thread, immune to other
processes on a shared machine; it needs ``TVM_NUM_THREADS=1`` (work done in other threads is not
counted), which the script sets.

Usage: python benchmarks/fast_math_bench.py [--only yolov8n magika] [--repeats 5] [--json PATH]
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from pathlib import Path

import numpy as np

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))
sys.path.insert(0, str(REPO / "benchmarks"))
MODELS = ("yolov8n", "silero-vad", "magika", "gpt2-tiny")
MARKERS = ("sigmoid", "tanh")


def bench(label, path, shapes, values, repeats, clock):
    import tvm
    from tvm import relax

    from relax_memplan.frontend import import_onnx, make_random_inputs
    from relax_memplan.pipeline import get_pipeline
    from relax_memplan.runtime import kernel_profile, to_numpy_list
    from relax_memplan.schedules import host_target
    from latency_bench import _ort_runner

    mod, info = import_onnx(path, shapes)
    feeds = make_random_inputs(path, info, values=values)
    target = host_target()
    t0 = time.perf_counter()
    ex = tvm.compile(mod, target, relax_pipeline=get_pipeline(target, schedule=True))
    compile_s = time.perf_counter() - t0
    vm = relax.VirtualMachine(ex, tvm.cpu())
    args = [tvm.runtime.tensor(a) for a in feeds.values()]
    got = to_numpy_list(vm["main"](*args))
    want = _ort_runner(path, feeds, 1)[0]()
    err = max(float(np.max(np.abs(g.astype("float64") - w.astype("float64")))) if g.size else 0.0
              for g, w in zip(got, want))
    profile = kernel_profile(vm, args, rounds=repeats, merge_numbered=False, clock=clock)
    marked = {k: s * 1e3 for k, (s, _n) in profile.items() if any(m in k for m in MARKERS)}
    return {"model": label, "compile_s": compile_s, "max_abs_err_vs_ort": err,
            "kernels_ms": sum(s for s, _n in profile.values()) * 1e3,
            "sigmoid_tanh_kernels_ms": sum(marked.values()),
            "sigmoid_tanh_kernels": dict(sorted(marked.items(), key=lambda kv: -kv[1]))}


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--only", nargs="*", default=list(MODELS))
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--clock", choices=("thread", "wall"), default="thread")
    parser.add_argument("--json", type=Path,
                        default=REPO / "benchmarks" / "results" / "fast_math.json")
    args = parser.parse_args(argv)
    if args.clock == "thread":
        os.environ["TVM_NUM_THREADS"] = "1"
    from latency_bench import MODELS_DIR, model_files

    clock = time.thread_time if args.clock == "thread" else time.perf_counter
    rows = []
    for label, path, shapes, values in model_files(MODELS_DIR, args.only):
        row = bench(label, path, shapes, values, args.repeats, clock)
        rows.append(row)
        print(f"{label:12s} kernels {row['kernels_ms']:9.2f} ms, sigmoid/tanh kernels "
              f"{row['sigmoid_tanh_kernels_ms']:8.2f} ms, max |err| vs ORT "
              f"{row['max_abs_err_vs_ort']:.2e}, compile {row['compile_s']:.0f} s", flush=True)
        for name, ms in list(row["sigmoid_tanh_kernels"].items())[:5]:
            print(f"    {ms:8.3f} ms  {name}")
    args.json.parent.mkdir(parents=True, exist_ok=True)
    args.json.write_text(json.dumps({"clock": args.clock, "repeats": args.repeats,
                                     "rows": rows}, indent=1) + "\n", encoding="utf-8")
    print(f"written {args.json}")


if __name__ == "__main__":
    main()
