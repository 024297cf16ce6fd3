"""``python -m relax_memplan.tools.fuzz --seeds 0:200 --out DIR``: fuzz a seed range.

Each failure is minimized and saved as ``DIR/<outcome>_seed<k>.onnx``, with the command
that reproduces it printed and written to ``DIR/<outcome>_seed<k>.txt``.
``--repro FILE --seed K [--symbolic] [--variant V]`` runs one saved graph again.
"""

from __future__ import annotations

import argparse
import collections
import json
import sys
import time
from pathlib import Path
from typing import List, Optional

import onnx


def _parse(argv):
    p = argparse.ArgumentParser(prog="python -m relax_memplan.tools.fuzz")
    p.add_argument("--seeds", default="0:20", help="START:STOP, a half-open seed range")
    p.add_argument("--out", default="fuzz_out", help="where failures are saved")
    p.add_argument("--budget-s", type=float, default=None, help="stop after this many seconds")
    p.add_argument("--no-minimize", action="store_true", help="save failures as generated")
    p.add_argument("--repro", default=None, help="run one saved .onnx file")
    p.add_argument("--seed", type=int, default=0, help="input seed of --repro")
    p.add_argument("--symbolic", action="store_true", help="--repro's leading dim is symbolic")
    p.add_argument("--static-dim", type=int, default=1, help="--repro's leading dim")
    p.add_argument("--variant", action="append", default=None, help="variant(s) of --repro")
    p.add_argument("--json", default=None, help="write the summary as JSON here")
    p.add_argument("--jobs", type=int, default=1,
                   help="worker processes (each with one TVM thread); default 1")
    return p.parse_args(argv)


def repro_command(path: Path, seed: int, symbolic: bool, static_dim: int, variant: str) -> str:
    """The one-line command that runs a saved failure again."""
    flags = " --symbolic" if symbolic else f" --static-dim {static_dim}"
    flags += f" --variant {variant}" if variant and variant != "tvm" else ""
    return f"python -m relax_memplan.tools.fuzz --repro {path} --seed {seed}{flags}"


def _save(out: Path, graph, result, minimize_it: bool) -> str:
    from .minimize import minimize
    from .runner import run_graph

    model = graph.model
    variants = [result.variant] if result.variant not in ("", "tvm") else ["default"]
    if minimize_it:
        model = minimize(model, lambda m: run_graph(
            m, graph.seed, graph.symbolic, graph.static_dim, variants).outcome == result.outcome,
            max_tests=24)
    out.mkdir(parents=True, exist_ok=True)
    path = out / f"{result.outcome}_seed{graph.seed}.onnx"
    onnx.save(model, str(path))
    cmd = repro_command(path, graph.seed, graph.symbolic, graph.static_dim, result.variant)
    path.with_suffix(".txt").write_text(f"{cmd}\n{result.detail}\n", encoding="utf-8")
    return str(path)


def _run_seed(seed: int, out: Path, minimize_it: bool, deadline: Optional[float]):
    """One graph of the campaign: its record, or None when ``deadline`` has passed."""
    from .generator import generate
    from .runner import run_graph

    if deadline is not None and time.time() > deadline:
        return None
    graph = generate(seed)
    result = run_graph(graph.model, seed, graph.symbolic, graph.static_dim)
    record = {"seed": seed, "outcome": result.outcome, "variant": result.variant,
              "detail": result.detail, "ops": list(graph.op_types), "sizes": len(result.sizes)}
    if result.outcome not in ("ok", "skipped"):
        record["repro"] = _save(out, graph, result, minimize_it)
    return record


def _worker_init() -> None:
    """A campaign worker: one TVM thread, so that ``jobs`` workers use ``jobs`` cores."""
    import os

    os.environ["TVM_NUM_THREADS"] = "1"
    os.environ["OMP_NUM_THREADS"] = "1"


def _records(seeds: range, out: Path, minimize_it: bool, deadline: Optional[float], jobs: int):
    """Each seed's record, in seed order (:func:`_run_seed`), from ``jobs`` processes."""
    if jobs <= 1:
        for seed in seeds:
            yield _run_seed(seed, out, minimize_it, deadline)
        return
    import functools
    import multiprocessing

    # spawn, not fork: a forked child would inherit the parent's TVM thread pool state.
    with multiprocessing.get_context("spawn").Pool(jobs, initializer=_worker_init) as pool:
        yield from pool.imap(functools.partial(_run_seed, out=out, minimize_it=minimize_it,
                                               deadline=deadline), seeds)


