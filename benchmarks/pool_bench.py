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
- ours, exact, naive allocator: nothing cached (the memory/allocation-cost trade).

Usage: python benchmarks/pool_bench.py [--calls 1000] [--json PATH]
"""

from __future__ import annotations

import argparse
import ctypes
import gc
import json
import random
import time
from pathlib import Path

import numpy as np
import tvm
from tvm import relax

from relax_memplan.frontend import import_onnx
from relax_memplan.pipeline import get_pipeline
from relax_memplan.transform.plan_dynamic_memory import PlanDynamicMemory

REPO = Path(__file__).resolve().parents[1]


class _MallInfo2(ctypes.Structure):
    _fields_ = [(n, ctypes.c_size_t) for n in
                "arena ordblks smblks hblks hblkhd usmblks fsmblks uordblks fordblks keepcost".split()]


def _heap_bytes() -> int:
    libc = ctypes.CDLL("libc.so.6")
    libc.mallinfo2.restype = _MallInfo2
    gc.collect()
    info = libc.mallinfo2()
    return info.hblkhd + info.uordblks


def main(argv=None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--calls", type=int, default=1000)
    parser.add_argument("--model", default=str(REPO.parent / "shared" / "models" / "bert-tiny-randw.onnx"))
    parser.add_argument("--json", default=str(REPO / "benchmarks" / "results" / "pool.json"))
    args = parser.parse_args(argv)
    ranges = {"batch": (1, 1), "seq": (1, 128)}
    mod, _ = import_onnx(args.model, keep_dynamic=True)
    exact, upper = PlanDynamicMemory(strategy="exact"), PlanDynamicMemory(strategy="upper_bound")
    builds = [
        ("TVM default", "pooled", tvm.compile(mod, "llvm", relax_pipeline=get_pipeline(
            "llvm", planner="tvm", dim_ranges=ranges))),
        ("ours upper_bound", "pooled", tvm.compile(mod, "llvm", relax_pipeline=get_pipeline(
            "llvm", dynamic_pass=upper, dim_ranges=ranges))),
    ]
    ex_exact = tvm.compile(mod, "llvm", relax_pipeline=get_pipeline("llvm", dynamic_pass=exact, dim_ranges=ranges))
    builds += [("ours exact", "pooled", ex_exact), ("ours exact", "naive", ex_exact)]
    arena_128 = exact.plans["main"].bytes_at({"batch": 1, "seq": 128})[0]
    rng = random.Random(0)
    seqs = [rng.randint(1, 128) for _ in range(args.calls)]
    clear = tvm.get_global_func("vm.builtin.memory_manager.clear")
    rows = []
    print(f"{'configuration':<20}{'allocator':<10}{'held at end (B)':>18}{'/ arena@128':>12}{'ms/call':>9}")
    for name, cfg, ex in builds:
        clear()
        vm = relax.VirtualMachine(ex, tvm.cpu(), memory_cfg=cfg)
        base = _heap_bytes()
        t0 = time.perf_counter()
        for s in seqs:
            ids = tvm.runtime.tensor(np.zeros((1, s), "int64"))
            out = vm["main"](ids, ids, ids)
            del out, ids
        ms = 1000 * (time.perf_counter() - t0) / len(seqs)
        held = _heap_bytes() - base
        del vm
        rows.append({"configuration": name, "allocator": cfg, "held_bytes": held,
                     "held_over_arena_at_128": held / arena_128, "ms_per_call": ms})
        print(f"{name:<20}{cfg:<10}{held:>18,}{held / arena_128:>12.2f}{ms:>9.2f}")
    print(f"\narena at seq 128 (exact plan): {arena_128:,} B; {args.calls} calls")
    out = Path(args.json)
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps({"calls": args.calls, "arena_at_128_bytes": arena_128, "rows": rows},
                              indent=2) + "\n", encoding="utf-8")
    print(f"written {out}")


if __name__ == "__main__":
    main()
