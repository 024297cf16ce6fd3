"""Best-of selection: run several algorithms within a time budget and keep the lowest plan."""

from __future__ import annotations

import time
from typing import Optional, Sequence

from .algorithms import DETERMINISTIC, PROBLEM_ALGORITHMS
from .buffer import Buffer, Plan
from .placement import Problem
from .search import iterated_greedy_offsets
from .validate import validate

__all__ = ["plan", "SEARCH_NAME"]

#: ``Plan.algorithm`` of plans found by the improvement search inside :func:`plan`.
SEARCH_NAME = "iterated_greedy"


def plan(
    buffers: Sequence[Buffer],
    algorithms: Optional[Sequence[str]] = None,
    time_limit_s: float = 2.0,
    seed: int = 0,
    search: bool = True,
) -> Plan:
    """Plan byte offsets for buffers: best of several greedy algorithms plus a search.

    The algorithms run in turn (the first always runs to completion, later ones only if
    the time left is likely enough, judged by the slowest one so far); then, while time
    remains, the seeded improvement search of :mod:`relax_memplan.planner.search` runs.
    Everything stops early once a plan reaches the lower bound. The returned plan is
    checked with :func:`validate`.

    Parameters
    ----------
    buffers : sequence of Buffer
        Buffers with unique ids.
    algorithms : sequence of str, optional
        Names in ``ALGORITHMS`` to run first, in this order; default: all deterministic
        ones (``DETERMINISTIC``), most useful first.
    time_limit_s : float
        Wall-clock budget in seconds (compilation of the problem and the first algorithm
        always complete even if they take longer).
    seed : int
        Seed of the improvement search.
    search : bool
        Run the improvement search in the time left.

    Returns
    -------
    Plan
        The lowest plan found; ``algorithm`` names the algorithm that found it.

    Raises
    ------
    KeyError
        If an algorithm name is unknown.
    ValueError
        If buffer ids are not unique, or there is nothing to run.
    """
    t0 = time.perf_counter()
    names = list(DETERMINISTIC if algorithms is None else algorithms)
    unknown = [name for name in names if name not in PROBLEM_ALGORITHMS]
    if unknown:
        raise KeyError(f"unknown algorithm(s) {unknown}; known: {sorted(PROBLEM_ALGORITHMS)}")
    if not names and not search:
        raise ValueError("nothing to run: no algorithms and search=False")
    p = Problem(buffers)
    lb = p.lower_bound
    if p.n == 0:
        return Plan({}, 0, 0, names[0] if names else SEARCH_NAME)

    best_offsets, best_height, best_name = None, None, None
    slowest = 0.0
    for name in names:
        started = time.perf_counter()
        if best_offsets is not None and started - t0 + slowest > time_limit_s:
            break
        offsets = PROBLEM_ALGORITHMS[name](p)
        slowest = max(slowest, time.perf_counter() - started)
        height = p.height(offsets)
        if best_height is None or height < best_height:
            best_offsets, best_height, best_name = offsets, height, name
        if best_height == lb:
            break

    left = time_limit_s - (time.perf_counter() - t0)
    if search and best_height != lb and (best_offsets is None or left > 0):
        offsets, height = iterated_greedy_offsets(
            p, time_limit_s=max(left, 0.0), seed=seed, initial=best_offsets
        )
        if best_height is None or height < best_height:
            best_offsets, best_height, best_name = offsets, height, SEARCH_NAME

    result = p.offsets_by_id(best_offsets)
    validate(p.buffers, result)
    return Plan(result, best_height, lb, best_name)
