"""Where the fixed per-call time of small models goes: kernels, VM builtins, the rest.

For each model (default: mnist-8 and silero-vad, whose kernels take microseconds), our build
(``get_pipeline(host_target(), schedule=True)``, as in latency_bench.py) and onnxruntime are
timed in interleaved rounds (median wall time of one call, same thread count). Then one
instrumented run (the VM's instrument hook, :func:`relax_memplan.runtime.kernel_profile` with
``include_builtins=True``) splits a call into:

* compiled kernels (count and time);
* each ``vm.builtin.*`` call kind (allocation of storage and tensors, ``ensure_zero_offset``
  views, shape checks and matches, tuple/attribute access): count and time;
* the hook's own cost: a call with a hook that does nothing, minus the plain call, per
  packed call (two Python callbacks each).

The instrumented times include that hook cost (it is larger than most builtins), so they are
shown as shares of the instrumented total, beside the exact counts; the plain call time is
the figure to compare with onnxruntime.

Usage: TVM_NUM_THREADS=2 python benchmarks/overhead_bench.py [--only mnist-8 silero-vad]
       [--rounds 300] [--json benchmarks/results/overhead.json]
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))  # measure this checkout, not another installed copy
sys.path.insert(0, str(REPO / "benchmarks"))

from latency_bench import MODELS_DIR, _ort_runner, model_files  # noqa: E402


def _median_ms(run, rounds: int) -> float:
    values = []
    for _ in range(rounds):
        t0 = time.perf_counter()
        run()
        values.append(time.perf_counter() - t0)
    return statistics.median(values) * 1e3


def bench_model(label, path, shapes, values, threads: int, rounds: int) -> dict:
    import tvm
    from tvm import relax

    from relax_memplan.frontend import import_onnx, make_random_inputs
    from relax_memplan.pipeline import get_pipeline
    from relax_memplan.runtime import kernel_profile
    from relax_memplan.schedules import host_target

    mod, info = import_onnx(path, shapes)
    feeds = make_random_inputs(path, info, values=values)
    target = host_target()
    ex = tvm.compile(mod, target, relax_pipeline=get_pipeline(target, schedule=True))
    vm = relax.VirtualMachine(ex, tvm.cpu())
    args = [tvm.runtime.tensor(a) for a in feeds.values()]
    ort_run, _ = _ort_runner(path, feeds, threads)
    ours_run = lambda: vm["main"](*args)  # noqa: E731
    ours_run(), ort_run()
    ours_ms, ort_ms = [], []
    for _ in range(5):  # interleaved blocks of rounds
        ours_ms.append(_median_ms(ours_run, rounds // 5))
        ort_ms.append(_median_ms(ort_run, rounds // 5))
    profile = kernel_profile(vm, args, rounds=rounds // 5, merge_numbered=False,
                             include_builtins=True)
    vm.set_instrument(lambda *_a: 0)
    hooked_ms = _median_ms(ours_run, rounds // 5)
    vm.set_instrument(None)
    builtins = {k: v for k, v in profile.items() if k.startswith("vm.builtin.")}
    kernels = {k: v for k, v in profile.items() if k not in builtins}
    kernel_ms = sum(s for s, _n in kernels.values()) * 1e3
    builtin_ms = sum(s for s, _n in builtins.values()) * 1e3
    calls = sum(n for _s, n in profile.values())
    call_ms = statistics.median(ours_ms)
    return {"model": label, "threads": threads, "ours_ms": call_ms,
            "ort_ms": statistics.median(ort_ms), "ours_ms_blocks": ours_ms, "ort_ms_blocks": ort_ms,
            "kernels": {"count": sum(n for _s, n in kernels.values()), "ms": kernel_ms},
            "builtins": {k: {"count": n, "ms": s * 1e3} for k, (s, n) in
                         sorted(builtins.items(), key=lambda kv: -kv[1][0])},
            "builtin_ms": builtin_ms,
            "hook_ms_per_packed_call": (hooked_ms - call_ms) / calls if calls else None}


def _print(row) -> None:
    ratio = row["ours_ms"] / row["ort_ms"]
    whole = row["kernels"]["ms"] + row["builtin_ms"]
    print(f"\n{row['model']} ({row['threads']} threads): ours {row['ours_ms']:.4f} ms "
          f"(blocks {min(row['ours_ms_blocks']):.4f}-{max(row['ours_ms_blocks']):.4f}), "
          f"onnxruntime {row['ort_ms']:.4f} ms "
          f"({min(row['ort_ms_blocks']):.4f}-{max(row['ort_ms_blocks']):.4f}), ours/ort {ratio:.2f}")
    print(f"  instrumented: hook cost ~{row['hook_ms_per_packed_call'] * 1e3:.2f} us per packed "
          "call; shares of the instrumented time:")
    print(f"  kernels   {row['kernels']['count']:>5.0f} calls {100 * row['kernels']['ms'] / whole:>5.1f} %")
    print(f"  builtins  {sum(b['count'] for b in row['builtins'].values()):>5.0f} calls "
          f"{100 * row['builtin_ms'] / whole:>5.1f} %")
    for name, b in row["builtins"].items():
        print(f"    {name:<40}{b['count']:>5.0f} {100 * b['ms'] / whole:>5.1f} %")


def main(argv=None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--models", default=str(MODELS_DIR))
    parser.add_argument("--only", nargs="*", default=["mnist-8", "silero-vad"])
    parser.add_argument("--rounds", type=int, default=300)
    parser.add_argument("--json", default=str(REPO / "benchmarks" / "results" / "overhead.json"))
    args = parser.parse_args(argv)
    os.environ.setdefault("TVM_THREAD_POOL_SPIN_COUNT", "0")  # as latency_bench.py
    threads = int(os.environ.get("TVM_NUM_THREADS", "0") or 0)
    if threads <= 0:
        raise SystemExit("set TVM_NUM_THREADS (onnxruntime gets the same thread count)")
    rows = []
    for label, path, shapes, values in model_files(args.models, args.only):
        rows.append(bench_model(label, path, shapes, values, threads, args.rounds))
        _print(rows[-1])
    Path(args.json).parent.mkdir(parents=True, exist_ok=True)
    Path(args.json).write_text(json.dumps({"rounds": args.rounds, "models": rows}, indent=1))
    print(f"\nwrote {args.json}")


if __name__ == "__main__":
    main()
