"""Build time and speed of each scheduled matmul kernel at several ``pragma_auto_unroll_max_step``.

For each shared model at fixed shapes (latency_bench's list) our pipeline
(``get_pipeline(host_target(), schedule=True)``) lowers the model once; every PrimFunc whose
loops carry ``pragma_auto_unroll_max_step`` (the CPU matmul tiles) is then rebuilt alone with
that annotation set to each value of ``--steps`` (``0`` in the list: the value the current
rule chose, unchanged). Per kernel and value: LLVM build CPU seconds (``tvm.compile`` of the
one-PrimFunc module, median of ``--build-rounds``) and run time at one thread (CPU time of the
calling thread, ``time.thread_time``, over enough calls for ~20 ms; the values interleaved
round by round, median and range over ``--rounds``). Ratios are against the first value.

The machine may be shared: thread CPU time is not inflated by other processes taking the
core, but caches are shared; read the ranges, not single numbers.

Usage: TVM_NUM_THREADS=1 python benchmarks/unroll_bench.py [--steps 256 128 64 0]
       [--only mnist-8 ...] [--rounds 7] [--json benchmarks/results/unroll_bench.json]
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import time
from pathlib import Path

os.environ.setdefault("TVM_NUM_THREADS", "1")  # read once, when TVM's thread pool starts

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))  # measure this checkout, not another installed copy
sys.path.insert(0, str(REPO / "benchmarks"))

from latency_bench import MODELS_DIR, model_files  # noqa: E402

PRAGMA = "pragma_auto_unroll_max_step"


def _annotated_loops(sch):
    """Loop random variables of ``sch`` that carry ``pragma_auto_unroll_max_step``."""
    pending = list(sch.get_child_blocks(sch.get_sblock("root")))
    seen, loops = set(), []
    while pending:
        block = pending.pop()
        pending.extend(sch.get_child_blocks(block))
        for loop in sch.get_loops(block):
            ref = sch.get_sref(loop)
            if ref not in seen and PRAGMA in sch.get(loop).annotations:
                seen.add(ref)
                loops.append(loop)
    return loops


def _with_step(func, step: int):
    """``func`` with every ``pragma_auto_unroll_max_step`` set to ``step`` (0: unchanged)."""
    from tvm import s_tir

    if not step:
        return func
    sch = s_tir.Schedule(func)
    for loop in _annotated_loops(sch):
        sch.unannotate(loop, PRAGMA)  # annotate keeps an existing value
        sch.annotate(loop, PRAGMA, step)
    return sch.mod["main"]


def _steps_of(func) -> list:
    from tvm import s_tir

    try:
        sch = s_tir.Schedule(func)
        return [int(sch.get(lp).annotations[PRAGMA]) for lp in _annotated_loops(sch)]
    except Exception:  # noqa: BLE001 -- a PrimFunc that is not in block form has no tile
        return []


def _kernels(path, shapes) -> dict:
    """``{name: PrimFunc}`` of the unroll-annotated kernels of our lowered model."""
    import tvm
    from tvm import tirx

    from relax_memplan.frontend import import_onnx
    from relax_memplan.pipeline import get_pipeline
    from relax_memplan.schedules import host_target

    mod, _info = import_onnx(path, shapes)
    lowered = get_pipeline(host_target(), schedule=True)(mod)
    return {gv.name_hint: f for gv, f in lowered.functions_items()
            if isinstance(f, tirx.PrimFunc) and _steps_of(f)}


def _args(func):
    import numpy as np
    import tvm

    rng = np.random.default_rng(0)
    out = []
    for p in func.params:
        shape = [int(d) for d in p.shape]  # 0.27: buffer parameters (all extents constant)
        out.append(tvm.runtime.tensor(rng.standard_normal(shape).astype(p.dtype)))
    return out


def _build(func, name, target, rounds):
    import tvm

    mod = tvm.IRModule({name: func.with_attr("global_symbol", name)})
    seconds = []
    for _ in range(rounds):
        c0 = time.process_time()
        lib = tvm.compile(mod, target)
        seconds.append(time.process_time() - c0)
    return lib[name], statistics.median(seconds)


def _per_call(fn, args, calls):
    t0 = time.thread_time()
    for _ in range(calls):
        fn(*args)
    return (time.thread_time() - t0) / calls


def bench_kernel(name, func, steps, target, rounds, build_rounds) -> dict:
    variants = {}
    for step in steps:
        fn, build_s = _build(_with_step(func, step), name, target, build_rounds)
        variants[step] = {"fn": fn, "build_s": build_s, "runs": []}
    args = _args(func)
    first = variants[steps[0]]["fn"]
    first(*args)
    once = max(_per_call(first, args, 3), 1e-7)
    calls = max(1, min(20000, int(0.02 / once)))
    for _ in range(rounds):
        for v in variants.values():
            v["runs"].append(_per_call(v["fn"], args, calls) * 1e6)
    return {"kernel": name, "rule_steps": sorted(set(_steps_of(func))),
            "variants": {str(s): {"build_s": v["build_s"],
                                  "us_median": statistics.median(v["runs"]),
                                  "us_range": [min(v["runs"]), max(v["runs"])]}
                         for s, v in variants.items()}}


def _print(label, rows, steps) -> None:
    base = str(steps[0])
    print(f"\n{label}: per kernel, build CPU s and run us (median [range]) at 1 thread; "
          f"x = vs step {steps[0]}")
    for r in rows:
        print(f"  {r['kernel'][:48]:<49} rule={r['rule_steps']}")
        b = r["variants"][base]
        for s in steps:
            v = r["variants"][str(s)]
            print(f"    step {s if s else 'rule':>5}: build {v['build_s']:6.3f} s "
                  f"(x{v['build_s'] / b['build_s']:5.2f})  run {v['us_median']:9.2f} us "
                  f"[{v['us_range'][0]:.2f}, {v['us_range'][1]:.2f}] "
                  f"(x{v['us_median'] / b['us_median']:5.3f})")


def main(argv=None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--models", default=str(MODELS_DIR))
    parser.add_argument("--only", nargs="*", help="labels to run (default: all)")
    parser.add_argument("--steps", type=int, nargs="+", default=[256, 128, 64, 0],
                        help="unroll max steps to compare; 0 = the rule's own value")
    parser.add_argument("--rounds", type=int, default=7)
    parser.add_argument("--build-rounds", type=int, default=1)
    parser.add_argument("--json", default=str(REPO / "benchmarks" / "results"
                                              / "unroll_bench.json"))
    args = parser.parse_args(argv)

    from relax_memplan.schedules import host_target

    target = host_target()
    load_before = os.getloadavg()
    result = {"steps": args.steps, "load_before": load_before, "models": {}}
    for label, path, shapes, _values in model_files(args.models, args.only):
        rows = [bench_kernel(n, f, args.steps, target, args.rounds, args.build_rounds)
                for n, f in _kernels(path, shapes).items()]
        result["models"][label] = rows
        _print(label, rows, args.steps)
    result["load_after"] = os.getloadavg()
    print(f"\nload average before {load_before}, after {result['load_after']}")
    Path(args.json).parent.mkdir(parents=True, exist_ok=True)
    Path(args.json).write_text(json.dumps(result, indent=1))


if __name__ == "__main__":
    main()
