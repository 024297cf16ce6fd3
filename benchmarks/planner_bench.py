"""Benchmark the offset planner on the MiniMalloc "challenging" instances and random buffers.

For each ``*.csv`` instance: buffer count, lower bound (peak live bytes), height of every
deterministic algorithm, height of ``plan()`` within ``--time-limit`` seconds, its ratio to
the lower bound and the wall time. One more row plans ``--random-buffers`` random buffers
(horizon 10,000 steps, lifetimes 1..100 steps, sizes 64 B..1 MiB) with
``--random-time-limit``. Results are printed as tables and written as JSON.

Usage::

    PYTHONPATH=. python benchmarks/planner_bench.py --time-limit 2 --json out.json
"""

from __future__ import annotations

import argparse
import json
import random
import sys
import time
from pathlib import Path

REPO_ROOT = Path(__file__).resolve().parents[1]
DEFAULT_INSTANCES = REPO_ROOT.parent / "shared" / "bench" / "minimalloc-challenging"
DEFAULT_JSON = REPO_ROOT / "benchmarks" / "results" / "planner.json"


def _import_planner():
    try:
        import relax_memplan.planner as planner
    except ImportError:
        sys.path.insert(0, str(REPO_ROOT))
        import relax_memplan.planner as planner
    return planner


def random_buffers(planner, count: int, seed: int):
    """``count`` random buffers on a 10,000-step horizon."""
    rnd = random.Random(seed)
    buffers = []
    for i in range(count):
        start = rnd.randrange(10_000)
        buffers.append(
            planner.Buffer(f"t{i}", start, start + rnd.randint(1, 100), rnd.randint(64, 1 << 20))
        )
    return buffers


def bench_instance(planner, name, buffers, time_limit_s, seed, deterministic=True):
    """Plan one instance; return a JSON-ready dict."""
    row = {"instance": name, "buffers": len(buffers)}
    if deterministic:
        heights = {}
        for algo in planner.DETERMINISTIC:
            offsets = planner.ALGORITHMS[algo](buffers)
            planner.validate(buffers, offsets)
            heights[algo] = max((offsets[b.id] + b.size_bytes for b in buffers), default=0)
        row["greedy_heights_bytes"] = heights
    t0 = time.perf_counter()
    result = planner.plan(buffers, time_limit_s=time_limit_s, seed=seed)
    row["seconds"] = time.perf_counter() - t0
    planner.validate(buffers, result.offsets)
    row.update(
        lower_bound_bytes=result.lower_bound_bytes,
        height_bytes=result.height_bytes,
        ratio=result.ratio,
        algorithm=result.algorithm,
        time_limit_s=time_limit_s,
    )
    return row


def _short(name: str) -> str:
    return name.replace("lowest_first_by_", "lf_").replace("greedy_by_", "g_")


def format_tables(rows, algorithms) -> str:
    lines = [
        f"{'inst':<8}{'buffers':>8}{'LB':>10}{'height':>10}{'ratio':>8}{'seconds':>9}  best by",
    ]
    for r in rows:
        lines.append(
            f"{r['instance']:<8}{r['buffers']:>8}{r['lower_bound_bytes']:>10}"
            f"{r['height_bytes']:>10}{r['ratio']:>8.3f}{r['seconds']:>9.2f}  {r['algorithm']}"
        )
    lines += ["", "ratio to LB per deterministic algorithm:"]
    lines.append(f"{'inst':<8}" + "".join(f"{_short(a):>11}" for a in algorithms))
    for r in rows:
        if "greedy_heights_bytes" not in r:
            continue
        lb = r["lower_bound_bytes"] or 1
        cells = "".join(f"{r['greedy_heights_bytes'][a] / lb:>11.3f}" for a in algorithms)
        lines.append(f"{r['instance']:<8}" + cells)
    return "\n".join(lines)


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--time-limit", type=float, default=2.0, help="plan() budget per instance, s")
    parser.add_argument("--json", type=Path, default=DEFAULT_JSON, help="output JSON path")
    parser.add_argument("--instances", type=Path, default=DEFAULT_INSTANCES, help="dir of *.csv")
    parser.add_argument("--random-buffers", type=int, default=10_000)
    parser.add_argument("--random-time-limit", type=float, default=0.05)
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args(argv)
    planner = _import_planner()

    rows = []
    files = sorted(args.instances.glob("*.csv")) if args.instances.is_dir() else []
    if not files:
        print(f"no *.csv instances under {args.instances}", file=sys.stderr)
    for path in files:
        buffers = planner.read_csv(path)
        rows.append(bench_instance(planner, path.name.split(".")[0], buffers, args.time_limit, args.seed))
        print(f"{rows[-1]['instance']}: ratio {rows[-1]['ratio']:.3f}", file=sys.stderr, flush=True)
    if args.random_buffers:
        buffers = random_buffers(planner, args.random_buffers, args.seed)
        rows.append(
            bench_instance(
                planner, f"rand{args.random_buffers // 1000}k", buffers,
                args.random_time_limit, args.seed, deterministic=False,
            )
        )

    print(format_tables(rows, planner.DETERMINISTIC))
    inst_rows = [r for r in rows if "greedy_heights_bytes" in r]
    if inst_rows:
        ratios = [r["ratio"] for r in inst_rows]
        print(f"\nplan() on {len(ratios)} instances: max ratio {max(ratios):.3f}, "
              f"mean {sum(ratios) / len(ratios):.3f}")
    args.json.parent.mkdir(parents=True, exist_ok=True)
    args.json.write_text(json.dumps({"time_limit_s": args.time_limit, "rows": rows}, indent=2))
    print(f"wrote {args.json}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
