"""Bytes TVM's pooled VM allocator holds after a stream of calls at random sequence lengths.

bert-tiny-randw is imported once with symbolic (batch, seq), batch fixed to 1 by its range and
seq in [1, 128], compiled once per configuration, then called ``--calls`` times at random seq
(same sequence for every configuration). The pooled allocator caches every freed buffer by
exact size and never shrinks; the bytes it holds at the end are read from glibc's
``mallinfo2`` (in-use heap + mmapped bytes) after ``vm.builtin.memory_manager.clear`` before
each configuration. Configurations, measured side by side in one run:

- TVM default: TVM's pipeline and StaticPlanBlockMemory (plans at the declared upper bound);
- ours, upper_bound: one constant arena (one cached size);
- ours, exact: an arena sized per call (one cached buffer per distinct size: grows);
- ours, exact, naive allocator: nothing cached (the memory/allocation-cost trade);
- ours, exact + size classes (the bounded pool policy): arena and outputs rounded up to
  geometric classes of seq, anchored at the upper bound (x4, the default: 128, 32, 8, 2, 1;
  and x2: 128, 64, ..., 1), so the pool keeps one size per class.

Then a per-shape table for the strategies (upper_bound, exact, buckets at seq 64 and 128,
exact + size classes x2 and x4): bytes allocated at run time per call (naive allocator, every
``alloc_storage`` counted), the lower bound at that shape, and the ratio.

Usage: python benchmarks/pool_bench.py [--calls 1000] [--json PATH]
"""

from __future__ import annotations

import argparse
import json
import random
import time
from pathlib import Path

import numpy as np
import tvm
from tvm import relax

from relax_memplan.frontend import import_onnx
from relax_memplan.pipeline import get_pipeline
from relax_memplan.runtime import heap_bytes, run_and_measure
from relax_memplan.transform.plan_dynamic_memory import PlanDynamicMemory

REPO = Path(__file__).resolve().parents[1]


def main(argv=None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--calls", type=int, default=1000)
    parser.add_argument("--model", default=str(REPO.parent / "shared" / "models" / "bert-tiny-randw.onnx"))
    parser.add_argument("--json", default=str(REPO / "benchmarks" / "results" / "pool.json"))
    args = parser.parse_args(argv)
    ranges = {"batch": (1, 1), "seq": (1, 128)}
    mod, _ = import_onnx(args.model, keep_dynamic=True)
    passes = {
        "upper_bound": PlanDynamicMemory(strategy="upper_bound"),
        "exact": PlanDynamicMemory(strategy="exact"),
        "buckets": PlanDynamicMemory(strategy="buckets", buckets={"seq": [64, 128]}),
        "exact + size classes x2": PlanDynamicMemory(strategy="exact", size_classes=True,
                                                     size_class_growth=2.0),
        "exact + size classes x4": PlanDynamicMemory(strategy="exact", size_classes=True),
    }
    ours = {name: tvm.compile(mod, "llvm", relax_pipeline=get_pipeline(
        "llvm", dynamic_pass=dyn, dim_ranges=ranges)) for name, dyn in passes.items()}
    builds = [
        ("TVM default", "pooled", tvm.compile(mod, "llvm", relax_pipeline=get_pipeline(
            "llvm", planner="tvm", dim_ranges=ranges))),
        ("ours upper_bound", "pooled", ours["upper_bound"]),
        ("ours exact", "pooled", ours["exact"]),
        ("ours exact", "naive", ours["exact"]),
        ("ours exact + classes x2", "pooled", ours["exact + size classes x2"]),
        ("ours exact + classes x4", "pooled", ours["exact + size classes x4"]),
    ]
    arena_128 = passes["exact"].plans["main"].bytes_at({"batch": 1, "seq": 128})[0]
    rng = random.Random(0)
    seqs = [rng.randint(1, 128) for _ in range(args.calls)]
    clear = tvm.get_global_func("vm.builtin.memory_manager.clear")
    rows = []
    print(f"{'configuration':<26}{'allocator':<10}{'held at end (B)':>18}{'/ arena@128':>12}{'ms/call':>9}")
    for name, cfg, ex in builds:
        clear()
        vm = relax.VirtualMachine(ex, tvm.cpu(), memory_cfg=cfg)
        base = heap_bytes()
        t0 = time.perf_counter()
        for s in seqs:
            ids = tvm.runtime.tensor(np.zeros((1, s), "int64"))
            out = vm["main"](ids, ids, ids)
            del out, ids
        ms = 1000 * (time.perf_counter() - t0) / len(seqs)
        held = heap_bytes() - base
        del vm
        rows.append({"configuration": name, "allocator": cfg, "held_bytes": held,
                     "held_over_arena_at_128": held / arena_128, "ms_per_call": ms})
        print(f"{name:<26}{cfg:<10}{held:>18,}{held / arena_128:>12.2f}{ms:>9.2f}")
    print(f"\narena at seq 128 (exact plan): {arena_128:,} B; {args.calls} calls")
    shapes = _per_shape_table(passes, ours)
    out = Path(args.json)
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps({"calls": args.calls, "arena_at_128_bytes": arena_128, "rows": rows,
                              "per_shape": shapes}, indent=2) + "\n", encoding="utf-8")
    print(f"written {out}")


def _per_shape_table(passes, builds, seqs=(1, 17, 48, 64, 100, 128)):
    """Bytes each strategy allocates per call (naive allocator) at several seq, vs the lower bound."""
    print(f"\n{'seq':>5}{'LB':>10}" + "".join(f"{name:>24}" for name in passes))
    table = []
    for seq in seqs:
        dims = {"batch": 1, "seq": seq}
        ids = np.zeros((1, seq), "int64")
        lb = passes["exact"].plans["main"].bytes_at(dims)[1]
        row = {"seq": seq, "lower_bound_bytes": lb}
        for name, ex in builds.items():
            fplan = passes[name].plans["main"]
            got = run_and_measure(ex, [ids, ids, ids])
            arena = got.alloc_sizes_bytes[0]
            assert arena == fplan.bytes_at(dims)[0], (name, seq)  # the VM's arena is the plan's
            row[name] = {"runtime_alloc_bytes": got.alloc_bytes, "arena_bytes": arena,
                         "arena_over_lower_bound": round(arena / lb, 4)}
        table.append(row)
        print(f"{seq:>5}{lb:>10,}" + "".join(
            f"{row[n]['arena_bytes']:>14,} ({row[n]['arena_over_lower_bound']:.3f})" for n in passes))
    print("(arena bytes per call and arena / lower bound; every call also allocates its outputs)")
    return table


if __name__ == "__main__":
    main()
