"""Differential fuzzing campaign: seed ranges under a time budget, a table, one JSON file.

    python benchmarks/fuzz_campaign.py --seeds 0:1000 --budget-s 900 --jobs 2
    python benchmarks/fuzz_campaign.py --seeds 1000:5000 --budget-s 3600 --jobs 2 --append

Runs :func:`relax_memplan.tools.fuzz.__main__.campaign` (onnxruntime vs TVM's default
pipeline vs ours, docs/fuzzing.md), prints graphs run, ops covered, shapes per graph, the
outcome counts and each failure's repro file, and writes
``benchmarks/results/fuzz_campaign.json``: ``runs`` (one summary per seed range, each with the
git commit it ran at) and ``total`` (their sum). ``--append`` adds this run's range to the runs
already in the file (a range overlapping one of them is refused); without it the file holds
this run only.
"""

import argparse
import collections
import json
import subprocess
from pathlib import Path

from relax_memplan.tools.fuzz.__main__ import campaign, table

HERE = Path(__file__).resolve().parent
RESULTS = HERE / "results"
RESULT = RESULTS / "fuzz_campaign.json"


def _commit() -> str:
    """The checkout's commit, with ``+dirty`` when the package has uncommitted changes."""
    def git(*args):
        return subprocess.run(["git", *args], cwd=HERE, capture_output=True, text=True).stdout

    dirty = git("status", "--porcelain", "--", "relax_memplan").strip()
    return git("rev-parse", "--short", "HEAD").strip() + ("+dirty" if dirty else "")


def _in_checkout(path: str) -> str:
    """``path`` relative to the checkout when it lies inside it."""
    try:
        return str(Path(path).resolve().relative_to(HERE.parent))
    except ValueError:
        return path


def _span(seeds: str) -> range:
    start, stop = (int(v) for v in seeds.split(":"))
    return range(start, stop)


def merge(runs: list) -> dict:
    """The sum of campaign summaries: graphs, outcomes, ops, failures, seconds; shapes per
    graph weighted by graphs."""
    outcomes, ops = collections.Counter(), collections.Counter()
    for run in runs:
        outcomes.update(run["outcomes"])
        ops.update(run["ops"])
    graphs = sum(r["graphs"] for r in runs)
    return {"graphs": graphs, "outcomes": dict(outcomes), "ops": dict(sorted(ops.items())),
            "shapes_per_graph": sum(r["shapes_per_graph"] * r["graphs"] for r in runs)
            / max(graphs, 1),
            "failures": [f for r in runs for f in r["failures"]],
            "seconds": round(sum(r["seconds"] for r in runs), 1),
            "seeds": ", ".join(r["seeds"] for r in runs)}


def main():
    p = argparse.ArgumentParser()
    p.add_argument("--seeds", default="0:1000")
    p.add_argument("--budget-s", type=float, default=900.0)
    p.add_argument("--jobs", type=int, default=1)
    p.add_argument("--append", action="store_true",
                   help="add this seed range to the runs already in the result file")
    p.add_argument("--out", default=str(RESULTS / "fuzz_repros"))
    args = p.parse_args()
    runs = json.loads(RESULT.read_text())["runs"] if args.append and RESULT.exists() else []
    wanted = _span(args.seeds)
    for run in runs:
        done = _span(run["seeds"])
        if wanted.start < done.stop and done.start < wanted.stop:
            raise SystemExit(f"seeds {args.seeds} overlap the run of seeds {run['seeds']} "
                             f"already in {RESULT}")
    summary = campaign(wanted, Path(args.out), args.budget_s, jobs=args.jobs)
    summary["commit"] = _commit()
    for failure in summary["failures"]:  # paths in the committed file name the checkout's files
        failure["repro"] = _in_checkout(failure["repro"])
    runs = sorted(runs + [summary], key=lambda r: _span(r["seeds"]).start)
    total = merge(runs)
    print(table(summary))
    if len(runs) > 1:
        print(f"\nall runs in {RESULT.name} (seeds {total['seeds']}):")
        print(table(total))
    RESULTS.mkdir(exist_ok=True)
    RESULT.write_text(json.dumps({"runs": runs, "total": total}, indent=1), encoding="utf-8")


if __name__ == "__main__":
    main()
