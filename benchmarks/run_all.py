"""Run both foundation benchmarks in one go and print their two tables.

(a) the offset planner on the MiniMalloc A-K instances and 10,000 random buffers
    (``planner_bench.py``): height / lower bound and seconds;
(b) real ONNX models (``models_bench.py``): lower bound, our arena, TVM's default plan,
    ratios, bytes measured at run time.

JSON goes to ``benchmarks/results/planner.json`` and ``benchmarks/results/models.json``.

Usage: python benchmarks/run_all.py
"""

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

import models_bench  # noqa: E402
import planner_bench  # noqa: E402

if __name__ == "__main__":
    print("== (a) offset planner: MiniMalloc challenging instances and random buffers ==")
    planner_bench.main([])
    print("\n== (b) real ONNX models: lower bound vs ours vs TVM default ==")
    models_bench.main([])
