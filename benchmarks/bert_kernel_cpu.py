"""BERT-base encoder (bert_case's exact arena + specialization row): CPU time of its kernels.

The same build as ``bert_case.py --rows exact_spec`` (buckets 64 and 128), run with one TVM
thread; every packed call is timed in CPU time of the calling thread (``time.thread_time``
through the VM instrument hook), which other processes on a shared machine do not inflate the
way they inflate wall time. Per seq: the kernels' total over three repeats of two calls, and
each matmul kernel. Run it in two checkouts to compare two versions of the code on equal terms
(wall-clock ratios against onnxruntime moved 0.6-1.4 between runs on the loaded 2-core machine).

Usage: python benchmarks/bert_kernel_cpu.py [--layers 2] [--seqs 32,64,96,128] [--json PATH]
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from pathlib import Path

os.environ["TVM_NUM_THREADS"] = "1"  # thread_time counts the calling thread only
os.environ.setdefault("TVM_THREAD_POOL_SPIN_COUNT", "0")
REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))
sys.path.insert(0, str(REPO / "benchmarks"))


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--layers", type=int, default=2)
    parser.add_argument("--seqs", default="32,64,96,128")
    parser.add_argument("--json", type=Path,
                        default=REPO / "benchmarks" / "results" / "bert_kernel_cpu.json")
    args = parser.parse_args(argv)
    import tvm
    from tvm import relax

    import bert_case as bc
    from relax_memplan.runtime import kernel_profile
    from relax_memplan.schedules import host_target

    cfg = dict(bc.FULL, layers=args.layers, max_seq=max(bc.BUCKETS))
    model = bc.build_bert(cfg["hidden"], args.layers, cfg["heads"], cfg["ffn"])
    (row,) = bc.compile_rows(model, cfg, host_target(), keys=("exact_spec",))
    vm = relax.VirtualMachine(row["ex"], tvm.cpu(), memory_cfg=row["allocator"])
    out = {"layers": args.layers, "batch": cfg["batch"], "seqs": {}}
    for s in (int(v) for v in args.seqs.split(",")):
        feed = bc.make_inputs(cfg["batch"], s, cfg["hidden"], seed=s)
        inputs = [tvm.runtime.tensor(a) for a in feed.values()]
        vm["main"](*inputs)
        totals, prof = [], {}
        for _ in range(3):
            prof = kernel_profile(vm, inputs, rounds=2, include_builtins=True,
                                  clock=time.thread_time)
            totals.append(1e3 * sum(sec for sec, _n in prof.values()))
        out["seqs"][s] = {"kernel_cpu_ms": totals, "matmul_kernels_ms": {
            k: 1e3 * sec for k, (sec, _n) in prof.items() if "matmul" in k}}
        print(f"seq {s:4d}: kernels {min(totals):8.1f} - {max(totals):8.1f} ms CPU", flush=True)
    args.json.parent.mkdir(parents=True, exist_ok=True)
    args.json.write_text(json.dumps(out, indent=1) + "\n", encoding="utf-8")
    print(f"written {args.json}")


if __name__ == "__main__":
    main()
