"""Per-kernel time of our scheduled build against TVM's default build, at 1 and 2 threads.

For each shared model at fixed shapes three builds are made in one process:

* ``ours``: ``get_pipeline(host_target(), schedule=True)`` (the latency_bench build);
* ``ours_llvm``: the same pipeline for plain ``llvm`` (TVM's default target flags);
* ``tvm``: ``get_pipeline("llvm", planner="tvm", fusion=False)`` (TVM's default build).

The top kernels of ``ours`` by time, and every other kernel where it is slower than ``tvm``, are
listed with the schedule rule that took it (the function attribute
``relax_memplan.schedule_rule``; ``-`` where no rule did) and its time per call of ``main`` in
the three builds (VM instrument hook, :func:`relax_memplan.runtime.kernel_profile`), the builds
timed in interleaved rounds (median over rounds; at one thread in CPU time of the calling thread,
``time.thread_time``, which other processes on a shared machine do not inflate; at more threads
in wall time, which they do). A kernel is matched across builds by name (``*_prepacked`` by the
name before the suffix); ``-`` where the other build has no kernel of that name (another
fusion). Each thread count runs in its own process (TVM reads ``TVM_NUM_THREADS`` once);
TVM's idle workers do not spin (``TVM_THREAD_POOL_SPIN_COUNT=0`` unless ``--tvm-spin``, as in
latency_bench.py). Kernels in a model's top 5 of ours by time are marked ``*``; the 1-minute
load average before and after each model is recorded (the machine may be shared).
Also prints each build's compile time (one build each: see compile_time_bench.py for that).

Usage: python benchmarks/fallback_bench.py [--threads 1 2] [--rounds 10] [--only gpt2-tiny ...]
       [--top 8] [--loss-ratio 1.1] [--json benchmarks/results/fallback_kernels.json]
       python benchmarks/fallback_bench.py --load a_1t.json b_2t.json   (tables side by side)
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))  # measure this checkout, not another installed copy
sys.path.insert(0, str(REPO / "benchmarks"))

from latency_bench import MODELS_DIR, model_files  # noqa: E402

RULE_ATTR = "relax_memplan.schedule_rule"


def _kernel_rules(record: dict):
    """A module pass that records ``{kernel: rule}`` of every PrimFunc into ``record``."""
    import tvm
    from tvm import tirx

    @tvm.transform.module_pass(opt_level=0, name="RecordRules")
    def _record(mod, _ctx):
        for gv, func in mod.functions_items():
            if isinstance(func, tirx.PrimFunc):
                attrs = func.attrs or {}
                rule = attrs[RULE_ATTR] if RULE_ATTR in attrs else (
                    "(pre-scheduled)" if attrs.get("tirx.is_scheduled", False) else "-")
                record[gv.name_hint] = str(rule)
        return mod
    return _record


def _builds(mod):
    """``{name: (vm, compile seconds, {kernel: rule})}`` for the three builds."""
    import tvm
    from tvm import relax

    from relax_memplan.pipeline import get_pipeline
    from relax_memplan.schedules import host_target

    llvm = tvm.target.Target("llvm")
    configs = [("tvm", llvm, get_pipeline(llvm, planner="tvm", fusion=False)),
               ("ours", host_target(), get_pipeline(host_target(), schedule=True)),
               ("ours_llvm", llvm, get_pipeline(llvm, schedule=True))]
    out = {}
    for name, target, pipeline in configs:
        rules = {}
        t0 = time.perf_counter()
        ex = tvm.compile(mod, target, relax_pipeline=tvm.transform.Sequential(
            [pipeline, _kernel_rules(rules)]))
        out[name] = (relax.VirtualMachine(ex, tvm.cpu()), time.perf_counter() - t0, rules)
    return out


def _profiles(vms: dict, arrays, rounds: int) -> dict:
    """``{build: {kernel: median ms per main call}}``, the builds interleaved round by round
    (the median over rounds: a round where another process took the core does not count)."""
    import statistics

    import tvm

    from relax_memplan.runtime import kernel_profile

    args = [tvm.runtime.tensor(a) for a in arrays]
    # one thread: CPU time of this thread (the kernels run in it), immune to other processes
    # taking the core; more threads: wall time
    clock = time.thread_time if os.environ.get("TVM_NUM_THREADS") == "1" else time.perf_counter
    samples = {name: {} for name in vms}
    for vm in vms.values():
        vm["main"](*args)  # warm-up
    for _ in range(rounds):
        for name, vm in vms.items():
            for k, (s, _n) in kernel_profile(vm, args, merge_numbered=False,
                                             clock=clock).items():
                samples[name].setdefault(k, []).append(s * 1e3)
    return {name: {k: statistics.median(v) for k, v in per.items()}
            for name, per in samples.items()}


LOSS_RATIO = 1.1
"""A kernel is flagged where ours takes more than this times TVM's time (``--loss-ratio``) ..."""
LOSS_MIN_MS = 0.005
"""... and at least this much more (ms per main call: timer resolution and hook cost)."""


