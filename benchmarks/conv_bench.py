"""Single convolution kernels from the CNN models: which CPU schedule is fastest.

For each convolution shape (taken from yolov8n, squeezenet, ppocrv4-det, mobilenetv2 at the
shapes of ``latency_bench.py``), the fused kernel ``epilogue(conv(x, w) + b)`` is built
after ``FastBoundedMath`` + ``FuseOps`` + ``FuseTIR`` and scheduled by:

* ``direct``: :class:`~relax_memplan.schedules.DirectConv` as configured in the pipeline;
* ``no-deint``: the same without deinterleaving a column-strided input;
* ``direct-1x1``: DirectConv forced on a 1x1 convolution it would decline;
* ``matmul``: :class:`~relax_memplan.schedules.StaticMatmul` (1x1 convolutions only).

Each PrimFunc is timed alone, in interleaved rounds (the machine is shared: minimum and
median over rounds; compare the ratio columns), and the outputs are compared with the
``direct`` one. Prints a table and writes JSON.

Usage: TVM_NUM_THREADS=1 python benchmarks/conv_bench.py [--rounds 200] [--json PATH]
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

# (label, input shape, filters, kernel, stride, padding, groups, epilogue)
SHAPES = [
    ("yolov8n stem 3x3 s2", (1, 3, 320, 320), 16, 3, 2, 1, 1, "silu"),
    ("yolov8n 3x3 s2 16->32", (1, 16, 160, 160), 32, 3, 2, 1, 1, "silu"),
    ("yolov8n 3x3 s2 32->64", (1, 32, 80, 80), 64, 3, 2, 1, 1, "silu"),
    ("yolov8n 3x3 64->64 40x40", (1, 64, 40, 40), 64, 3, 1, 1, 1, "silu"),
    ("yolov8n 1x1 32->32 80x80", (1, 32, 80, 80), 32, 1, 1, 0, 1, "silu"),
    ("yolov8n 1x1 192->128 20x20", (1, 192, 20, 20), 128, 1, 1, 0, 1, "silu"),
    ("yolov8n 1x1 256->256 10x10", (1, 256, 10, 10), 256, 1, 1, 0, 1, "silu"),
    ("squeezenet 1x1 64->16 109x109", (1, 64, 109, 109), 16, 1, 1, 0, 1, "relu"),
    ("squeezenet 1x1 96->16 54x54", (1, 96, 54, 54), 16, 1, 1, 0, 1, "relu"),
    ("ppocr depthwise 3x3 s2", (1, 16, 160, 160), 16, 3, 2, 1, 16, "relu"),
    ("mobilenetv2 1x1 96->24 12x12", (1, 96, 12, 12), 24, 1, 1, 0, 1, "bias"),
]


def _fused_kernel(shape, filters, kernel, stride, padding, groups, epilogue):
    import tvm
    from tvm import relax, tirx

    from relax_memplan.transform.fast_bounded_math import FastBoundedMath
    from tests.schedules.conv_checks import conv_module

    mod = FastBoundedMath()(conv_module(shape, filters, kernel, stride, padding, 1, groups,
                                        epilogue))
    seq = tvm.transform.Sequential([
        relax.transform.LegalizeOps(), relax.transform.AnnotateTIROpPattern(),
        relax.transform.FuseOps(), relax.transform.FuseTIR()])
    (func,) = [f for _, f in seq(mod).functions_items() if isinstance(f, tirx.PrimFunc)]
    return func


def _variants(func, kernel):
    from relax_memplan.schedules import DirectConv, StaticMatmul

    rules = {"direct": DirectConv(), "no-deint": DirectConv(deinterleave_strided=False)}
    if kernel == 1:
        rules["direct-1x1"] = DirectConv(min_direct_1x1_pixels=0)
        rules["matmul"] = StaticMatmul()
    out = {}
    for name, rule in rules.items():
        sch = rule.apply(func, _target(), False)
        if sch is not None:
            out[name] = sch.mod["main"]
    return out


def _target():
    from relax_memplan.schedules import host_target

    return host_target()


def _runner(func, arrays):
    import tvm

    lib = tvm.compile(tvm.IRModule({"main": func.with_attr("global_symbol", "main")}),
                      target=_target())
    args = [tvm.runtime.tensor(a) for a in arrays]
    return (lambda: lib["main"](*args)), args[-1]


def bench_shape(row, rounds: int) -> dict:
    label, shape, filters, kernel, stride, padding, groups, epilogue = row
    func = _fused_kernel(shape, filters, kernel, stride, padding, groups, epilogue)
    rng = np.random.default_rng(0)
    arrays = [rng.standard_normal([int(d) for d in p.shape], dtype="float32")
              for p in func.params]  # the params are the buffers in TVM 0.27
    runners = {name: _runner(f, arrays) for name, f in _variants(func, kernel).items()}
    times = {name: [] for name in runners}
    for run, _ in runners.values():
        run()
    reference = runners["direct"][1].numpy() if "direct" in runners else None
    for _ in range(rounds):
        for name, (run, _) in runners.items():
            t0 = time.perf_counter()
            run()
            times[name].append(time.perf_counter() - t0)
    result = {"label": label, "shape": list(shape), "filters": filters, "kernel": kernel,
              "stride": stride, "groups": groups}
    for name, values in times.items():
        out = runners[name][1].numpy()
        err = float(np.max(np.abs(out - reference))) if reference is not None else None
        result[name] = {"min_ms": min(values) * 1e3, "median_ms": statistics.median(values) * 1e3,
                        "max_abs_diff_vs_direct": err}
    return result


def _print(result) -> None:
    base = result.get("direct") or result.get("direct-1x1")  # direct declines small 1x1
    cells = []
    for name in ("direct", "no-deint", "direct-1x1", "matmul"):
        if name in result:
            ratio = result[name]["min_ms"] / base["min_ms"] if base else float("nan")
            cells.append(f"{name} {result[name]['min_ms']:.3f}/{result[name]['median_ms']:.3f}"
                         f" ({ratio:.2f})")
    print(f"{result['label']:<32}" + "  ".join(cells), flush=True)


def main(argv=None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=200)
    parser.add_argument("--json", default=str(REPO / "benchmarks" / "results" / "conv.json"))
    args = parser.parse_args(argv)
    threads = os.environ.get("TVM_NUM_THREADS", "(all cores)")
    print(f"TVM_NUM_THREADS={threads}; per variant: min/median ms over {args.rounds} "
          "interleaved rounds (ratio of minima to direct; "
          "direct-1x1 where the pipeline's DirectConv declines)")
    results = []
    for row in SHAPES:
        results.append(bench_shape(row, args.rounds))
        _print(results[-1])
    Path(args.json).parent.mkdir(parents=True, exist_ok=True)
    Path(args.json).write_text(json.dumps({"threads": threads, "rounds": args.rounds,
                                           "shapes": results}, indent=1))
    print(f"wrote {args.json}")


if __name__ == "__main__":
    main()
