"""Improvement search: randomized priorities for lowest-first placement, then squeaky wheel.

A solution is a priority per buffer, decoded by
:meth:`~relax_memplan.planner.placement.Problem.lowest_first` (about 1-10 ms for a few
hundred buffers), so the search tries hundreds of placements per second. Two phases:

1. *Random weights* (first ~30% of the budget): the priority is a weighted sum of the
   normalized size, lifetime, area and start of each buffer; weights are drawn at random
   or near the best weights so far.
2. *Squeaky wheel* (Joslin & Clements 1999): after each placement, every buffer that ends
   above the lower bound gets a higher priority, in proportion to how high it ends and a
   random factor, so the buffers that make the arena tall are placed earlier next time;
   after ``stall_iterations`` placements without improvement it restarts from the best
   priorities.

The search is seeded: with ``time_limit_s=None`` and ``max_iterations`` set, the result
depends only on the seed. It stops early when the height reaches the lower bound.
"""

from __future__ import annotations

import random
import time
from typing import Optional, Sequence

from .placement import Problem

__all__ = ["iterated_greedy_offsets"]

WEIGHT_PHASE_FRACTION = 0.3
STALL_ITERATIONS = 40
BLAME_STEP = 0.3


def _features(p: Problem) -> list[tuple[float, float, float, float]]:
    """Per buffer: size, lifetime, area (size x lifetime) and start, each scaled to [0, 1]."""
    life = [e - s for s, e in zip(p.start, p.end)]
    area = [s * l for s, l in zip(p.size, life)]
    max_size, max_life, max_area = max(p.size), max(life), max(area)
    first = min(p.start)
    horizon = max(max(p.end) - first, 1)
    return [
        (p.size[i] / max_size, life[i] / max_life, area[i] / max_area,
         (p.start[i] - first) / horizon)
        for i in range(p.n)
    ]


# Start from the deterministic orders: longest, largest, largest area, earliest first.
_BASE_WEIGHTS = [(0.0, -1.0, 0.0, 0.0), (-1.0, 0.0, 0.0, 0.0), (0.0, 0.0, -1.0, 0.0),
                 (0.0, 0.0, 0.0, 1.0)]


class _Budget:
    """Stops after max_iterations placements or when the next one would pass the deadline."""

    def __init__(self, time_limit_s: Optional[float], max_iterations: Optional[int],
                 pass_seconds: float = 0.0):
        if time_limit_s is None and max_iterations is None:
            raise ValueError("give time_limit_s or max_iterations (or both)")
        self.t0 = time.perf_counter()
        self.time_limit_s = time_limit_s
        self.max_iterations = max_iterations
        self.pass_seconds = pass_seconds  # expected cost of a placement before one is timed
        self.iterations = 0
        self.deadline = None if time_limit_s is None else self.t0 + time_limit_s

    def left(self) -> bool:
        if self.max_iterations is not None and self.iterations >= self.max_iterations:
            return False
        if self.time_limit_s is None:
            return True
        elapsed = time.perf_counter() - self.t0
        per_iteration = elapsed / self.iterations if self.iterations else self.pass_seconds
        return elapsed + per_iteration <= self.time_limit_s

    def in_first(self, fraction: float) -> bool:
        """True while less than ``fraction`` of every given limit is used."""
        if self.max_iterations is not None and self.iterations >= fraction * self.max_iterations:
            return False
        if self.time_limit_s is not None:
            return time.perf_counter() - self.t0 < fraction * self.time_limit_s
        return True


def iterated_greedy_offsets(
    p: Problem,
    time_limit_s: Optional[float] = 1.0,
    max_iterations: Optional[int] = None,
    seed: int = 0,
    initial: Optional[Sequence[int]] = None,
    pass_seconds: float = 0.0,
) -> tuple[list[int], int]:
    """Search for low-height offsets of a compiled problem.

    Parameters
    ----------
    p : Problem
        The compiled buffers.
    time_limit_s : float, optional
        Wall-clock budget in seconds (a placement is not started if it would likely end
        past it); None for no time limit.
    max_iterations : int, optional
        Maximum number of placements; None for no limit. At least one of the two limits
        must be given.
    seed : int
        Seed of the random generator.
    initial : sequence of int, optional
        Valid offsets by buffer index to start from; returned if nothing better is found.
    pass_seconds : float
        Expected seconds of one placement, used until one is timed: with ``initial`` given,
        no placement starts that would likely end past ``time_limit_s`` (a pass on the
        conflict lists cannot stop midway).

    Returns
    -------
    (list of int, int)
        Offsets by buffer index (bytes) and their height (bytes).
    """
    budget = _Budget(time_limit_s, max_iterations, pass_seconds if initial is not None else 0.0)
    if p.n == 0:
        return [], 0
    rng = random.Random(seed)
    lb = p.lower_bound
    best_offsets = list(initial) if initial is not None else None
    best_height = p.height(best_offsets) if initial is not None else None
    features = _features(p)

    def decode(keys):
        nonlocal best_offsets, best_height
        offsets, height, _, _ = p.lowest_first(keys, budget.deadline)
        budget.iterations += 1
        if best_height is None or height < best_height:
            best_offsets, best_height = offsets, height
        return offsets, height

    # Phase 1: random feature weights.
    best_w, best_w_height, best_keys, best_w_offsets = None, None, None, None
    while best_height is None or (budget.left() and best_height != lb):
        k = budget.iterations
        if k < len(_BASE_WEIGHTS):
            w = _BASE_WEIGHTS[k]
        elif not budget.in_first(WEIGHT_PHASE_FRACTION):
            break
        elif rng.random() < 0.5:
            w = (rng.uniform(-1, 0.2), rng.uniform(-1, 0.2), rng.uniform(-1, 0.2),
                 rng.uniform(-1, 1))
        else:
            w = tuple(x + rng.gauss(0, 0.1) for x in best_w)
        keys = [w[0] * f[0] + w[1] * f[1] + w[2] * f[2] + w[3] * f[3] for f in features]
        offsets, height = decode(keys)
        if best_w_height is None or height < best_w_height:
            best_w, best_w_height, best_keys, best_w_offsets = w, height, keys, offsets

    # Phase 2: squeaky wheel on the per-buffer priorities.
    if best_keys is not None:
        keys = list(best_keys)
        sw_best_height, sw_best_keys, stall = best_w_height, list(best_keys), 0
        offsets, height = best_w_offsets, best_w_height
        size = p.size
        while budget.left() and best_height != lb:
            span = height - lb + 1
            for i, off in enumerate(offsets):
                top = off + size[i]
                if top > lb:
                    keys[i] -= BLAME_STEP * rng.random() * (top - lb) / span
            offsets, height = decode(keys)
            stall += 1
            if height < sw_best_height:
                sw_best_height, sw_best_keys, stall = height, list(keys), 0
            elif stall >= STALL_ITERATIONS:
                keys, stall = list(sw_best_keys), 0
    return best_offsets, best_height