def _loses(ours_ms, tvm_ms) -> bool:
    return tvm_ms is not None and ours_ms > LOSS_RATIO * tvm_ms and ours_ms - tvm_ms >= LOSS_MIN_MS


def bench_model(label, path, shapes, values, rounds, top) -> dict:
    from relax_memplan.frontend import import_onnx, make_random_inputs

    load_before = os.getloadavg()[0]
    mod, info = import_onnx(path, shapes)
    arrays = list(make_random_inputs(path, info, values=values).values())
    builds = _builds(mod)
    prof = _profiles({n: b[0] for n, b in builds.items()}, arrays, rounds)
    ranked = sorted(prof["ours"].items(), key=lambda kv: -kv[1])
    slower = [(k, ms) for k, ms in ranked[top:] if _loses(ms, prof["tvm"].get(
        k.removesuffix("_prepacked")))]
    rows = []
    for kernel, ms in ranked[:top] + slower:
        base = kernel.removesuffix("_prepacked")
        rows.append({"kernel": kernel, "rule": builds["ours"][2].get(kernel, "?"), "ours_ms": ms,
                     "top5": any(kernel == k for k, _ms in ranked[:5]),
                     "ours_llvm_ms": prof["ours_llvm"].get(kernel),
                     "tvm_ms": prof["tvm"].get(base)})
    return {"model": label, "load_1min": [load_before, os.getloadavg()[0]],
            "compile_s": {n: b[1] for n, b in builds.items()},
            "total_ms": {n: sum(p.values()) for n, p in prof.items()}, "kernels": rows}


def _worker(args) -> None:
    rows = []
    for label, path, shapes, values in model_files(args.models, args.only):
        try:
            rows.append(bench_model(label, path, shapes, values, args.rounds, args.top))
        except Exception as err:  # noqa: BLE001 -- one model failing must not stop the others
            rows.append({"model": label, "error": f"{type(err).__name__}: {err}"[:500]})
        print(json.dumps(rows[-1]), flush=True)  # one line per model: a partial run is kept


def _fmt(ms) -> str:
    return f"{ms:>8.3f}" if ms is not None else f"{'-':>8}"


def _ratio(a, b) -> str:
    return f"{a / b:>6.2f}" if a is not None and b else f"{'-':>6}"


def _mark(present: dict, kernel: str) -> str:
    """``*`` where ``kernel`` is in the top 5 of ours at any thread count."""
    return "*" if any(k.get("top5") for r in present.values() for k in r["kernels"]
                      if k["kernel"] == kernel) else " "


def _cells(rows, kernel) -> tuple:
    """The table cells of ``kernel`` in one thread count's ``rows``, and whether ours loses."""
    r = next((o for o in rows if o["kernel"] == kernel), None)
    if r is None:
        return f"{'':>38}", False
    return (_fmt(r["ours_ms"]) + " " + _fmt(r["ours_llvm_ms"]) + " " + _fmt(r["tvm_ms"])
            + _ratio(r["ours_ms"], r["tvm_ms"]) + _ratio(r["ours_llvm_ms"], r["tvm_ms"]),
            _loses(r["ours_ms"], r["tvm_ms"]))


