"""Memory of real ONNX models: lower bound vs our arena vs TVM's default plan, side by side.

Each model is compiled twice in this run (our pipeline, and the same pipeline with TVM's
``StaticPlanBlockMemory`` alone), both builds are run once on the same inputs with the naive VM
allocator, and the bytes are compared. Prints a table and writes JSON.

"ours/call" and "TVM/call" are what one call of each build allocates by its static plan (every
constant-size ``alloc_storage``: arenas, storage tokens, outputs, tensors a planner leaves); the
``<=TVM`` column checks, for every function, that our arena and our whole build allocate no more
than TVM's default build (the planner keeps TVM's plan where ours would be larger: "fallback").
The script exits with an error if a function breaks that guarantee.

Usage: python benchmarks/models_bench.py [--models DIR] [--json PATH]
"""

from __future__ import annotations

import argparse
import json
import time
from pathlib import Path

import numpy as np

from relax_memplan.compile import CheckOptions, compile_model
from relax_memplan.examples import example_tiny_matmuls

REPO = Path(__file__).resolve().parents[1]

# (label, file or a function making the model, shapes, input values)
MODELS = [
    ("mnist-8", "mnist-8/model.onnx", None, None),
    ("squeezenet1.0", "squeezenet1.0-randw.onnx", None, None),
    ("mobilenetv2 b1", "mobilenetv2-tiny.onnx", {"x": (1, 3, 96, 96)}, None),
    ("mobilenetv2 b5", "mobilenetv2-tiny.onnx", {"x": (5, 3, 96, 96)}, None),
    ("silero-vad (If)", "silero-vad-op18-ifless.onnx", {"input": (1, 512), "state": (2, 1, 128)},
     {"sr": np.array(16000, dtype=np.int64)}),
    ("ultraface opset9", "ultraface-rfb-320-opset9.onnx", None, None),
    ("built-in example", None, None, None),
    ("tiny 6x6 matmuls", example_tiny_matmuls, None, None),
]


def main(argv=None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--models", default=str(REPO.parent / "shared" / "models"))
    parser.add_argument("--json", default=str(REPO / "benchmarks" / "results" / "models.json"))
    args = parser.parse_args(argv)
    rows, broken = [], []
    header = (f"{'model':<18}{'LB bytes':>10}{'arena':>10}{'ours/call':>11}{'TVM/call':>11}"
              f"{'saved':>8}{'run ours':>10}{'run TVM':>10}{'allocs':>8}{'max err':>9}"
              f"{'<=TVM':>7}{'s':>6}")
    print(header)
    print("-" * len(header))
    for label, file, shapes, values in MODELS:
        path = Path(args.models) / file if isinstance(file, str) else file
        if isinstance(path, Path) and not path.exists():
            print(f"{label:<18} skipped: {path} not found")
            continue
        t0 = time.perf_counter()
        model = path() if callable(path) else path
        result = compile_model(model, shapes, check=CheckOptions(verify=True),
                               input_values=values)
        seconds = time.perf_counter() - t0
        m = result.report.main
        never_worse = {name: f.arena_bytes <= f.tvm_default_bytes
                       and f.expected_runtime_alloc_bytes <= f.tvm_default_bytes
                       for name, f in result.report.functions.items()}
        broken += [f"{label}: {name}" for name, ok in never_worse.items() if not ok]
        row = {
            "model": label,
            "lower_bound_bytes": m.lower_bound_bytes,
            "arena_bytes": m.arena_bytes,
            "planned_bytes": m.planned_bytes,
            "expected_runtime_alloc_bytes": m.expected_runtime_alloc_bytes,
            "tvm_default_bytes": m.tvm_default_bytes,
            "saved_percent": m.saved_percent,
            "fallback": {name: f.fallback for name, f in result.report.functions.items()
                         if f.fallback},
            "never_worse_than_tvm": never_worse,
            "arena_over_lower_bound": m.arena_bytes / m.lower_bound_bytes if m.lower_bound_bytes else None,
            "runtime_alloc_bytes": m.runtime_alloc_bytes,
            "tvm_default_runtime_alloc_bytes": m.tvm_default_runtime_alloc_bytes,
            "runtime_num_allocs": m.runtime_num_allocs,
            "tvm_default_runtime_num_allocs": m.tvm_default_runtime_num_allocs,
            "max_abs_error": m.max_abs_error,
            "verified": m.verified,
            "seconds": seconds,
        }
        rows.append(row)
        saved = "-" if m.saved_percent is None else f"{m.saved_percent:.1f}%"
        print(f"{label:<18}{m.lower_bound_bytes:>10,}{m.arena_bytes:>10,}"
              f"{m.expected_runtime_alloc_bytes:>11,}{m.tvm_default_bytes:>11,}{saved:>8}"
              f"{m.runtime_alloc_bytes:>10,}{m.tvm_default_runtime_alloc_bytes:>10,}"
              f"{m.runtime_num_allocs:>4}/{m.tvm_default_runtime_num_allocs:<3}"
              f"{m.max_abs_error:>9.2g}{'yes' if all(never_worse.values()) else 'NO':>7}"
              f"{seconds:>6.1f}")
        for name, f in result.report.functions.items():
            if f.fallback:
                print(f"{'':<18}{name}: keeps TVM's plan, {f.fallback}")
    out = Path(args.json)
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps({"models": rows}, indent=2) + "\n", encoding="utf-8")
    print(f"\nwritten {out}")
    if broken:
        raise SystemExit(f"our build allocates more than TVM's default in: {', '.join(broken)}")


if __name__ == "__main__":
    main()
