"""Weights packed once at compile time vs per call: the same scheduled build with and without.

Our CPU schedules (``get_pipeline(host_target(), schedule=True)``) pack each ``K x nr`` panel
of a matmul's ``B`` operand into a contiguous buffer on every call; with the prepacking
(``relax_memplan.schedules.prepack``) a constant ``B`` (a weight) is given that layout once,
when compiling. This script builds each model both ways (the ``prepack_weights`` switch of
the matmul rules) and times them in interleaved rounds in one process (median and 10-90 %
spread over rounds; the machine is shared, so compare the ratio column, not absolute ms).
It also counts the kernels whose weight was prepacked.

Models: bert-tiny (1, 128), gpt2-tiny (1, 64), mobilenetv2-tiny (1, 3, 96, 96) from
``../shared/models``, and BERT-base encoder layers built by ``bert_case.build_bert``
(hidden 768, FFN 3072; batch 1, static seq ``--seq``), where the 768 x 3072 weight panel is
9.4 MB per call without prepacking.

Usage: TVM_NUM_THREADS=2 python benchmarks/prepack_bench.py [--rounds 20] [--layers 2]
       [--seq 32] [--json PATH]
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import time
from pathlib import Path

import numpy as np

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))  # measure this checkout, not another installed copy
MODELS_DIR = REPO.parent / "shared" / "models"

SHARED = [
    ("bert-tiny", "bert-tiny-randw.onnx", {"input_ids": (1, 128), "attention_mask": (1, 128),
                                           "token_type_ids": (1, 128)}),
    ("gpt2-tiny", "gpt2-tiny-randw.onnx", {"input_ids": (1, 64)}),
    ("mobilenetv2-tiny", "mobilenetv2-tiny.onnx", {"x": (1, 3, 96, 96)}),
]


def _build(mod, prepack: bool):
    import tvm
    from tvm import relax

    from relax_memplan.pipeline import get_pipeline
    from relax_memplan.schedules import host_target
    from relax_memplan.schedules import cpu_matmul

    counted = []

    @tvm.transform.module_pass(opt_level=0, name="CountPrepacked")
    def _count(m, _ctx):
        counted.append(sum(1 for gv, _ in m.functions_items()
                           if gv.name_hint.endswith("_prepacked")))
        return m

    cpu_matmul._CPUMatmulBase.prepack_weights = prepack  # read when the rules run
    try:
        target = host_target()
        pipeline = tvm.transform.Sequential([get_pipeline(target, schedule=True), _count])
        ex = tvm.compile(mod, target, relax_pipeline=pipeline)
    finally:
        cpu_matmul._CPUMatmulBase.prepack_weights = True
    return relax.VirtualMachine(ex, tvm.cpu()), counted[0]


def _models(args):
    from benchmarks.bert_case import build_bert, make_inputs
    from relax_memplan.frontend import import_onnx, make_random_inputs

    for label, file, shapes in SHARED:
        path = MODELS_DIR / file
        if path.exists():
            mod, info = import_onnx(path, shapes)
            yield label, mod, list(make_random_inputs(path, info).values())
    model = build_bert(768, args.layers, 12, 3072)
    feed = make_inputs(1, args.seq, 768, 0)
    mod, _ = import_onnx(model, {k: v.shape for k, v in feed.items()})
    yield f"bert-base x{args.layers} (1, {args.seq})", mod, list(feed.values())


def _interleaved(runners: dict, rounds: int) -> dict:
    for run in runners.values():
        run()
    times = {name: [] for name in runners}
    for _ in range(rounds):
        for name, run in runners.items():
            t0 = time.perf_counter()
            run()
            times[name].append((time.perf_counter() - t0) * 1e3)
    return {name: {"median_ms": statistics.median(v),
                   "spread_pct": 100 * float(np.subtract(*np.percentile(v, [90, 10])))
                   / statistics.median(v)} for name, v in times.items()}


def main(argv=None) -> None:
    import tvm

    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=20)
    parser.add_argument("--layers", type=int, default=2)
    parser.add_argument("--seq", type=int, default=32)
    parser.add_argument("--json", default=str(REPO / "benchmarks" / "results" / "prepack.json"))
    args = parser.parse_args(argv)
    print(f"{'model':<26}{'per call ms':>14}{'prepacked ms':>16}{'ratio':>8}{'kernels':>9}"
          f"{'max diff':>10}")
    rows = []
    for label, mod, arrays in _models(args):
        (base, _), (packed, count) = _build(mod, False), _build(mod, True)
        tensors = [tvm.runtime.tensor(a) for a in arrays]
        first = lambda vm: vm["main"](*tensors)  # noqa: E731
        a, b = first(base), first(packed)
        a, b = (a if hasattr(a, "numpy") else a[0]), (b if hasattr(b, "numpy") else b[0])
        diff = float(np.max(np.abs(a.numpy() - b.numpy())))
        t = _interleaved({"per_call": lambda: first(base), "prepacked": lambda: first(packed)},
                         args.rounds)
        ratio = t["prepacked"]["median_ms"] / t["per_call"]["median_ms"]
        print(f"{label:<26}{t['per_call']['median_ms']:>9.2f} ±{t['per_call']['spread_pct']:>3.0f}%"
              f"{t['prepacked']['median_ms']:>11.2f} ±{t['prepacked']['spread_pct']:>3.0f}%"
              f"{ratio:>8.2f}{count:>9}{diff:>10.1e}", flush=True)
        rows.append({"model": label, **t, "ratio": ratio, "prepacked_kernels": count,
                     "max_abs_diff": diff})
    Path(args.json).parent.mkdir(parents=True, exist_ok=True)
    Path(args.json).write_text(json.dumps({"threads": os.environ.get("TVM_NUM_THREADS"),
                                           "rounds": args.rounds, "models": rows}, indent=1))
    print(f"\nwrote {args.json}")


if __name__ == "__main__":
    main()
