"""Compile time of our scheduled build against TVM's default pipeline, and where it goes.

For each shared model at fixed shapes (latency_bench's list), two builds alternate in one process,
``--rounds`` times each, the order swapped every round (the first build of a process pays for
warming up LLVM and TVM's caches: a warm-up build of a small model comes first):

* ``ours``: ``get_pipeline(host_target(), schedule=True)`` (the latency_bench build);
* ``tvm``: ``get_pipeline("llvm", planner="tvm", fusion=False)`` (TVM's default build).

Times are CPU seconds of the process (``time.process_time``; builds are single-threaded, and on a
shared machine wall time also counts other processes), wall time beside. Each build is split into
the Relax pipeline (``pipeline(mod)``, CPU seconds per pass from a pass
instrument) and the rest of ``tvm.compile`` (TIR lowering, LLVM code generation,
VM linking). Prints the medians, the range of the ours/tvm ratio over rounds, and the passes of
ours that took the most time, with the machine's load average (1, 5, 15 min) before and after
(CPU seconds are less sensitive to load than wall time, not immune: caches are shared); writes
JSON.

Usage: python benchmarks/compile_time_bench.py [--rounds 3] [--only mnist-8 ...]
       [--json benchmarks/results/compile_time.json]
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

from latency_bench import MODELS_DIR, model_files  # noqa: E402


def _pipelines():
    import tvm

    from relax_memplan.pipeline import get_pipeline
    from relax_memplan.schedules import host_target

    llvm, host = tvm.target.Target("llvm"), host_target()
    return {"tvm": (llvm, lambda: get_pipeline(llvm, planner="tvm", fusion=False)),
            "ours": (host, lambda: get_pipeline(host, schedule=True))}


def _cpu_pass_timer():
    """A pass instrument summing CPU seconds (``time.process_time``) per pass name, each pass
    counted at its outermost run only (a FoldConstant inside SplitPrepackedWeights counts for
    SplitPrepackedWeights), the pipeline and its phases (Sequential) not counted."""
    import tvm

    @tvm.instrument.pass_instrument
    class _Timer:
        def __init__(self):
            self.seconds, self._stack = {}, []

        def run_before_pass(self, _mod, info):
            self._stack.append((info.name, time.process_time()))

        def run_after_pass(self, _mod, info):
            name, start = self._stack.pop()
            outer = [n for n, _s in self._stack if not _container(n)]
            if not outer and not _container(name):
                self.seconds[name] = self.seconds.get(name, 0.0) + time.process_time() - start

    return _Timer()


def _container(name: str) -> bool:
    """Our pipeline and its phases: passes made of other passes."""
    return name.startswith("RelaxMemplanPipeline") or name in (
        "sequential", "library_dispatch", "legalize", "dataflow_lower", "finalize")


def timed_build(mod, target, pipeline) -> dict:
    """``{"relax_s", "build_s", "total_s", "wall_s", "passes"}`` of one ``tvm.compile``."""
    import tvm

    timing = _cpu_pass_timer()
    t0, c0 = time.perf_counter(), time.process_time()
    with tvm.transform.PassContext(instruments=[timing]):
        lowered = pipeline(mod)
    c1 = time.process_time()
    tvm.compile(lowered, target, relax_pipeline=tvm.transform.Sequential([]))
    t2, c2 = time.perf_counter(), time.process_time()
    return {"relax_s": c1 - c0, "build_s": c2 - c1, "total_s": c2 - c0, "wall_s": t2 - t0,
            "passes": dict(timing.seconds)}


def bench_model(label, path, shapes, rounds) -> dict:
    from relax_memplan.frontend import import_onnx

    mod, _info = import_onnx(path, shapes)
    builds = _pipelines()
    runs = {name: [] for name in builds}
    for k in range(rounds):
        order = list(builds) if k % 2 == 0 else list(builds)[::-1]
        for name in order:
            target, make = builds[name]
            runs[name].append(timed_build(mod, target, make()))
    med = {name: {key: statistics.median(r[key] for r in rs)
                  for key in ("relax_s", "build_s", "total_s", "wall_s")}
           for name, rs in runs.items()}
    ratios = [o["total_s"] / t["total_s"] for o, t in zip(runs["ours"], runs["tvm"])]
    wall_ratios = [o["wall_s"] / t["wall_s"] for o, t in zip(runs["ours"], runs["tvm"])]
    names = {p for r in runs["ours"] for p in r["passes"]}
    passes = {p: statistics.median(r["passes"].get(p, 0.0) for r in runs["ours"]) for p in names}
    top = sorted(passes.items(), key=lambda kv: -kv[1])[:4]
    return {"model": label, "median": med, "ratio_median": statistics.median(ratios),
            "ratio_range": [min(ratios), max(ratios)],
            "wall_ratio_range": [min(wall_ratios), max(wall_ratios)], "ours_top_passes_s": dict(top),
            "runs": runs}


def _warm_up() -> None:
    """One small build, so that no measured build pays for the process's first compile."""
    from relax_memplan.frontend.examples import example_cnn
    from relax_memplan.frontend import import_onnx

    import tvm
    mod, _ = import_onnx(example_cnn(), None)
    for target, make in _pipelines().values():
        tvm.compile(mod, target, relax_pipeline=make())


def main(argv=None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--models", default=str(MODELS_DIR))
    parser.add_argument("--only", nargs="*", help="labels to run (default: all)")
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--json", default=str(REPO / "benchmarks" / "results"
                                              / "compile_time.json"))
    args = parser.parse_args(argv)
    load_before = [round(v, 2) for v in os.getloadavg()]
    print(f"load average (1, 5, 15 min) before: {load_before}")
    _warm_up()
    print("CPU seconds of this process (time.process_time: other processes on a shared machine do "
          "not inflate it), medians;\nwall: the range of the ours/tvm wall-time ratio; passes: "
          "CPU seconds")
    print(f"{'model':<18}{'ours s':>8}{'(relax':>8}{'build)':>8}{'tvm s':>8}{'(relax':>8}"
          f"{'build)':>8}{'ours/tvm':>10}{'range':>13}{'wall':>13}  ours' slowest passes (s)")
    rows = []
    for label, path, shapes, _values in model_files(args.models, args.only):
        r = bench_model(label, path, shapes, args.rounds)
        o, t = r["median"]["ours"], r["median"]["tvm"]
        top = ", ".join(f"{p} {s:.2f}" for p, s in r["ours_top_passes_s"].items())
        print(f"{label:<18}{o['total_s']:>8.2f}{o['relax_s']:>8.2f}{o['build_s']:>8.2f}"
              f"{t['total_s']:>8.2f}{t['relax_s']:>8.2f}{t['build_s']:>8.2f}"
              f"{r['ratio_median']:>10.2f}{r['ratio_range'][0]:>7.2f}-{r['ratio_range'][1]:<5.2f}"
              f"{r['wall_ratio_range'][0]:>7.2f}-{r['wall_ratio_range'][1]:<5.2f}  {top}",
              flush=True)
        rows.append(r)
        Path(args.json).parent.mkdir(parents=True, exist_ok=True)  # after each model: a
        Path(args.json).write_text(json.dumps({  # partial run is kept
            "rounds": args.rounds, "load_average_before": load_before,
            "load_average_after": [round(v, 2) for v in os.getloadavg()], "models": rows},
            indent=1))
    print(f"load average (1, 5, 15 min) after: {[round(v, 2) for v in os.getloadavg()]}")
    print(f"\nwrote {args.json}")


if __name__ == "__main__":
    main()
