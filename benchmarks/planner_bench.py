"""Benchmark the offset planner against omnimalloc (if installed) and the lower bound.

Four groups in one run: the MiniMalloc "challenging" instances A-K, the large idealloc
graphs (pangu_2.6B, S_1, Y_1), a random scale curve (1k-100k buffers, horizon 10,000
steps, lifetimes 1..100, sizes 64 B..1 MiB; also timed as one skyline pass by area, CPU
time, problem compilation included, best of ``--pass-repeats`` runs since the machine is
shared) and short budgets (random 20k at 0.1 s, 100k at 0.5 s: the plan returned when
a full pass does not fit). The compiled (numba) sweep is warmed up before any timing
(``planner.warm_up()``, its time reported; ``--no-warm-up`` leaves it to ``plan()``), the
one-pass curve times it beside the Python sweep, and each row says which sweep ``plan()``
ran. Every plan is
checked with ``validate``; the overrun of ``time_limit_s`` and the load average (the machine
may be shared) are reported. omnimalloc
(``pip install .[bench]``) runs its default ``omni`` allocator on the same buffers.
Results go to ``benchmarks/results/planner.json`` (``--quick``: A-K, pangu and 1k-20k only).

Usage::

    PYTHONPATH=. python benchmarks/planner_bench.py [--quick] [--time-limit 2]
"""

from __future__ import annotations

import argparse
import json
import os
import random
import sys
import time
from pathlib import Path

REPO_ROOT = Path(__file__).resolve().parents[1]
SHARED = REPO_ROOT.parent / "shared" / "bench"
DEFAULT_JSON = REPO_ROOT / "benchmarks" / "results" / "planner.json"
LARGE = ("pangu_2.6B", "S_1", "Y_1")
SCALE = (1_000, 10_000, 20_000, 50_000, 100_000)
SHORT_BUDGETS = ((20_000, 0.1), (100_000, 0.5))  # (buffers, time_limit_s)


def _import_planner():
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


def run_omnimalloc(planner, buffers):
    """(height, seconds) of omnimalloc's default allocator, or None if not installed."""
    try:
        import omnimalloc
    except ImportError:
        return None
    allocs = [omnimalloc.Allocation(b.id, b.size_bytes, b.start, b.end) for b in buffers]
    t0 = time.perf_counter()
    placed = omnimalloc.allocate(allocs)
    seconds = time.perf_counter() - t0
    offsets = {a.id: a.offset for a in placed}
    planner.validate(buffers, offsets)
    return max(offsets[b.id] + b.size_bytes for b in buffers), seconds


def bench_instance(planner, group, name, buffers, time_limit_s, seed, sweep_pass=0):
    """Plan one instance with ours and omnimalloc; return a JSON-ready dict."""
    row = {"group": group, "instance": name, "buffers": len(buffers), "time_limit_s": time_limit_s,
           "load_avg_1min": os.getloadavg()[0]}  # the machine is shared: timings follow it
    t0, cpu0 = time.perf_counter(), time.process_time()
    result = planner.plan(buffers, time_limit_s=time_limit_s, seed=seed)
    row["seconds"] = time.perf_counter() - t0
    row["cpu_seconds"] = time.process_time() - cpu0  # wall stretches with the load
    planner.validate(buffers, result.offsets)
    row.update(lower_bound_bytes=result.lower_bound_bytes, height_bytes=result.height_bytes,
               ratio=result.ratio, algorithm=result.algorithm,
               overrun=max(0.0, row["seconds"] / time_limit_s - 1.0))
    row["sweep"] = result.sweep
    if sweep_pass:
        row.update(one_pass(buffers, sweep_pass, result.lower_bound_bytes))
    omni = run_omnimalloc(planner, buffers)
    if omni is not None:
        row["omnimalloc_ratio"] = omni[0] / result.lower_bound_bytes
        row["omnimalloc_seconds"] = omni[1]
    return row


def one_pass(buffers, repeats: int, lower_bound: int) -> dict:
    """CPU seconds of one skyline pass by area (problem compiled in), best of ``repeats``,
    compiled (``sweep_pass_*``; when loaded) and in Python (``python_pass_*``)."""
    from relax_memplan.planner import compiled
    from relax_memplan.planner.algorithms import area_key
    from relax_memplan.planner.placement import Problem
    from relax_memplan.planner.skyline import lowest_first_sweep

    sweeps = {"python_pass": lowest_first_sweep}
    if compiled.sweep_state() == compiled.NUMBA:
        sweeps["sweep_pass"] = compiled.compiled_sweep
    row = {}
    for label, sweep in sweeps.items():
        seconds = []
        for _ in range(repeats):  # CPU time, best of a few: the machine is shared
            t0 = time.process_time()
            p = Problem(buffers)
            height = sweep(p, area_key(p))[1]
            seconds.append(time.process_time() - t0)
        row.update({f"{label}_seconds": min(seconds), f"{label}_seconds_all": seconds,
                    f"{label}_ratio": height / lower_bound})
    return row


