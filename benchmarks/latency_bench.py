"""Latency of real ONNX models: our scheduled build vs TVM's default pipeline vs onnxruntime.

For each model at fixed shapes, three runners are timed in the same process, in interleaved
rounds, with the same thread count (``TVM_NUM_THREADS`` and onnxruntime's
``intra_op_num_threads``):

* ``ours``: ``get_pipeline(host_target(), schedule=True)`` (our CPU schedules, host CPU);
* ``tvm``: ``get_pipeline("llvm", planner="tvm", fusion=False)`` (TVM's legalize/fuse pipeline, no
  schedules, TVM's memory planner);
* ``ort``: onnxruntime's CPUExecutionProvider, its idle workers not spinning (they would
  take the cores from the TVM runs interleaved with it). TVM's workers do not spin either
  (``TVM_THREAD_POOL_SPIN_COUNT=0`` unless ``--tvm-spin``): on a host shared with other jobs
  a spinning worker takes the core its partner needs to finish the parallel loop.

Reports median latency and spread (10th-90th percentile, in % of the median), the best
(least disturbed) call of each runner and their ratio, the
compile time of each build, the largest difference of our outputs from onnxruntime's, and,
for the model with the worst ours/ort ratio, the top kernels of our build by time (the VM's
instrument hook, ``vm.set_instrument``). For every model, its top-5 kernels by time beside the
same kernel (by name) in TVM's default build, flagged where ours is slower. Prints the tables
and writes JSON.

Usage: TVM_NUM_THREADS=2 python benchmarks/latency_bench.py [--threads 2] [--rounds 15]
       [--only squeezenet1.0 silero ...] [--json PATH]
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import time
from collections import defaultdict
from pathlib import Path

import numpy as np

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))  # measure this checkout, not another installed copy
MODELS_DIR = REPO.parent / "shared" / "models"  # ../shared beside the checkout

GENERATED = "generated:"
"""File prefix of a model built by this script (written to the temp folder)."""

# (label, file, shapes, fixed input values)
MODELS = [
    ("mnist-8", "mnist-8/model.onnx", None, None),
    ("squeezenet1.0", "squeezenet1.0-randw.onnx", {"data_0": (1, 3, 224, 224)}, None),
    ("mobilenetv2-tiny", "mobilenetv2-tiny.onnx", {"x": (1, 3, 96, 96)}, None),
    ("ultraface-320", "ultraface-rfb-320-opset9.onnx", None, None),
    ("silero-vad", "silero-vad-op18-ifless.onnx", {"input": (1, 512), "state": (2, 1, 128)},
     {"sr": np.array(16000, dtype=np.int64)}),
    ("magika", "magika-1.0.3.onnx", {"bytes": (1, 2048)}, None),
    ("ppocrv4-det", "ppocrv4-det.onnx", {"x": (1, 3, 320, 320)}, None),
    ("yolov8n", "yolov8n-nudenet-320n.onnx", {"images": (1, 3, 320, 320)}, None),
    ("bert-tiny", "bert-tiny-randw.onnx", {"input_ids": (1, 128), "attention_mask": (1, 128),
                                           "token_type_ids": (1, 128)}, None),
    ("gpt2-tiny", "gpt2-tiny-randw.onnx", {"input_ids": (1, 64)}, None),
    # generated (relax_memplan.frontend.recurrent_example): TVM's own importer has no LSTM converter,
    # so the tvm column is TVM's pipeline on our import (our LSTM kernel, TVM's planner)
    ("vad-lstm", GENERATED + "vad_lstm", {"feats": (1, 40, 256)},
     {"sr": np.array(16000, dtype=np.int64)}),
]


def _generated(file: str) -> Path:
    """Write a generated model (see ``MODELS``) and return its path."""
    import tempfile

    import onnx

    from relax_memplan.frontend.recurrent_example import vad_lstm_model

    builders = {"vad_lstm": vad_lstm_model}
    name = file[len(GENERATED):]
    path = Path(tempfile.gettempdir()) / "relax_memplan_bench" / f"{name}.onnx"
    path.parent.mkdir(parents=True, exist_ok=True)
    onnx.save(builders[name](), str(path))
    return path


def model_files(models_dir, only=None):
    """``(label, path, shapes, values)`` of each model of ``MODELS`` in ``only`` (in that order;
    all if empty) whose file exists (generated ones written first)."""
    by_label = {m[0]: m for m in MODELS}
    for label in (only or by_label):
        if label not in by_label:
            raise SystemExit(f"unknown model label {label!r}; known: {', '.join(by_label)}")
        _label, file, shapes, values = by_label[label]
        path = _generated(file) if file.startswith(GENERATED) else Path(models_dir) / file
        if path.exists():
            yield label, path, shapes, values


def _build(mod, target, pipeline):
    import tvm
    from tvm import relax

    t0 = time.perf_counter()
    ex = tvm.compile(mod, target, relax_pipeline=pipeline)
    seconds = time.perf_counter() - t0
    return relax.VirtualMachine(ex, tvm.cpu()), seconds


def _tvm_runner(vm, arrays):
    import tvm

    args = [tvm.runtime.tensor(a) for a in arrays]
    return lambda: vm["main"](*args)


def _ort_runner(path, feeds, threads):
    import onnxruntime as ort

    opts = ort.SessionOptions()
    opts.intra_op_num_threads = threads
    opts.inter_op_num_threads = 1
    # idle onnxruntime workers spin by default and take the cores from the TVM runs that
    # follow in the same process (2 threads on 2 cores: TVM's parallel kernels 10-100x slower)
    opts.add_session_config_entry("session.intra_op.allow_spinning", "0")
    sess = ort.InferenceSession(str(path), opts, providers=["CPUExecutionProvider"])
    return (lambda: sess.run(None, feeds)), sess


def _interleaved(runners: dict, rounds: int) -> dict:
    for run in runners.values():  # warm-up
        run()
    times = defaultdict(list)
    for _ in range(rounds):
        for name, run in runners.items():
            t0 = time.perf_counter()
            run()
            times[name].append(time.perf_counter() - t0)
    out = {}
    for name, values in times.items():
        med = statistics.median(values)
        p10, p90 = np.percentile(values, [10, 90])
        out[name] = {"median_ms": med * 1e3, "spread_pct": 100 * (p90 - p10) / med,
                     "min_ms": min(values) * 1e3}
    return out


def top_kernels(vm, arrays, count=5, repeats=5) -> list:
    """Per-kernel time of ``vm["main"]`` summed over ``repeats`` calls (VM instrument hook)."""
    import tvm

    from relax_memplan.runtime import kernel_profile

    args = [tvm.runtime.tensor(a) for a in arrays]
    vm["main"](*args)  # warm-up
    profile = kernel_profile(vm, args, rounds=repeats, merge_numbered=False,
                             include_builtins=True)
    whole = sum(s for s, _n in profile.values())
    ranked = sorted(profile.items(), key=lambda kv: -kv[1][0])[:count]
    return [{"kernel": k, "ms_per_run": s * 1e3, "share_pct": 100 * s / whole,
             "calls_per_run": int(n)} for k, (s, n) in ranked]


def kernel_ratios(ours_vm, tvm_vm, arrays, count=5, repeats=5) -> list:
    """Our top-``count`` compiled kernels by time beside the same kernel in TVM's default build.

    Kernels are matched by name (our ``*_prepacked`` kernels by the name before the suffix);
    ``tvm_ms`` is ``None`` where TVM's build has no kernel of that name (another fusion).
    """
    ours = [k for k in top_kernels(ours_vm, arrays, count=10 ** 6, repeats=repeats)
            if not k["kernel"].startswith("vm.")][:count]  # compiled kernels, not VM builtins
    base = {k["kernel"]: k for k in top_kernels(tvm_vm, arrays, count=10 ** 6, repeats=repeats)}
    rows = []
    for k in ours:
        name = k["kernel"].removesuffix("_prepacked")
        other = base.get(name)
        tvm_ms = other["ms_per_run"] if other else None
        rows.append({**k, "tvm_ms_per_run": tvm_ms,
                     "ours_over_tvm": k["ms_per_run"] / tvm_ms if tvm_ms else None})
    return rows


def bench_model(label, path, shapes, values, threads, rounds, generic_llvm=False) -> dict:
    import tvm

    from relax_memplan.frontend import import_onnx, make_random_inputs
    from relax_memplan.pipeline import get_pipeline
    from relax_memplan.runtime import to_numpy_list
    from relax_memplan.schedules import host_target

    mod, info = import_onnx(path, shapes)
    feeds = make_random_inputs(path, info, values=values)
    arrays = list(feeds.values())
    host = tvm.target.Target("llvm") if generic_llvm else host_target()
    ours, ours_s = _build(mod, host, get_pipeline(host, schedule=True))
    base, base_s = _build(mod, tvm.target.Target("llvm"),
                          get_pipeline(tvm.target.Target("llvm"), planner="tvm", fusion=False))
    ort_run, _ = _ort_runner(path, feeds, threads)
    ours_run, base_run = _tvm_runner(ours, arrays), _tvm_runner(base, arrays)
    want = ort_run()
    got = to_numpy_list(ours_run())
    err = max(float(np.max(np.abs(g.astype("float64") - w.astype("float64"))))
              if g.size else 0.0 for g, w in zip(got, want))
    timing = _interleaved({"ours": ours_run, "tvm": base_run, "ort": ort_run}, rounds)
    return {"model": label, "shapes": {k: list(v.shape) for k, v in feeds.items()},
            "compile_s": {"ours": ours_s, "tvm": base_s}, "max_abs_err_vs_ort": err,
            **{k: v for k, v in timing.items()},
            "top_kernels_vs_tvm": kernel_ratios(ours, base, arrays),
            "_vm": ours, "_arrays": arrays}


def _print_kernel_ratios(rows) -> None:
    """Per model, the top-5 kernels of ours against TVM's default build (slower ones flagged)."""
    print("\ntop-5 kernels of ours vs the same kernel in TVM's default build (ms per run):")
    for r in rows:
        for k in r.get("top_kernels_vs_tvm", []):
            tvm_ms, ratio = k["tvm_ms_per_run"], k["ours_over_tvm"]
            shown = f"{tvm_ms:>9.2f}{ratio:>7.2f}" if ratio else f"{'-':>9}{'-':>7}"
            flag = "  SLOWER" if ratio and ratio > 1.0 else ""
            print(f"  {r['model']:<17}{k['kernel'][:52]:<53}{k['ms_per_run']:>8.2f}{shown}{flag}")