def _print(by_threads: dict) -> None:
    threads = sorted(by_threads)
    by_label = {t: {r["model"]: r for r in by_threads[t] if "kernels" in r} for t in threads}
    print(f"median ms per main call; x = ours / tvm, xl = ours_llvm / tvm; top kernels of ours "
          f"(* = top 5), then any other where ours is slower; SLOWER: ours > {LOSS_RATIO} x tvm "
          f"and >= {LOSS_MIN_MS} ms more, at any thread count")
    head = "".join(f"{'ours' + str(t):>9}{'llvm' + str(t):>9}{'tvm' + str(t):>9}{'x':>6}"
                   f"{'xl':>6}" for t in threads)
    labels = list(dict.fromkeys(r["model"] for t in threads for r in by_threads[t]))
    for label in labels:
        present = {t: by_label[t][label] for t in threads if label in by_label[t]}
        if not present:
            errors = [r.get("error", "") for t in threads for r in by_threads[t]
                      if r["model"] == label]
            print(f"\n{label}: FAILED {errors[0][:150] if errors else ''}")
            continue
        totals = "  ".join(f"{t}t total ours {r['total_ms']['ours']:.2f} / llvm "
                           f"{r['total_ms']['ours_llvm']:.2f} / tvm {r['total_ms']['tvm']:.2f}"
                           + (" (load {:.1f}-{:.1f})".format(*r["load_1min"])
                              if "load_1min" in r else "")
                           for t, r in present.items())
        print(f"\n{label}  ({totals})")
        print(f"  {'kernel':<44}{'rule':<22}{head}")
        kernels = list(dict.fromkeys((k["kernel"], k["rule"]) for r in present.values()
                                     for k in r["kernels"]))
        for kernel, rule in kernels:
            cells = [_cells(present[t]["kernels"], kernel) if t in present else (f"{'':>38}", False)
                     for t in threads]
            print(f"{_mark(present, kernel)} {kernel[:43]:<44}{rule[:21]:<22}"
                  f"{''.join(c for c, _l in cells)}"
                  f"{'  SLOWER' if any(lost for _c, lost in cells) else ''}")


def main(argv=None) -> None:
    global LOSS_RATIO  # noqa: PLW0603 -- one setting for the worker and the table
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--models", default=str(MODELS_DIR))
    parser.add_argument("--only", nargs="*", help="labels to run (default: all)")
    parser.add_argument("--threads", type=int, nargs="+", default=[1, 2])
    parser.add_argument("--rounds", type=int, default=10)
    parser.add_argument("--top", type=int, default=8)
    parser.add_argument("--loss-ratio", type=float, default=LOSS_RATIO,
                        help="flag kernels where ours takes more than this times TVM's time")
    parser.add_argument("--tvm-spin", action="store_true",
                        help="keep TVM's idle workers spinning (default: "
                             "TVM_THREAD_POOL_SPIN_COUNT=0, as latency_bench.py)")
    parser.add_argument("--load", nargs="*", help="print the tables of earlier JSON files "
                        "(e.g. one per thread count) side by side instead of measuring")
    parser.add_argument("--worker", action="store_true", help=argparse.SUPPRESS)
    parser.add_argument("--json", default=str(REPO / "benchmarks" / "results"
                                              / "fallback_kernels.json"))
    args = parser.parse_args(argv)
    LOSS_RATIO = args.loss_ratio
    if args.worker:
        _worker(args)
        return
    by_threads = {}
    if args.load:
        for path in args.load:
            for t, rows in json.loads(Path(path).read_text())["by_threads"].items():
                by_threads[int(t)] = rows
        _print(by_threads)
        return
    for t in args.threads:
        cmd = [sys.executable, __file__, "--worker", "--rounds", str(args.rounds),
               "--top", str(args.top), "--models", args.models,
               "--loss-ratio", str(args.loss_ratio)]
        if args.only:
            cmd += ["--only", *args.only]
        env = dict(os.environ, TVM_NUM_THREADS=str(t))
        if not args.tvm_spin:  # read by TVM when its thread pool starts
            env.setdefault("TVM_THREAD_POOL_SPIN_COUNT", "0")
        proc = subprocess.run(cmd, env=env, text=True,
                              stdout=subprocess.PIPE, check=False)
        by_threads[t] = [json.loads(line) for line in proc.stdout.splitlines()
                         if line.startswith("{")]
    _print(by_threads)
    Path(args.json).parent.mkdir(parents=True, exist_ok=True)
    Path(args.json).write_text(json.dumps({"rounds": args.rounds, "loss_ratio": args.loss_ratio,
                                           "by_threads": {
        str(t): rows for t, rows in by_threads.items()}}, indent=1))
    print(f"\nwrote {args.json}")


if __name__ == "__main__":
    main()
