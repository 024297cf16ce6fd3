"""Memory of real ONNX models: lower bound vs our arena vs TVM's default plan, side by side.

Each model is compiled twice in this run (our pipeline, and the same pipeline with TVM's
``StaticPlanBlockMemory`` alone), both builds are run once on the same inputs with the naive VM
allocator, and the bytes are compared. Prints a table and writes JSON.

Usage: python benchmarks/models_bench.py [--models DIR] [--json PATH]
"""

from __future__ import annotations

import argparse
import json
import time
from pathlib import Path

import numpy as np

from relax_memplan.compiler import compile_onnx

REPO = Path(__file__).resolve().parents[1]

# (label, file, shapes, input values)
MODELS = [
    ("mnist-8", "mnist-8/model.onnx", None, None),
    ("squeezenet1.0", "squeezenet1.0-randw.onnx", None, None),
    ("mobilenetv2 b1", "mobilenetv2-tiny.onnx", {"x": (1, 3, 96, 96)}, None),
    ("mobilenetv2 b5", "mobilenetv2-tiny.onnx", {"x": (5, 3, 96, 96)}, None),
    ("silero-vad (If)", "silero-vad-op18-ifless.onnx", {"input": (1, 512), "state": (2, 1, 128)},
     {"sr": np.array(16000, dtype=np.int64)}),
    ("ultraface opset9", "ultraface-rfb-320-opset9.onnx", None, None),
    ("built-in example", None, None, None),
]


def main(argv=None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--models", default=str(REPO.parent / "shared" / "models"))
    parser.add_argument("--json", default=str(REPO / "benchmarks" / "results" / "models.json"))
    args = parser.parse_args(argv)
    rows = []
    header = (f"{'model':<18}{'LB bytes':>12}{'ours':>12}{'TVM default':>13}{'ours/LB':>9}"
              f"{'ours/TVM':>10}{'run ours':>12}{'run TVM':>12}{'allocs':>8}{'max err':>10}{'s':>7}")
    print(header)
    print("-" * len(header))
    for label, file, shapes, values in MODELS:
        path = None if file is None else Path(args.models) / file
        if path is not None and not path.exists():
            print(f"{label:<18} skipped: {path} not found")
            continue
        t0 = time.perf_counter()
        result = compile_onnx(path, shapes, verify=True, input_values=values)
        seconds = time.perf_counter() - t0
        m = result.report.main
        row = {
            "model": label,
            "lower_bound_bytes": m.lower_bound_bytes,
            "arena_bytes": m.arena_bytes,
            "planned_bytes": m.planned_bytes,
            "tvm_default_bytes": m.tvm_default_bytes,
            "arena_over_lower_bound": m.arena_bytes / m.lower_bound_bytes if m.lower_bound_bytes else None,
            "planned_over_tvm_default": m.planned_bytes / m.tvm_default_bytes if m.tvm_default_bytes else None,
            "runtime_alloc_bytes": m.runtime_alloc_bytes,
            "tvm_default_runtime_alloc_bytes": m.tvm_default_runtime_alloc_bytes,
            "runtime_num_allocs": m.runtime_num_allocs,
            "tvm_default_runtime_num_allocs": m.tvm_default_runtime_num_allocs,
            "max_abs_error": m.max_abs_error,
            "verified": m.verified,
            "seconds": seconds,
        }
        rows.append(row)
        print(f"{label:<18}{m.lower_bound_bytes:>12,}{m.arena_bytes:>12,}{m.tvm_default_bytes:>13,}"
              f"{row['arena_over_lower_bound']:>9.3f}{row['planned_over_tvm_default']:>10.3f}"
              f"{m.runtime_alloc_bytes:>12,}{m.tvm_default_runtime_alloc_bytes:>12,}"
              f"{m.runtime_num_allocs:>4}/{m.tvm_default_runtime_num_allocs:<3}"
              f"{m.max_abs_error:>10.2g}{seconds:>7.1f}")
    out = Path(args.json)
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps({"models": rows}, indent=2) + "\n", encoding="utf-8")
    print(f"\nwritten {out}")


if __name__ == "__main__":
    main()
