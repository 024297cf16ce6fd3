"""Benchmark the exact search alone: can it reach the lower bound of MiniMalloc's A-K?

For each instance, :func:`relax_memplan.planner.exact.solve_capacity` is asked to fit all
buffers below the lower bound (peak live bytes), with a budget in CPU seconds (the machine
may be shared: a wall-clock budget would measure the other users). Every plan found is
checked with ``validate``. The table gives the status, CPU and wall seconds and the load
average; results go to ``benchmarks/results/exact.json``. MiniMalloc's C++ (paper) fits
A-K at 2^20 bytes in 0.6-5.4 s; the lower bounds of D and J are below 2^20 and not known
to be reachable.

Usage::

    PYTHONPATH=. python benchmarks/exact_bench.py [--cpu-limit 10] [--only ACF]
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from pathlib import Path

REPO_ROOT = Path(__file__).resolve().parents[1]
AK = REPO_ROOT.parent / "shared" / "bench" / "minimalloc-challenging"
DEFAULT_JSON = REPO_ROOT / "benchmarks" / "results" / "exact.json"


def bench_one(path: Path, cpu_limit_s: float) -> dict:
    """Run the exact search at the lower bound of one instance; a JSON-ready row."""
    sys.path.insert(0, str(REPO_ROOT))
    from relax_memplan.planner import read_csv, validate
    from relax_memplan.planner.exact import FOUND, solve_capacity
    from relax_memplan.planner.placement import Problem

    buffers = read_csv(path)
    p = Problem(buffers)
    cpu0, wall0 = time.process_time(), time.perf_counter()
    status, offsets = solve_capacity(p, p.lower_bound, cpu0 + cpu_limit_s,
                                     clock=time.process_time)
    row = {"instance": path.name.split(".")[0], "buffers": p.n,
           "lower_bound_bytes": p.lower_bound, "status": status,
           "cpu_seconds": time.process_time() - cpu0,
           "wall_seconds": time.perf_counter() - wall0,
           "load_avg_1min": os.getloadavg()[0]}
    if status == FOUND:
        validate(buffers, p.offsets_by_id(offsets))
        row["height_bytes"] = p.height(offsets)
    return row


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--cpu-limit", type=float, default=10.0, help="CPU seconds each")
    parser.add_argument("--only", default="", help="instance letters, e.g. ACF (default all)")
    parser.add_argument("--json", type=Path, default=DEFAULT_JSON, help="output JSON path")
    args = parser.parse_args(argv)
    rows = []
    for path in sorted(AK.glob("*.csv")):
        if args.only and path.name[0] not in args.only:
            continue
        rows.append(bench_one(path, args.cpu_limit))
        r = rows[-1]
        print(f"{r['instance']:<4}{r['buffers']:>6}  {r['status']:<11}{r['cpu_seconds']:>7.2f}"
              f"{r['wall_seconds']:>8.2f}{r['load_avg_1min']:>6.1f}", flush=True)
    reached = sum(r["status"] == "found" for r in rows)
    print(f"lower bound reached on {reached} of {len(rows)} within {args.cpu_limit:g} CPU s "
          "(columns: buffers, status, CPU s, wall s, load)")
    args.json.parent.mkdir(parents=True, exist_ok=True)
    args.json.write_text(json.dumps({"cpu_limit_s": args.cpu_limit, "rows": rows}, indent=2))
    print(f"wrote {args.json}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
