"""Small kernels alone: our CPU schedule against TVM's unscheduled kernel, per thread count.

The kernels ``fallback_bench.py`` found slower than TVM's default build (transposes,
squeeze-excitation 1x1 convolutions on a 1x1 map, nearest resize, pooling, concat, split), at
the shapes of the shared models, each built from a small Relax module (``LegalizeOps`` ..
``FuseTIR``) and timed as a PrimFunc alone in three builds:

* ``tvm``: unscheduled, plain ``llvm`` (TVM's default build);
* ``tvm_host``: unscheduled, :func:`~relax_memplan.schedules.host_target` (a kernel no rule
  takes in our build);
* ``ours``: :func:`~relax_memplan.schedules.schedule_prim_func` for the host target (the first
  of our rules that applies; ``tvm_host`` again where none does).

Interleaved rounds; each sample runs the kernel enough times to take about 0.2 ms; at one
thread the clock is the calling thread's CPU time (``time.thread_time``: other processes on a
shared machine do not inflate it), at more threads wall time. Prints median and minimum
microseconds per call and ``ours / tvm``; outputs are compared with ``tvm``'s. Each thread count
runs in its own process (TVM reads ``TVM_NUM_THREADS`` once); TVM's idle workers do not spin
(``TVM_THREAD_POOL_SPIN_COUNT=0``).

Usage: python benchmarks/fallback_micro.py [--threads 1 2] [--rounds 41] [--only transpose ...]
       [--json benchmarks/results/fallback_micro.json]
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

import numpy as np

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))  # measure this checkout, not another installed copy


def _kernels():
    """``[(label, relax module)]``: the kernels measured, at the shapes of the shared models
    (those also checked for numerics are taken from the fallback tests' cases)."""
    from tvm import relax

    from tests.schedules.conv_checks import conv_module
    from tests.schedules.fallback_checks import CASES, _module

    op = relax.op
    cases = dict(CASES)
    shared = ["transpose 1x64x256 -> 256x1x64 (vad-lstm)", "transpose nchw->nhwc",
              "dot conv 384->96 on 1x1 relu", "dot conv 96->384 on 1x1 se",
              "dot conv 24->96 on 1x1 se (half vector)", "resize nearest x2 96x10x10 (ppocr)"]
    return [(label, cases[label]) for label in shared] + [
        ("transpose 2-D 512x384", _module([(512, 384)], lambda x: op.permute_dims(x, [1, 0]))),
        ("conv 1024->1024 on 1x1 + relu",
         conv_module((1, 1024, 1, 1), 1024, 1, 1, 0, 1, 1, "relu")),
        ("resize nearest 96x40x40 x2 (ppocr)", _module([(1, 96, 40, 40)], lambda x: (
            op.image.resize2d(x, (80, 80), method="nearest_neighbor")))),
        ("resize nearest 64x160x160 x2", _module([(1, 64, 160, 160)], lambda x: (
            op.image.resize2d(x, (320, 320), method="nearest_neighbor")))),
        ("max_pool 3x3 s2 256x27x27 (squeezenet)",
         _module([(1, 256, 27, 27)], lambda x: op.nn.max_pool2d(x, 3, 2))),
        ("max_pool 3x3 s2 96x109x109 (squeezenet)",
         _module([(1, 96, 109, 109)], lambda x: op.nn.max_pool2d(x, 3, 2))),
        ("concat 256+256 x 13x13 (squeezenet)", _module(
            [(1, 256, 13, 13)] * 2, lambda a, b: op.concat([a, b], axis=1))),
        ("split 64x40x40 in two (yolov8n)", _module(
            [(1, 64, 40, 40)], lambda x: op.split(x, 2, axis=1))),
    ]


def _prim_func(mod):
    """The one PrimFunc FuseOps makes of ``mod`` (the largest when there are several)."""
    import tvm
    from tvm import relax, tirx

    seq = tvm.transform.Sequential([
        relax.transform.LegalizeOps(), relax.transform.AnnotateTIROpPattern(),
        relax.transform.FoldConstant(), relax.transform.FuseOps(), relax.transform.FuseTIR()])
    funcs = [f for _, f in seq(mod).functions_items() if isinstance(f, tirx.PrimFunc)]
    return max(funcs, key=lambda f: len(f.params) * 1000 + len(f.script()))


def _runner(func, target, arrays):
    import tvm

    lib = tvm.compile(tvm.IRModule({"main": func.with_attr("global_symbol", "main")}),
                      target=target)
    args = [tvm.runtime.tensor(a) for a in arrays]
    kernel = lib["main"]
    return (lambda: kernel(*args)), args[-1]


def bench_kernel(label, mod, rounds: int) -> dict:
    import tvm

    from relax_memplan.schedules import SCHEDULE_RULE_ATTR, host_target, schedule_prim_func

    func = _prim_func(mod)
    host = host_target()
    ours = schedule_prim_func(func, host)
    rule = str(ours.attrs[SCHEDULE_RULE_ATTR]) if SCHEDULE_RULE_ATTR in (ours.attrs or {}) \
        else "-"
    rng = np.random.default_rng(0)
    arrays = [rng.standard_normal([int(d) for d in p.shape], dtype="float32")
              for p in func.params]
    runners = {"tvm": _runner(func, tvm.target.Target("llvm"), arrays),
               "tvm_host": _runner(func, host, arrays), "ours": _runner(ours, host, arrays)}
    clock = time.thread_time if os.environ.get("TVM_NUM_THREADS") == "1" else time.perf_counter
    t0 = time.perf_counter()
    runners["tvm"][0]()
    number = max(1, int(2e-4 / max(time.perf_counter() - t0, 1e-7)))
    for run, _out in runners.values():
        for _ in range(3):
            run()
    samples = {name: [] for name in runners}
    for _ in range(rounds):
        for name, (run, _out) in runners.items():
            c0 = clock()
            for _ in range(number):
                run()
            samples[name].append((clock() - c0) / number * 1e6)
    want = runners["tvm"][1].numpy()
    row = {"kernel": label, "rule": rule, "number": number}
    for name, values in samples.items():
        got = runners[name][1].numpy()
        row[name] = {"median_us": statistics.median(values), "min_us": min(values),
                     "max_abs_diff_vs_tvm": float(np.max(np.abs(got - want)))}
    return row


def _worker(args) -> None:
    for label, mod in _kernels():
        if args.only and not any(s in label for s in args.only):
            continue
        print(json.dumps(bench_kernel(label, mod, args.rounds)), flush=True)


def _print(by_threads: dict) -> None:
    print("us per call: median (min) over interleaved rounds; x = ours / tvm on the medians")
    labels = list(dict.fromkeys(r["kernel"] for rows in by_threads.values() for r in rows))
    for t, rows in sorted(by_threads.items()):
        print(f"\nTVM_NUM_THREADS={t} ({'CPU time' if t == 1 else 'wall time'})")
        print(f"  {'kernel':<52}{'rule':<17}{'tvm':>16}{'tvm_host':>16}{'ours':>16}{'x':>6}")
        for label in labels:
            r = next((o for o in rows if o["kernel"] == label), None)
            if r is None:
                continue
            cells = "".join(f"{r[n]['median_us']:>8.2f} ({r[n]['min_us']:>5.2f})"
                            for n in ("tvm", "tvm_host", "ours"))
            ratio = r["ours"]["median_us"] / r["tvm"]["median_us"]
            bad = max(r[n]["max_abs_diff_vs_tvm"] for n in ("tvm_host", "ours"))
            print(f"  {label[:51]:<52}{r['rule'][:16]:<17}{cells}{ratio:>6.2f}"
                  f"{'  DIFF %.1e' % bad if bad > 1e-4 else ''}")


def main(argv=None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--threads", type=int, nargs="+", default=[1, 2])
    parser.add_argument("--rounds", type=int, default=41)
    parser.add_argument("--only", nargs="*", help="substrings of kernel labels to run")
    parser.add_argument("--worker", action="store_true", help=argparse.SUPPRESS)
    parser.add_argument("--json", default=str(REPO / "benchmarks" / "results"
                                              / "fallback_micro.json"))
    args = parser.parse_args(argv)
    if args.worker:
        _worker(args)
        return
    by_threads = {}
    for t in args.threads:
        cmd = [sys.executable, __file__, "--worker", "--rounds", str(args.rounds)]
        if args.only:
            cmd += ["--only", *args.only]
        env = dict(os.environ, TVM_NUM_THREADS=str(t), PYTHONPATH=str(REPO))
        env.setdefault("TVM_THREAD_POOL_SPIN_COUNT", "0")
        proc = subprocess.run(cmd, env=env, text=True, stdout=subprocess.PIPE, check=False)
        by_threads[t] = [json.loads(line) for line in proc.stdout.splitlines()
                         if line.startswith("{")]
    _print(by_threads)
    Path(args.json).parent.mkdir(parents=True, exist_ok=True)
    Path(args.json).write_text(json.dumps({"rounds": args.rounds, "load_1min": os.getloadavg()[0],
                                           "by_threads": {str(t): rows for t, rows in
                                                          by_threads.items()}}, indent=1))
    print(f"\nwrote {args.json}")


if __name__ == "__main__":
    main()
