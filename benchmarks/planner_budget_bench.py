"""Does ``plan()`` keep short budgets? Measured on the planner's own work, not in the tests.

Each case plans random buffers (horizon 10,000 steps, sizes 64 B..1 MiB) under a short
``time_limit_s`` while ``time.perf_counter`` (the planner's wall clock) is replaced by a
clock that runs ``slowdown`` times as fast as the thread's CPU time: 1.0 is an idle machine,
2.0 a machine where the wall clock runs twice as fast as the planner's work (a loaded one,
as the planner sees it), whatever the real load of the machine running this script. The
time on that clock is compared with the budget plus the allowance the planner cannot cut
(problem build, lanes, final check). A case over its allowance is marked ``OVER`` and the
script exits with status 1. The real wall-clock overrun at larger sizes is in
``planner_bench.py`` (short budgets).

Usage::

    PYTHONPATH=. python benchmarks/planner_budget_bench.py [--json PATH]
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import random
import sys
import time
from pathlib import Path
from unittest.mock import patch

REPO_ROOT = Path(__file__).resolve().parents[1]
DEFAULT_JSON = REPO_ROOT / "benchmarks" / "results" / "planner_budget.json"

# (buffers, seed, max lifetime, time_limit_s, slowdown, allowed: (factor, plus seconds))
CASES = (
    (20_000, 2, 400, 0.3, 1.0, (1.5, 0.5)),
    (3_000, 2, 400, 0.05, 1.0, (1.5, 0.5)),
    (20_000, 0, 100, 0.1, 1.0, (1.1, 0.0)),
    (20_000, 6, 100, 0.4, 2.0, (1.1, 0.1)),
)


@contextlib.contextmanager
def work_clock(slowdown: float):
    """``time.perf_counter`` replaced by ``slowdown`` x the thread's CPU time."""
    cpu, start, cpu0 = time.thread_time, time.perf_counter(), time.thread_time()

    def read() -> float:
        return start + slowdown * (cpu() - cpu0)

    with patch.object(time, "perf_counter", read):
        yield read


def random_buffers(buffer_type, count: int, seed: int, max_life: int):
    rnd = random.Random(seed)
    buffers = []
    for i in range(count):
        start = rnd.randrange(10_000)
        buffers.append(buffer_type(f"t{i}", start, start + rnd.randint(1, max_life),
                                   rnd.randint(64, 1 << 20)))
    return buffers


def run_case(planner, count, seed, max_life, limit, slowdown, allowed):
    from relax_memplan.planner import portfolio

    buffers = random_buffers(planner.Buffer, count, seed, max_life)
    # the Python sweep: the compiled one runs its iterations between clock readings of its own
    with work_clock(slowdown) as clock, \
            patch.object(portfolio, "choose_sweep", lambda *args: ("python", "benchmark")):
        started = clock()
        result = planner.plan(buffers, time_limit_s=limit)
        elapsed = clock() - started
    planner.validate(buffers, result.offsets)
    factor, plus = allowed
    return {"buffers": count, "time_limit_s": limit, "slowdown": slowdown,
            "elapsed_s": round(elapsed, 4), "allowed_s": round(factor * limit + plus, 4),
            "over": elapsed > factor * limit + plus, "ratio": round(result.ratio, 4),
            "algorithm": result.algorithm}


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--json", default=str(DEFAULT_JSON))
    args = parser.parse_args(argv)
    sys.path.insert(0, str(REPO_ROOT))
    import relax_memplan.planner as planner

    rows = []
    print(f"{'buffers':>8} {'limit s':>8} {'clock':>6} {'on clock s':>11} {'allowed s':>10}"
          f" {'x LB':>7}  algorithm")
    for case in CASES:
        row = run_case(planner, *case)
        rows.append(row)
        print(f"{row['buffers']:>8} {row['time_limit_s']:>8} {row['slowdown']:>5}x"
              f" {row['elapsed_s']:>11.3f} {row['allowed_s']:>10.3f} {row['ratio']:>7.4f}"
              f"  {row['algorithm']}{'  OVER' if row['over'] else ''}")
    out = {"benchmark": "planner_budget", "loadavg": os.getloadavg(), "cases": rows}
    Path(args.json).parent.mkdir(parents=True, exist_ok=True)
    Path(args.json).write_text(json.dumps(out, indent=2) + "\n")
    print(f"wrote {args.json}")
    return 1 if any(r["over"] for r in rows) else 0


if __name__ == "__main__":
    sys.exit(main())