def campaign(seeds: range, out: Path, budget_s: Optional[float] = None,
             minimize_it: bool = True, jobs: int = 1) -> dict:
    """Run every seed of ``seeds`` (until ``budget_s``); the summary as a dict.

    Parameters
    ----------
    seeds : range
    out : pathlib.Path
        Where failures are saved.
    budget_s : float, optional
        Stop starting graphs after this many seconds (wall clock).
    minimize_it : bool
        Minimize each failure before saving it.
    jobs : int
        Worker processes; with more than one, each worker runs TVM with one thread and the
        seeds are handed out in order (the summary is the same as with one job).

    Returns
    -------
    dict
        ``graphs``, ``outcomes`` (class -> count), ``ops`` (op -> graphs using it),
        ``shapes_per_graph`` (mean sizes run), ``failures`` (seed, outcome, detail, repro),
        ``seconds``, ``seeds`` (``"START:STOP"``: the seeds run before the budget ran out),
        ``jobs``, and ``not_run`` (seeds inside that range that were not run) when any.
    """
    from .runner import OUTCOMES

    start, outcomes = time.monotonic(), collections.Counter({k: 0 for k in OUTCOMES})
    deadline = None if budget_s is None else time.time() + budget_s
    ops, failures, sizes, last, not_run = collections.Counter(), [], [], None, []
    for seed, record in zip(seeds, _records(seeds, out, minimize_it, deadline, jobs)):
        if record is None:
            not_run.append(seed)
            continue
        outcomes[record["outcome"]] += 1
        ops.update(record["ops"])
        sizes.append(record["sizes"])
        last = record["seed"]
        if "repro" in record:
            failures.append({k: record[k] for k in
                             ("seed", "outcome", "variant", "detail", "repro")})
        print(f"seed {record['seed']}: {record['outcome']} {record['variant']} "
              f"{record['detail'][:120]}", flush=True)
    stop = seeds.start if last is None else last + 1
    summary = {"graphs": len(sizes), "outcomes": dict(outcomes),
               "ops": dict(sorted(ops.items())),
               "shapes_per_graph": sum(sizes) / max(len(sizes), 1), "failures": failures,
               "seconds": round(time.monotonic() - start, 1), "seeds": f"{seeds.start}:{stop}",
               "jobs": jobs}
    gaps = [s for s in not_run if s < stop]  # a worker saw the deadline before a later seed ran
    if gaps:
        summary["not_run"] = gaps
    return summary


def table(summary: dict) -> str:
    """A campaign summary (:func:`campaign`) as text: graphs run, ops covered, outcome counts
    and each failure's repro file.

    Parameters
    ----------
    summary : dict
        What :func:`campaign` returned.

    Returns
    -------
    str
    """
    lines = [f"graphs run        {summary['graphs']}  ({summary['seconds']} s)",
             f"ops covered       {len(summary['ops'])}: {', '.join(summary['ops'])}",
             f"shapes per graph  {summary['shapes_per_graph']:.2f}"]
    lines += [f"{k:<17} {v}" for k, v in summary["outcomes"].items()]
    lines += [f"  seed {f['seed']} {f['outcome']} ({f['variant']}): {f['repro']}\n"
              f"      {f['detail'][:160]}" for f in summary["failures"]]
    return "\n".join(lines)


def main(argv: Optional[List[str]] = None) -> int:
    """Parse ``argv``, run the campaign or the repro, print; 1 when something failed."""
    args = _parse(argv)
    if args.repro is not None:
        from .runner import run_graph

        result = run_graph(onnx.load(args.repro), args.seed, args.symbolic, args.static_dim,
                           args.variant)
        print(f"{result.outcome} {result.variant} {result.detail}")
        return 0 if result.outcome in ("ok", "skipped") else 1
    start, stop = (int(v) for v in args.seeds.split(":"))
    summary = campaign(range(start, stop), Path(args.out), args.budget_s, not args.no_minimize,
                       args.jobs)
    print(table(summary))
    if args.json:
        Path(args.json).write_text(json.dumps(summary, indent=1), encoding="utf-8")
    return 1 if summary["failures"] else 0


if __name__ == "__main__":
    sys.exit(main())