def _row(r) -> str:
    o, t, x = r["ours"]["median_ms"], r["tvm"]["median_ms"], r["ort"]["median_ms"]
    return (f"{r['model']:<18}{o:>9.2f} ±{r['ours']['spread_pct']:>3.0f}%{t:>9.2f} "
            f"±{r['tvm']['spread_pct']:>3.0f}%{x:>8.2f} ±{r['ort']['spread_pct']:>3.0f}%"
            f"{o / x:>9.2f}{t / x:>9.2f}{r['compile_s']['ours']:>9.1f}"
            f"{r['compile_s']['tvm']:>8.1f}{r['max_abs_err_vs_ort']:>10.1e}")


def main(argv=None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--models", default=str(MODELS_DIR))
    parser.add_argument("--only", nargs="*", help="labels to run (default: all)")
    parser.add_argument("--threads", type=int, default=int(os.environ.get("TVM_NUM_THREADS", 2)))
    parser.add_argument("--rounds", type=int, default=15)
    parser.add_argument("--generic-llvm", action="store_true",
                        help="build ours for plain llvm instead of the host CPU (on a loaded "
                             "2-core machine the host-CPU build of vad-lstm took > 15 min)")
    parser.add_argument("--tvm-spin", action="store_true",
                        help="keep TVM's thread-pool workers spinning between parallel kernels "
                             "(default: TVM_THREAD_POOL_SPIN_COUNT=0, like onnxruntime's "
                             "allow_spinning=0 here; on a loaded host, squeezenet at 2 threads "
                             "ran 218 ms spinning vs 18 ms not)")
    parser.add_argument("--json", default=str(REPO / "benchmarks" / "results" / "latency.json"))
    args = parser.parse_args(argv)
    if not args.tvm_spin:  # read by TVM when its thread pool starts, at the first kernel
        os.environ.setdefault("TVM_THREAD_POOL_SPIN_COUNT", "0")
    if os.environ.get("TVM_NUM_THREADS") != str(args.threads):
        raise SystemExit(f"set TVM_NUM_THREADS={args.threads} before starting (TVM reads it "
                         "when its thread pool starts)")
    header = (f"{'model':<18}{'ours ms':>14}{'tvm ms':>14}{'ort ms':>13}{'ours/ort':>9}"
              f"{'tvm/ort':>9}{'build s':>9}{'tvm s':>8}{'max err':>10}")
    print(header)
    print("-" * len(header))
    rows = []
    for label, file, shapes, values in MODELS:
        if args.only and label not in args.only:
            continue
        path = _generated(file) if file.startswith(GENERATED) else Path(args.models) / file
        if not path.exists():
            print(f"{label:<18} skipped: {path} not found")
            continue
        try:
            row = bench_model(label, path, shapes, values, args.threads, args.rounds,
                              args.generic_llvm)
        except Exception as err:  # noqa: BLE001 -- one model failing must not stop the table
            print(f"{label:<18} FAILED: {type(err).__name__}: {str(err).splitlines()[-1][:120]}")
            rows.append({"model": label, "error": f"{type(err).__name__}: {err}"[:2000]})
            continue
        print(_row(row), flush=True)
        print(f"{'':<18}best of {args.rounds}: ours {row['ours']['min_ms']:.2f} ms, ort "
              f"{row['ort']['min_ms']:.2f} ms, ours/ort {row['ours']['min_ms'] / row['ort']['min_ms']:.2f}"
              " (the least disturbed call of each, on a loaded machine)", flush=True)
        rows.append(row)
    timed = [r for r in rows if "ours" in r]
    _print_kernel_ratios(timed)
    if timed:
        worst = max(timed, key=lambda r: r["ours"]["median_ms"] / r["ort"]["median_ms"])
        worst["top_kernels_ours"] = top_kernels(worst["_vm"], worst["_arrays"])
        print(f"\ntop kernels of ours on {worst['model']} (worst ours/ort):")
        for k in worst["top_kernels_ours"]:
            print(f"  {k['kernel']:<60}{k['ms_per_run']:>9.2f} ms{k['share_pct']:>6.1f}%"
                  f"  x{k['calls_per_run']}")
    for r in rows:
        r.pop("_vm", None)
        r.pop("_arrays", None)
    Path(args.json).parent.mkdir(parents=True, exist_ok=True)
    Path(args.json).write_text(json.dumps({"threads": args.threads, "rounds": args.rounds,
                                           "models": rows}, indent=1))
    print(f"\nwrote {args.json}")


if __name__ == "__main__":
    main()
