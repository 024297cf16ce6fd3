"""Differential fuzzing campaign: a seed range under a time budget, a table, a JSON file.

    python benchmarks/fuzz_campaign.py --seeds 0:1000 --budget-s 900

Runs :func:`relax_memplan.tools.fuzz.__main__.campaign` (onnxruntime vs TVM's default
pipeline vs ours, docs/fuzzing.md), prints graphs run, ops covered, shapes per graph, the
outcome counts and each failure's repro file, and writes
``benchmarks/results/fuzz_campaign.json``.
"""

import argparse
import json
from pathlib import Path

from relax_memplan.tools.fuzz.__main__ import campaign, table

RESULTS = Path(__file__).resolve().parent / "results"


def main():
    p = argparse.ArgumentParser()
    p.add_argument("--seeds", default="0:1000")
    p.add_argument("--budget-s", type=float, default=900.0)
    p.add_argument("--out", default=str(RESULTS / "fuzz_repros"))
    args = p.parse_args()
    start, stop = (int(v) for v in args.seeds.split(":"))
    summary = campaign(range(start, stop), Path(args.out), args.budget_s)
    summary["seeds"] = args.seeds
    print(table(summary))
    RESULTS.mkdir(exist_ok=True)
    (RESULTS / "fuzz_campaign.json").write_text(json.dumps(summary, indent=1), encoding="utf-8")


if __name__ == "__main__":
    main()
