"""Latency of our build with and without in-place reuse + ReorderForMemory, side by side.

Decides whether ``planner.inplace`` / ``planner.reorder`` may be on by default: both builds
use our pipeline (same kernels, no schedules), differ only in those two steps, and are timed
in the same process in interleaved rounds (helpers of ``latency_bench.py``). The machine is
shared: read the spread, not one number.

With ``--concat`` a third build adds concatenations written in place
(``PlanStaticMemory(concat_inplace=True)``) to the lowered one, timed in the same rounds.

``--kernels``: also time, with the VM's instrument hook in the same interleaved rounds, every
kernel that has an in-place variant: its calls in the plain build against its calls plus its
variant's (``<kernel>_inplace_o<k>_i<j>``) in the lowered build, i.e. the same calls at the same
shapes. Kernels whose time does not change measure the noise of the machine; the variants
(``PrimFunc.specialize`` with the output bound to the input) are what could lose vectorization.

Usage: TVM_NUM_THREADS=2 python benchmarks/inplace_latency_bench.py [--rounds 15]
       [--only ultraface-320 bert-tiny ...] [--concat] [--kernels] [--json PATH]
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

import numpy as np

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))  # measure this checkout, not another installed copy
sys.path.insert(0, str(REPO / "benchmarks"))

from latency_bench import (GENERATED, MODELS, MODELS_DIR, _build, _generated,  # noqa: E402
                           _interleaved, _tvm_runner)


def inplace_kernel_times(vm_plain, vm_low, arrays, rounds) -> dict:
    """Per kernel with an in-place variant in ``vm_low``: ms per call of ``main`` in the plain
    build and, in the lowered build, of the kernel plus its variants (medians over
    ``rounds`` interleaved rounds), their ratio and the variants' share of the calls."""
    import re

    import tvm
    from relax_memplan.runtime import kernel_profile

    args = [tvm.runtime.tensor(a) for a in arrays]
    samples = {"plain": [], "lowered": []}
    for k in range(rounds + 1):
        for name, vm in (("plain", vm_plain), ("lowered", vm_low)):
            prof = kernel_profile(vm, args, merge_numbered=False)
            if k:  # the first round warms up
                samples[name].append(prof)
    variant = re.compile(r"^(?P<base>.+)_inplace_o\d+_i\d+$")
    bases = sorted({m["base"] for p in samples["lowered"] for n in p
                    if (m := variant.match(n))})
    out = {}
    for base in bases:
        def ms(prof, names):
            return 1e3 * sum(prof[n][0] for n in names if n in prof)

        low_names = [n for n in samples["lowered"][0] if n == base or
                     (variant.match(n) and variant.match(n)["base"] == base)]
        plain = float(np.median([ms(p, [base]) for p in samples["plain"]]))
        low = float(np.median([ms(p, low_names) for p in samples["lowered"]]))
        calls = samples["lowered"][0]
        out[base] = {"plain_ms": plain, "lowered_ms": low, "ratio": low / plain if plain else None,
                     "inplace_calls": sum(calls[n][1] for n in low_names if n != base),
                     "calls": sum(calls[n][1] for n in low_names if n in calls)}
    return out