def format_table(rows) -> str:
    lines = [f"{'group':<7}{'inst':<15}{'buffers':>8}{'ours':>8}{'s':>7}{'cpu s':>7}{'overrun':>8}"
             f"{'omni':>8}{'s':>7}{'1pass':>8}{'s':>7}{'py s':>7}{'load':>6}  sweep   best by"]
    for r in rows:
        omni = (f"{r['omnimalloc_ratio']:>8.4f}{r['omnimalloc_seconds']:>7.2f}"
                if "omnimalloc_ratio" in r else f"{'-':>8}{'-':>7}")
        one = (f"{r['sweep_pass_ratio']:>8.4f}{r['sweep_pass_seconds']:>7.3f}"
               if "sweep_pass_ratio" in r else f"{'-':>8}{'-':>7}")
        one += (f"{r['python_pass_seconds']:>7.3f}" if "python_pass_seconds" in r
                else f"{'-':>7}")
        lines.append(f"{r['group']:<7}{r['instance']:<15}{r['buffers']:>8}{r['ratio']:>8.4f}"
                     f"{r['seconds']:>7.2f}{r.get('cpu_seconds', float('nan')):>7.2f}"
                     f"{100 * r['overrun']:>7.0f}%{omni}{one}"
                     f"{r['load_avg_1min']:>6.1f}  {r.get('sweep') or '-':<7} {r['algorithm']}")
    return "\n".join(lines)


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--time-limit", type=float, default=2.0, help="plan() budget, s")
    parser.add_argument("--json", type=Path, default=DEFAULT_JSON, help="output JSON path")
    parser.add_argument("--quick", action="store_true", help="A-K, pangu and 1k-20k only")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--pass-repeats", type=int, default=3,
                        help="one-pass CPU time: best of this many runs")
    parser.add_argument("--no-warm-up", action="store_true",
                        help="do not load the compiled sweep before timing (plan() decides)")
    args = parser.parse_args(argv)
    planner = _import_planner()
    warm = None if args.no_warm_up else planner.warm_up()
    print(f"sweep: {warm['sweep'] if warm else 'not warmed up'}"
          + (f" (warm-up {warm['seconds']:.2f} s, compiled: {warm['compiled']}"
             f"{', ' + warm['reason'] if warm['reason'] else ''})" if warm else ""),
          file=sys.stderr, flush=True)
    jobs = []
    for path in sorted((SHARED / "minimalloc-challenging").glob("*.csv")):
        jobs.append(("A-K", path.name.split(".")[0], lambda p=path: planner.read_csv(p), 0,
                     args.time_limit))
    for name in LARGE[:1] if args.quick else LARGE:
        path = SHARED / "idealloc" / f"{name}.csv"
        if path.exists():
            jobs.append(("large", name, lambda p=path: planner.read_csv(p), 0,
                         args.time_limit))
    for count in SCALE[:3] if args.quick else SCALE:
        jobs.append(("random", f"rand{count // 1000}k",
                     lambda c=count: random_buffers(planner, c, args.seed), args.pass_repeats,
                     args.time_limit))
    for count, limit in SHORT_BUDGETS[:1] if args.quick else SHORT_BUDGETS:
        jobs.append(("short", f"rand{count // 1000}k@{limit:g}s",
                     lambda c=count: random_buffers(planner, c, args.seed), 0, limit))
    rows = []
    for group, name, load, sweep_pass, limit in jobs:
        rows.append(bench_instance(planner, group, name, load(), limit, args.seed, sweep_pass))
        print(f"{name}: ours {rows[-1]['ratio']:.4f} in {rows[-1]['seconds']:.2f} s",
              file=sys.stderr, flush=True)
    print(format_table(rows))
    ak = [r for r in rows if r["group"] == "A-K"]
    if ak:
        print(f"\nA-K: mean ratio {sum(r['ratio'] for r in ak) / len(ak):.4f}, lower bound "
              f"reached on {sum(r['height_bytes'] == r['lower_bound_bytes'] for r in ak)}"
              f" of {len(ak)}")
    for key, label in (("sweep_pass_seconds", "compiled"), ("python_pass_seconds", "Python")):
        one = {r["buffers"]: r[key] for r in rows if key in r}
        if 10_000 in one and 100_000 in one:
            print(f"one {label} skyline pass (CPU s, best of {args.pass_repeats}), 10k -> 100k "
                  f"random buffers: {one[100_000] / one[10_000]:.1f}x the time "
                  f"(load {os.getloadavg()[0]:.1f} on {os.cpu_count()} CPUs)")
    args.json.parent.mkdir(parents=True, exist_ok=True)
    args.json.write_text(json.dumps({"time_limit_s": args.time_limit, "quick": args.quick,
                                     "warm_up": warm, "rows": rows}, indent=2))
    print(f"wrote {args.json}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
