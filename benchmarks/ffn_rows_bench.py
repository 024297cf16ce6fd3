"""Cost per row of a feed-forward block against its row count: why ChunkFeedForward keeps
``min_chunk_rows`` rows in a chunk.

The block is BERT-base's (``x[M, 768] @ W1[768, 3072] + b1 -> GELU -> @ W2[3072, 768] + b2``,
random weights), built for each ``M`` with ``get_pipeline(host_target(), fusion=False)`` (our CPU
schedules: two kernels, the GELU in the first's epilogue) and called ``--calls`` times per
round. With one thread (default) the time is CPU time of the calling thread
(``time.thread_time``), immune to other processes on a shared host; with more, wall time (run on
a quiet host). The table gives per ``M`` the median ms per call over ``--rounds`` rounds, us per
row, GFLOP/s and the per-row time over the best per-row time of all ``M``.

Usage: TVM_NUM_THREADS=1 python benchmarks/ffn_rows_bench.py [--rows 16,32,64,128,256,512]
       [--threads 1] [--rounds 5] [--json benchmarks/results/ffn_rows.json]
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import time
from pathlib import Path

import numpy as np

HIDDEN, WIDE = 768, 3072
RESULT = Path(__file__).resolve().parent / "results" / "ffn_rows.json"


def build(rows: int, weights, target):
    """The block at ``rows`` rows, compiled; a Relax VM on it."""
    import tvm
    from tvm import relax

    from relax_memplan.pipeline import get_pipeline

    w1, b1, w2, b2 = (relax.const(w) for w in weights)
    x = relax.Var("x", relax.TensorType((rows, HIDDEN), "float32"))
    bb = relax.BlockBuilder()
    with bb.function("main", [x]):
        with bb.dataflow():
            h = bb.emit(relax.op.nn.gelu(bb.emit(relax.op.add(relax.op.matmul(x, w1), b1))))
            y = bb.emit_output(relax.op.add(bb.emit(relax.op.matmul(h, w2)), b2))
        bb.emit_func_output(y)
    ex = tvm.compile(bb.get(), target, relax_pipeline=get_pipeline(target, fusion=False))
    return relax.VirtualMachine(ex, tvm.cpu())


def time_block(vm, rows: int, rounds: int, calls: int, clock) -> float:
    """Median seconds per call."""
    import tvm

    x = tvm.runtime.tensor(np.random.default_rng(1).standard_normal((rows, HIDDEN),
                                                                    dtype=np.float32))
    for _ in range(3):
        vm["main"](x)
    per_call = []
    for _ in range(rounds):
        start = clock()
        for _ in range(calls):
            vm["main"](x)
        per_call.append((clock() - start) / calls)
    return statistics.median(per_call)


def main():
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--rows", default="16,32,64,128,256,512")
    p.add_argument("--threads", type=int, default=1)
    p.add_argument("--rounds", type=int, default=5)
    p.add_argument("--json", default=str(RESULT))
    args = p.parse_args()
    os.environ["TVM_NUM_THREADS"] = str(args.threads)  # read once, when TVM's pool starts
    from relax_memplan.schedules.host import host_target

    rng = np.random.default_rng(0)
    weights = [rng.standard_normal((HIDDEN, WIDE), dtype=np.float32) * 0.02,
               np.zeros(WIDE, np.float32),
               rng.standard_normal((WIDE, HIDDEN), dtype=np.float32) * 0.02,
               np.zeros(HIDDEN, np.float32)]
    clock = time.thread_time if args.threads == 1 else time.perf_counter
    target = host_target()
    results = []
    for rows in (int(r) for r in args.rows.split(",")):
        seconds = time_block(build(rows, weights, target), rows, args.rounds,
                             max(3, 2048 // rows), clock)
        results.append({"rows": rows, "ms_per_call": seconds * 1e3,
                        "us_per_row": seconds / rows * 1e6,
                        "gflops": 4 * rows * HIDDEN * WIDE / seconds / 1e9})
    best = min(r["us_per_row"] for r in results)
    print(f"{'rows':>5} {'ms/call':>9} {'us/row':>8} {'GFLOP/s':>8} {'row cost / best':>16}")
    for r in results:
        r["per_row_over_best"] = r["us_per_row"] / best
        print(f"{r['rows']:>5} {r['ms_per_call']:>9.3f} {r['us_per_row']:>8.2f} "
              f"{r['gflops']:>8.1f} {r['per_row_over_best']:>16.2f}")
    Path(args.json).write_text(json.dumps({
        "block": f"{HIDDEN}->{WIDE}->{HIDDEN}, erf GELU", "threads": args.threads,
        "clock": clock.__name__, "target": str(target), "rounds": args.rounds,
        "load_avg_1min": round(os.getloadavg()[0], 1), "results": results}, indent=1))
    print(f"written {args.json}")


if __name__ == "__main__":
    main()