def bench_model(label, path, shapes, values, rounds, concat=False, kernels=False) -> dict:
    from relax_memplan.frontend import import_onnx, make_random_inputs
    from relax_memplan.pipeline import get_pipeline
    from relax_memplan.runtime import to_numpy_list
    from relax_memplan.transform.plan_static_memory import PlanStaticMemory
    from relax_memplan.transform.reorder_for_memory import ReorderForMemory

    mod, info = import_onnx(path, shapes)
    arrays = list(make_random_inputs(path, info, values=values).values())
    plain = PlanStaticMemory()
    vm_plain, _ = _build(mod, "llvm", get_pipeline("llvm", plan_pass=plain))
    lowered = PlanStaticMemory(inplace=True)
    vm_low, _ = _build(mod, "llvm", get_pipeline("llvm", plan_pass=lowered,
                                                  reorder_pass=ReorderForMemory()))
    runners = {"plain": _tvm_runner(vm_plain, arrays), "lowered": _tvm_runner(vm_low, arrays)}
    if concat:
        cc = PlanStaticMemory(inplace=True, concat_inplace=True)
        runners["concat"] = _tvm_runner(_build(mod, "llvm", get_pipeline(
            "llvm", plan_pass=cc, reorder_pass=ReorderForMemory()))[0], arrays)
    ref = to_numpy_list(runners["plain"]())
    diff = max((float(np.abs(a.astype("float64") - b.astype("float64")).max()) if a.size else 0.0)
               for name, run in runners.items() if name != "plain"
               for a, b in zip(ref, to_numpy_list(run())))
    times = _interleaved(runners, rounds)
    per_kernel = (inplace_kernel_times(vm_plain, vm_low, arrays, rounds) if kernels
                  else None)
    extra = {"concat_over_lowered": times["concat"]["median_ms"] / times["lowered"]["median_ms"],
             "concat_inplace": cc.plans["main"].concat_inplace} if concat else {}
    return {"model": label, "times": times, "max_abs_diff": diff, "inplace_kernels": per_kernel,
            **extra,
            "lower_bound_plain_bytes": plain.plans["main"].lower_bound_bytes,
            "lower_bound_lowered_bytes": lowered.plans["main"].lower_bound_bytes,
            "ratio": times["lowered"]["median_ms"] / times["plain"]["median_ms"]}


def main(argv=None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=15)
    parser.add_argument("--only", nargs="*")
    parser.add_argument("--concat", action="store_true",
                        help="also time the lowered build with concatenations in place")
    parser.add_argument("--kernels", action="store_true",
                        help="also time each kernel with an in-place variant (instrument hook)")
    parser.add_argument("--json", default=str(REPO / "benchmarks" / "results" /
                                              "inplace_latency.json"))
    args = parser.parse_args(argv)
    print(f"{'model':<17}{'plain ms':>10}{'spread':>8}{'lowered ms':>11}{'spread':>8}"
          f"{'ratio':>7}{'LB plain':>11}{'LB lowered':>11}{'max diff':>10}")
    rows = []
    for label, file, shapes, values in MODELS:
        if args.only and label not in args.only:
            continue
        path = _generated(file) if file.startswith(GENERATED) else MODELS_DIR / file
        r = bench_model(label, path, shapes, values, args.rounds, args.concat,
                        args.kernels)
        rows.append(r)
        p, q = r["times"]["plain"], r["times"]["lowered"]
        print(f"{label:<17}{p['median_ms']:>10.2f}{p['spread_pct']:>7.0f}%{q['median_ms']:>11.2f}"
              f"{q['spread_pct']:>7.0f}%{r['ratio']:>7.3f}{r['lower_bound_plain_bytes']:>11,}"
              f"{r['lower_bound_lowered_bytes']:>11,}{r['max_abs_diff']:>10.2g}", flush=True)
        if args.concat:
            c = r["times"]["concat"]
            print(f"{'':<17}+concat in place ({r['concat_inplace']} concats): "
                  f"{c['median_ms']:.2f} ms, spread {c['spread_pct']:.0f}%, "
                  f"{r['concat_over_lowered']:.3f} x lowered", flush=True)
        for base, k in (r["inplace_kernels"] or {}).items():
            print(f"    {base[:40]:<41}{k['plain_ms']:>9.3f} ms ->{k['lowered_ms']:>9.3f} ms"
                  f"{k['ratio']:>7.3f}  ({k['inplace_calls']} of {k['calls']} calls in place)",
                  flush=True)
    out = Path(args.json)
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps({"models": rows}, indent=2) + "\n", encoding="utf-8")
    print(f"\nwritten {out}")


if __name__ == "__main__":
    main()
