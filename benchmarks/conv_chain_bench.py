"""FuseConvChain: lower bound and time of mobilenetv2-tiny and yolov8n with and without it.

Each model is built four ways in one process -- our pipeline with ``fusion=True``, the fusion
passes with :class:`~relax_memplan.transform.fuse_conv_chain.FuseConvChain` on every chain it
can fuse (``conv_chain="memory"``: mobilenetv2's are depthwise, yolov8n's dense) and without it, each
without and with our CPU schedules (``--schedule``) -- and the four are run in interleaved
rounds (the machine is shared: compare the ratios within one run; the ``spread`` column is the
p10-p90 range in percent of the median). The thread count is TVM's (``TVM_NUM_THREADS``), so run
the script once per thread count. Per model it prints the lower bound (peak live bytes of
``main``, importer order, no in-place) with and without the pass, the chains fused, the fused
kernels' scratch per parallel iteration, the median ms per call and the ratio chain/no-chain,
the ratio of the minimum ms over rounds, the ratio of the fused kernels' time to the kernels
they replace (VM instrument hook, each the minimum over rounds: the fused kernels, and all
kernels of the build without the pass minus the other kernels of the build with it), and the
max difference between the outputs of the two builds.

Usage: TVM_NUM_THREADS=1 python benchmarks/conv_chain_bench.py [--rounds 20] [--only LABEL]
[--json PATH]

Measured (machine shared with other jobs: ranges are loose; the latest run is
results/conv_chain_2t.json),
chain / no chain, "default" and "--schedule" builds:

* mobilenetv2 (depthwise consumers), 1 thread: median ms 0.85 / 0.97, min ms 0.78 / 0.93,
  fused / replaced kernels 0.44 / 0.85 (an earlier, busier run: 0.10 / 0.85); 2 threads:
  median 0.98 / 0.62, min 0.98 / 0.95, kernels 0.07 / 0.52;
* yolov8n (dense consumers), 1 thread: median 0.98 / 1.13, min 1.01 / 1.12, kernels 0.19 /
  1.19; 2 threads: median 0.95 / 1.13, min 1.34 / 1.27, kernels - (the estimate went
  negative: noise larger than the kernels) / 2.32. Its stem pair alone (a sub-graph, 1 thread,
  --schedule) ran 2.2-3.0x slower fused.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import time
from pathlib import Path

import numpy as np

REPO = Path(__file__).resolve().parents[1]
MODELS = [("mobilenetv2 b1", "mobilenetv2-tiny.onnx", "x", (1, 3, 96, 96)),
          ("yolov8n 320", "yolov8n-nudenet-320n.onnx", "images", (1, 3, 320, 320))]


def _build(mod, schedule: bool, chain: bool):
    import tvm
    from tvm import relax

    from relax_memplan.pipeline import fusion_counts, fusion_passes, get_pipeline
    from relax_memplan.transform.plan_static_memory import PlanStaticMemory

    target = tvm.target.Target("llvm")
    # "memory": every chain the pass can fuse (dense consumers too), to time them all
    plan = PlanStaticMemory()
    passes = fusion_passes(target, conv_chain="memory" if chain else "off")
    pipeline = get_pipeline(target, plan_pass=plan, schedule=schedule, fusion_pass_list=passes)
    ex = tvm.compile(mod, target, relax_pipeline=pipeline)
    chain_pass = [p for p in passes if p.info.name == "FuseConvChain"]
    return {"vm": relax.VirtualMachine(ex, tvm.cpu()),
            "lower_bound_bytes": plan.plans["main"].lower_bound_bytes,
            "fused": fusion_counts(passes).get("conv_chain", 0),
            "scratch_bytes": chain_pass[0].scratch_bytes if chain_pass else 0}


def bench_model(label, path, name, shape, rounds: int) -> dict:
    import tvm

    from relax_memplan.compile.model import _import
    from relax_memplan.runtime import kernel_profile

    _, _, mod, _, _ = _import(str(path), {name: shape}, {}, True, lambda _m: None)
    builds = {(s, c): _build(mod, s, c) for s in (False, True) for c in (False, True)}
    x = tvm.runtime.tensor(np.random.default_rng(0).standard_normal(shape).astype("float32"))
    outs = {k: b["vm"]["main"](x) for k, b in builds.items()}
    first = lambda o: (o[0] if isinstance(o, tvm.ir.Array) or isinstance(o, (list, tuple))
                       else o).numpy()
    diff = max(float(np.abs(first(outs[(s, True)]) - first(outs[(s, False)])).max())
               for s in (False, True))
    times = {k: [] for k in builds}
    kernels = {k: [] for k in builds}  # (all kernels, conv_chain kernels) seconds per round
    for _ in range(rounds + 1):  # first round: warm-up
        for k, b in builds.items():
            t0 = time.perf_counter()
            b["vm"]["main"](x)
            times[k].append(time.perf_counter() - t0)
            prof = kernel_profile(b["vm"], [x])
            kernels[k].append((sum(t for t, _ in prof.values()),
                               sum(t for name, (t, _) in prof.items()
                                   if name.startswith("conv_chain"))))
    row = {"model": label, "threads": os.environ.get("TVM_NUM_THREADS", "default"),
           "lower_bound_bytes": builds[(False, False)]["lower_bound_bytes"],
           "lower_bound_chain_bytes": builds[(False, True)]["lower_bound_bytes"],
           "fused": builds[(False, True)]["fused"],
           "scratch_bytes": builds[(False, True)]["scratch_bytes"], "max_diff": diff}
    for (s, c), values in times.items():
        values = values[1:]
        med = statistics.median(values)
        p10, p90 = np.percentile(values, [10, 90])
        key = f"{'schedule' if s else 'default'}_{'chain' if c else 'nochain'}"
        row[key + "_ms"] = med * 1e3
        row[key + "_min_ms"] = min(values) * 1e3
        row[key + "_spread_pct"] = 100 * (p90 - p10) / med
    for s in (False, True):
        # the fused kernels vs the kernels they replaced: min over rounds of the fused kernels'
        # time, and of (all kernels without the pass) - (the other kernels with it)
        build = "schedule" if s else "default"
        chain, plain = kernels[(s, True)][1:], kernels[(s, False)][1:]
        row[f"{build}_fused_kernels_ms"] = min(c for _, c in chain) * 1e3
        row[f"{build}_replaced_kernels_ms"] = (min(t for t, _ in plain)
                                               - min(t - c for t, c in chain)) * 1e3
    return row


def main(argv=None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--models", default=str(REPO.parent / "shared" / "models"))
    parser.add_argument("--rounds", type=int, default=20)
    parser.add_argument("--json", default=None)
    parser.add_argument("--only", nargs="*", help="model labels to run (default: both)")
    args = parser.parse_args(argv)
    threads = os.environ.get("TVM_NUM_THREADS", "default")
    rows = []
    print(f"threads: {threads}")
    print(f"{'model':<16}{'LB':>11}{'LB chain':>11}{'fused':>6}{'scratch':>9}"
          f"{'build':>9}{'nochain ms':>12}{'chain ms':>10}{'ratio':>7}{'spread %':>10}"
          f"{'min ratio':>10}{'kern ratio':>11}{'diff':>9}")
    for label, file, name, shape in MODELS:
        if args.only and label not in args.only:
            continue
        r = bench_model(label, Path(args.models) / file, name, shape, args.rounds)
        rows.append(r)
        for build in ("default", "schedule"):
            a, b = r[f"{build}_nochain_ms"], r[f"{build}_chain_ms"]
            spread = f"{r[f'{build}_nochain_spread_pct']:.0f}/{r[f'{build}_chain_spread_pct']:.0f}"
            print(f"{label:<16}{r['lower_bound_bytes']:>11,}{r['lower_bound_chain_bytes']:>11,}"
                  f"{r['fused']:>6}{r['scratch_bytes']:>9,}{build:>9}{a:>12.2f}{b:>10.2f}"
                  f"{b / a:>7.2f}{spread:>10}"
                  f"{r[f'{build}_chain_min_ms'] / r[f'{build}_nochain_min_ms']:>10.2f}"
                  f"{r[f'{build}_fused_kernels_ms'] / r[f'{build}_replaced_kernels_ms']:>11.2f}"
                  f"{r['max_diff']:>9.1e}", flush=True)
    out = Path(args.json or REPO / "benchmarks" / "results" / f"conv_chain_{threads}t.json")
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps({"models": rows}, indent=2) + "\n", encoding="utf-8")
    print(f"\nwritten {out}")


if __name__ == "__main__":
    main()
