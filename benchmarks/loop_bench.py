"""ONNX Scan (a tanh RNN cell, width 64) in its two forms vs onnxruntime: latency per call
and VM allocations per call, side by side.

* ``unrolled``: the model with a constant length (<= 64), unrolled into ``main``;
* ``recursive``: the model with a symbolic length ``seq``, built once, run at each length
  (body function + self-calling driver, HoistLoopStorage on);
* ``rec-tvm``: the same recursive build with TVM's planner (no hoisting: the body allocates
  on every iteration);
* ``ort``: onnxruntime, CPUExecutionProvider, same thread count.

Median of ``--rounds`` interleaved rounds (each round runs every runner once, after one
warm-up run; ``latency_bench``'s timer and onnxruntime session); the machine
is shared, so read the spread (10th-90th percentile in % of the median), not one number.

Usage: TVM_NUM_THREADS=1 python benchmarks/loop_bench.py [--rounds 30] [--json PATH]
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import tempfile
import warnings
from pathlib import Path

import numpy as np

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))  # measure this checkout
sys.path.insert(0, str(REPO / "tests"))

import onnx  # noqa: E402
import tvm  # noqa: E402
from tvm import relax  # noqa: E402

from frontend.prepare.loop_models import scan_model  # noqa: E402
from relax_memplan.frontend import import_onnx  # noqa: E402
from relax_memplan.pipeline import get_pipeline  # noqa: E402
from relax_memplan.runtime import run_and_measure  # noqa: E402

from latency_bench import _interleaved, _ort_runner  # noqa: E402  (same folder)

WIDTH = 64
LENGTHS = (16, 64, 256, 900)


def _build(model, planner="relax_memplan"):
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        mod, _ = import_onnx(model, keep_dynamic=True)
    return tvm.compile(mod, "llvm", relax_pipeline=get_pipeline("llvm", planner=planner))


def _tvm_runner(ex, feeds):
    vm = relax.VirtualMachine(ex, tvm.cpu())
    args = [tvm.runtime.tensor(v) for v in feeds.values()]
    return lambda: vm["main"](*args)


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=30)
    parser.add_argument("--threads", type=int, default=int(os.environ.get("TVM_NUM_THREADS", 1)))
    parser.add_argument("--json", default=str(REPO / "benchmarks" / "results" / "loops.json"))
    args = parser.parse_args(argv)
    rng = np.random.default_rng(0)
    symbolic = scan_model(seq="seq", width=WIDTH)
    path = Path(tempfile.mkdtemp()) / "scan.onnx"
    onnx.save(symbolic, str(path))
    recursive, rec_tvm = _build(symbolic), _build(symbolic, planner="tvm")
    rows = []
    for length in LENGTHS:
        feeds = {"s0": rng.standard_normal(WIDTH).astype("float32"),
                 "xs": rng.standard_normal((length, WIDTH)).astype("float32")}
        runners = {"recursive": _tvm_runner(recursive, feeds),
                   "rec-tvm": _tvm_runner(rec_tvm, feeds),
                   "ort": _ort_runner(path, feeds, args.threads)[0]}
        allocs = {"recursive": run_and_measure(recursive, list(feeds.values())).num_allocs,
                  "rec-tvm": run_and_measure(rec_tvm, list(feeds.values())).num_allocs}
        if length <= 64:
            fixed = _build(scan_model(length=length, width=WIDTH))
            runners["unrolled"] = _tvm_runner(fixed, feeds)
            allocs["unrolled"] = run_and_measure(fixed, list(feeds.values())).num_allocs
        rows.append({"length": length, "times": _interleaved(runners, args.rounds),
                     "allocs": allocs})
    _print(rows, args)
    Path(args.json).parent.mkdir(parents=True, exist_ok=True)
    Path(args.json).write_text(json.dumps({"width": WIDTH, "threads": args.threads,
                                           "rounds": args.rounds, "rows": rows}, indent=1))
    print(f"written {args.json}")


def _print(rows, args):
    print(f"Scan tanh-RNN width {WIDTH}, {args.threads} thread(s), median of {args.rounds} "
          "interleaved rounds (spread p10-p90 in %); allocs = VM alloc_storage per call")
    head = ("length", "recursive us", "unrolled us", "rec-tvm us", "ort us", "rec/unrolled",
            "rec/ort", "allocs rec", "allocs unr", "allocs rec-tvm")
    print(" ".join(f"{h:>14}" for h in head))
    for row in rows:
        t, a = row["times"], row["allocs"]

        def cell(name):
            return (f"{t[name]['median_ms'] * 1e3:.0f} ±{t[name]['spread_pct']:.0f}%"
                    if name in t else "-")

        def ratio(x, y):
            return f"{t[x]['median_ms'] / t[y]['median_ms']:.2f}" if x in t and y in t else "-"
        print(" ".join(f"{v:>14}" for v in (
            row["length"], cell("recursive"), cell("unrolled"), cell("rec-tvm"), cell("ort"),
            ratio("recursive", "unrolled"), ratio("recursive", "ort"), a["recursive"],
            a.get("unrolled", "-"), a["rec-tvm"])))


if __name__ == "__main__":
    main()
