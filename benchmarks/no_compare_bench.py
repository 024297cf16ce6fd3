"""Wall time of ``relax-memplan compile --no-measure`` with and without ``--no-compare``.

``--no-compare`` skips the build with TVM's default planner (``StaticPlanBlockMemory``), which
the report uses only for its "TVM default build" figures. Each model is compiled in a fresh
process (import and build caches do not carry over), both variants interleaved per round;
the table gives the median seconds of each and ``ratio = no_compare / compare``. The machine
is shared: compare the ratios within one run, seconds move with the load.

Usage: python benchmarks/no_compare_bench.py [--models mobilenetv2-tiny.onnx,...] [--rounds 2]
[--json benchmarks/results/no_compare.json]
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
import time
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
MODELS = REPO.parent / "shared" / "models"


def _seconds(model: Path, no_compare: bool) -> float:
    argv = [sys.executable, "-m", "relax_memplan.cli", "compile", str(model), "--no-measure",
            "-q"] + (["--no-compare"] if no_compare else [])
    start = time.perf_counter()
    subprocess.run(argv, cwd=REPO, check=True, stdout=subprocess.DEVNULL)  # this checkout
    return time.perf_counter() - start


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--models", default="mobilenetv2-tiny.onnx,squeezenet1.0-randw.onnx,"
                        "ultraface-rfb-320-opset9.onnx")
    parser.add_argument("--rounds", type=int, default=2)
    parser.add_argument("--json", default=str(REPO / "benchmarks/results/no_compare.json"))
    args = parser.parse_args()
    rows = []
    print(f"{'model':<34}{'compare s':>11}{'no-compare s':>14}{'ratio':>8}")
    for name in args.models.split(","):
        times = {False: [], True: []}
        for _ in range(args.rounds):
            for flag in (False, True):
                times[flag].append(_seconds(MODELS / name, flag))
        both, skip = statistics.median(times[False]), statistics.median(times[True])
        rows.append({"model": name, "compare_s": [round(t, 2) for t in times[False]],
                     "no_compare_s": [round(t, 2) for t in times[True]],
                     "ratio_of_medians": round(skip / both, 3)})
        print(f"{name:<34}{both:>11.1f}{skip:>14.1f}{skip / both:>8.2f}", flush=True)
    Path(args.json).write_text(json.dumps({"rounds": args.rounds, "rows": rows}, indent=2) + "\n")
    print(f"written to {args.json}")


if __name__ == "__main__":
    main()
