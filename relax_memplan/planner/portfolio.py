"""Best-of selection: run several algorithms within a time budget and keep the lowest plan.

The budget is a promise: it bounds the whole :func:`plan` call, compilation, the first
feasible plan and the final validation included. Small problems build the time-conflict
graph and run every greedy order, then the exact search of :mod:`.exact` (if the lower
bound is not reached) and the improvement search. Problems with many overlapping pairs
(``MAX_CONFLICT_PAIRS``, or when building the pairs would eat a quarter of the budget) run
the lowest-first orders on the skyline of :mod:`.skyline` instead, best-for-large first
(one pass is about 10 us per buffer in Python, 1.5 us compiled by :mod:`.compiled` when
numba is loaded or its cache loads within the budget), each pass able to finish early by
dropping the buffers left (see :func:`~relax_memplan.planner.skyline.lowest_first_sweep`);
then the
window repair of :mod:`.repair` re-places the buffers around the highest ones of the
best plan (the passes leave it ``REPAIR_SHARE`` of the budget), and the time left goes
to the improvement search.
When the first pass is not expected to fit
(:func:`first_pass_count`), it places only the largest-area buffers lowest-first and puts
the smaller rest in the size-class lanes of :mod:`.lanes` above them (about 1 us per
buffer), rather than being cut where the clock runs out; with no time for any buffer
placed lowest-first, the plan is the lanes alone. A pass or search step is started only
if, at the cost of the slowest pass so far, it ends before the deadline.

The final check of the returned plan is the numpy skyline replay of
:func:`~relax_memplan.planner.validate.no_overlap_on_steps` on the compiled problem; only a
plan failing it goes through :func:`~relax_memplan.planner.validate.validate`, which
raises the precise error. Its cost (``VALIDATE_SECONDS_PER_BUFFER`` per buffer, times the
wall/CPU slowdown measured again before every phase) is kept out of the budget of the
passes. A budget below the fixed minimum (compiling, the lanes, the final check: about
2.5-3 us CPU per buffer) is overrun.
"""

from __future__ import annotations

import time
from typing import Optional, Sequence

import numpy as np

from .algorithms import DETERMINISTIC, PROBLEM_ALGORITHMS, lowest_first_keys
from .buffer import Buffer, Plan
from .compiled import (JIT_DROP_SECONDS_PER_BUFFER, JIT_SECONDS_PER_BUFFER, NUMBA, choose_sweep,
                       compiled_sweep)
from .exact import exact_offsets
from .lanes import size_class_lanes
from .limits import check_time_limit_s
from .placement import Problem
from .repair import window_repair
from .search import iterated_greedy_offsets
from .skyline import DROP_SECONDS_PER_BUFFER, lowest_first_sweep
from .validate import no_overlap_on_steps, validate

__all__ = ["plan", "use_skyline", "first_pass_count", "SEARCH_NAME", "EXACT_NAME", "REPAIR_NAME",
           "LANES_NAME", "SWEEP_ORDER"]

#: ``Plan.algorithm`` of plans found by the improvement search inside :func:`plan`.
SEARCH_NAME = "iterated_greedy"
#: ``Plan.algorithm`` of plans found by the exact search inside :func:`plan`.
EXACT_NAME = "exact"
#: ``Plan.algorithm`` of the size-class lane plan (budgets below one skyline pass).
LANES_NAME = "size_class_lanes"
#: A partial first pass (after the lanes) runs only if an idle machine could place this
#: share of the buffers lowest-first in the time left (random 100k, a tenth placed: 1.36
#: x LB with the rest in lanes, the lanes alone 1.32).
MIN_COUNT_SHARE = 0.1
#: ``Plan.algorithm`` of plans lowered by :func:`~relax_memplan.planner.repair.window_repair`.
REPAIR_NAME = "window_repair"
#: Share of the budget the lowest-first passes leave to the window repair on large graphs
#: (pangu_2.6B: 1.0076 -> 1.0000 x LB, the lower bound + 4 bytes, in 0.07 s CPU; S_1: no
#: lower plan found in 0.7 s, so the repair gets what is left, not more).
REPAIR_SHARE = 0.2
#: Above this many time-overlapping pairs the conflict lists are not built.
MAX_CONFLICT_PAIRS = 2_000_000
#: Rough cost of building the conflict lists and one lowest-first pass on them, seconds per
#: overlapping pair (random 20k buffers, 2.0M pairs: 1.2 s CPU, 2.7 s wall on a loaded machine).
SECONDS_PER_PAIR = 5e-7
#: Rough cost of the final check and result dict, seconds per buffer (kept from the budget;
#: measured 1.2 / 1.35 us CPU on random 20k / 100k buffers, load 4 on 2 cores).
VALIDATE_SECONDS_PER_BUFFER = 1.5e-6
#: Lowest-first orders tried on the skyline, in this order (measured best on large graphs:
#: by area reaches 1.0076 / 1.0018 / 1.0000 x LB on pangu_2.6B / S_1 / Y_1; by peak 1.037 /
#: 1.039 / 1.032 on random 20k / 50k / 100k, where area gives 1.067 / 1.063 / 1.047).
SWEEP_ORDER = ("lowest_first_by_area", "lowest_first_by_peak", "lowest_first_by_start",
               "lowest_first_by_lifetime", "lowest_first_by_size")
#: Cap of the wall/CPU ratio measured while compiling, applied to the cost estimates (8
#: developers on 2 cores: load 14, about 7 times slower than an idle machine).
MAX_SLOWDOWN = 8.0
#: Cost of one lowest-first pass on the skyline, seconds per buffer on an idle machine
#: (block minima of :mod:`.candidates`: random 100k buffers 1.1-1.2 s CPU, 10k 0.08 s;
#: pangu_2.6B 18,692: 0.18 s; best of 5, load 4 on 2 cores).
SWEEP_SECONDS_PER_BUFFER = 12e-6
#: The exact search runs on problems of at most this many buffers, with this share of the
#: time left after the greedy orders. MiniMalloc A-K at 2 s, one run on a shared machine
#: (load 10.5 on 2 cores): share 0.2 mean 1.0714 x LB (2 at LB), 0.6 mean 1.0673 (3).
EXACT_MAX_BUFFERS = 1000
EXACT_SHARE = 0.6
#: Share of the budget the skyline orders may take before the conflict-list passes of a
#: problem above EXACT_MAX_BUFFERS buffers (:func:`_skyline_seed`).
SEED_SHARE = 0.25


def plan(
    buffers: Sequence[Buffer],
    algorithms: Optional[Sequence[str]] = None,
    time_limit_s: float = 2.0,
    seed: int = 0,
    search: bool = True,
) -> Plan:
    """Plan byte offsets for buffers: best of several greedy algorithms plus searches.

    The algorithms run in turn (the first always, later ones only if the time left is
    likely enough, judged by the slowest one so far); then, while time remains, the exact
    search (small problems) and the seeded improvement search of
    :mod:`relax_memplan.planner.search`. Everything stops early once a plan reaches the
    lower bound. The returned plan is checked (a numpy skyline replay; :func:`validate`
    raises the precise error if it fails).

    Parameters
    ----------
    buffers : sequence of Buffer
        Buffers with unique ids.
    algorithms : sequence of str, optional
        Names in ``ALGORITHMS`` to run first, in this order; default: all deterministic
        ones (``DETERMINISTIC``), most useful first, or ``SWEEP_ORDER`` on large graphs. On
        large graphs only the ``lowest_first_by_*`` names run (the sorted best-fit passes
        need the conflict lists); if none is given, ``SWEEP_ORDER[0]`` runs.
    time_limit_s : float
        Wall-clock budget of the whole call in seconds, from the first feasible plan to the
        validation (exceeded only when even one pass in drop mode does not fit).
    seed : int
        Seed of the improvement search.
    search : bool
        Run the exact and improvement searches in the time left.

    Returns
    -------
    Plan
        The lowest plan found; ``algorithm`` names the algorithm that found it, ``sweep``
        the skyline sweep on large graphs (``"numba"``: compiled, loaded by
        :func:`~relax_memplan.planner.warm_up` or from numba's cache when the budget has
        room for it, see :func:`~relax_memplan.planner.compiled.choose_sweep`; else
        ``"python"``, with ``sweep_reason``).

    Raises
    ------
    KeyError
        If an algorithm name is unknown.
    TypeError
        If ``time_limit_s`` is not a number.
    ValueError
        If buffer ids are not unique, there is nothing to run, or ``time_limit_s`` is not a
        finite number > 0 (:func:`~relax_memplan.planner.limits.check_time_limit_s`).
    """
    t0, cpu0 = time.perf_counter(), time.thread_time()
    time_limit_s = check_time_limit_s(time_limit_s)
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
    slowdown, deadline = _deadline(p.n, t0, cpu0, time_limit_s)
    pairs = p.count_overlapping_pairs()
    p.sweep = use_skyline(pairs, time_limit_s)
    sweep = reason = ""
    if p.sweep:
        names = _sweep_names(names if algorithms is not None else SWEEP_ORDER)
        sweep, reason = choose_sweep(p, deadline - time.perf_counter(), slowdown,
                                     p.n * SWEEP_SECONDS_PER_BUFFER)
        p.jit = sweep == NUMBA
    per_buffer = ((JIT_SECONDS_PER_BUFFER, JIT_DROP_SECONDS_PER_BUFFER) if p.jit
                  else (SWEEP_SECONDS_PER_BUFFER, DROP_SECONDS_PER_BUFFER))

    best_offsets, best_height, best_name = None, None, None
    if not p.sweep and algorithms is None:  # the skyline orders first (see _skyline_seed)
        best_offsets, best_height, best_name = _skyline_seed(p, time_limit_s, t0, cpu0)
    slowest, decode = 0.0, None  # slowest pass; fastest lowest-first pass (the first one
    # on the conflict lists also builds them) to estimate one search placement
    # Large graphs keep a share of the budget for the window repair after the passes.
    reserve = REPAIR_SHARE * time_limit_s if search and p.sweep else 0.0
    for name in names:
        slowdown, deadline = _deadline(p.n, t0, cpu0, time_limit_s)
        started = time.perf_counter()
        if best_offsets is not None and started + 1.1 * slowest > deadline - reserve:
            break
        if p.sweep:
            count = None
            if best_offsets is None and first_pass_count(
                    p.n, deadline - started, slowdown, *per_buffer) is not None:
                # A full pass may not fit on this (busy) machine: the lanes first, kept if
                # lower; then a pass with the count an idle machine affords (a pass that
                # measures itself too slow keeps fewer buffers lowest-first).
                best_offsets = size_class_lanes(p)
                best_height, best_name = p.height(best_offsets), LANES_NAME
                slowdown, deadline = _deadline(p.n, t0, cpu0, time_limit_s)
                started = time.perf_counter()
                count = first_pass_count(p.n, deadline - started, 1.0, *per_buffer)
                if count is not None and count < MIN_COUNT_SHARE * p.n:
                    break
            offsets, height = (compiled_sweep if p.jit else lowest_first_sweep)(
                p, lowest_first_keys[name](p), deadline, count)[:2]
        else:
            offsets = PROBLEM_ALGORITHMS[name](p)
            height = p.height(offsets)
        slowest = max(slowest, time.perf_counter() - started)
        if name in lowest_first_keys:
            took = time.perf_counter() - started
            decode = took if decode is None else min(decode, took)
        if best_height is None or height < best_height:
            best_offsets, best_height, best_name = offsets, height, name
        if best_height == lb:
            break

    if search and best_height != lb:
        deadline = _deadline(p.n, t0, cpu0, time_limit_s)[1]
        best_offsets, best_height, best_name = _improve(
            p, (best_offsets, best_height, best_name), deadline, seed, (slowest, decode))

    result = p.offsets_by_id(best_offsets)
    if not _checked(p, best_offsets):
        validate(p.buffers, result)  # raises the precise error
    return Plan(result, best_height, lb, best_name, sweep, reason)


def _skyline_seed(p: Problem, time_limit_s: float, t0: float, cpu0: float):
    """``(offsets, height, name)`` of the best :data:`SWEEP_ORDER` pass on the skyline for a
    problem planned on its conflict lists, or ``(None, None, None)``.

    A larger budget moves a problem from the skyline to the slower conflict lists
    (:func:`use_skyline`), where the lowest-first orders may not all fit: 5,000 random
    buffers, 1.0092 x LB at 0.1 s (skyline, by peak) but 1.0291 at 1.5 s (conflict lists, cut
    after by area) without the skyline's orders first. Above :data:`EXACT_MAX_BUFFERS`
    buffers and when the passes (:data:`SWEEP_SECONDS_PER_BUFFER` each, times the slowdown)
    take at most :data:`SEED_SHARE` of the budget, they run first, so a larger budget starts
    from what the smaller one returned.
    """
    slowdown, deadline = _deadline(p.n, t0, cpu0, time_limit_s)
    cost = len(SWEEP_ORDER) * p.n * SWEEP_SECONDS_PER_BUFFER * slowdown
    if p.n <= EXACT_MAX_BUFFERS or cost > SEED_SHARE * time_limit_s:
        return None, None, None
    best = (None, None, None)
    for name in SWEEP_ORDER:
        offsets, height, _order, finished = lowest_first_sweep(p, lowest_first_keys[name](p),
                                                                deadline)
        if finished and (best[1] is None or height < best[1]):
            best = (offsets, height, name)
    return best


def _improve(p: Problem, best, deadline: float, seed: int, pass_seconds):
    """The searches after the greedy passes: exact search (small problems), window repair
    (large graphs), then the improvement search in the time left. ``best`` and the result
    are ``(offsets, height, algorithm name)`` (None when no pass ran); ``pass_seconds`` is
    ``(slowest, fastest lowest-first)`` pass in seconds, the second possibly None."""
    best_offsets, best_height, best_name = best
    slowest, decode = pass_seconds
    lb = p.lower_bound
    if best_offsets is not None and p.n <= EXACT_MAX_BUFFERS and not p.sweep:
        left = deadline - time.perf_counter()
        if left > 0:
            found = exact_offsets(p, best_offsets, time_limit_s=EXACT_SHARE * left)
            if found is not None and p.height(found) < best_height:
                best_offsets, best_height, best_name = found, p.height(found), EXACT_NAME
    if p.sweep and best_offsets is not None and best_height != lb:
        best_offsets, best_height, best_name = _repaired(
            p, best_offsets, best_height, best_name, deadline, seed)
    left = deadline - time.perf_counter()
    if p.sweep and best_offsets is not None and left < 1.5 * slowest:
        left = 0.0  # not even one more pass fits: skip the search
    if best_height != lb and (best_offsets is None or left > 0):
        offsets, height = iterated_greedy_offsets(
            p, time_limit_s=max(left, 0.0), seed=seed, initial=best_offsets,
            pass_seconds=slowest if decode is None else decode)
        if best_height is None or height < best_height:
            best_offsets, best_height, best_name = offsets, height, SEARCH_NAME
    return best_offsets, best_height, best_name


def _repaired(p: Problem, offsets, height: int, name: str, deadline: float, seed: int):
    """``(offsets, height, name)`` lowered by the window repair if it finds a lower plan
    before ``deadline``, else the plan given."""
    if time.perf_counter() >= deadline:
        return offsets, height, name
    found = window_repair(p, offsets, deadline, seed=seed)
    if found is None:
        return offsets, height, name
    return found, p.height(found), REPAIR_NAME


def _deadline(n: int, t0: float, cpu0: float, time_limit_s: float) -> tuple[float, float]:
    """``(slowdown, deadline)`` of the work before the final check of ``n`` buffers.

    ``slowdown`` is how much slower than CPU time the wall clock has run since the call
    started at ``t0`` / ``cpu0`` (``perf_counter`` / ``thread_time``: the planner runs in the
    calling thread; TVM's pool workers spinning in the same process do not count), 1 to
    ``MAX_SLOWDOWN``;
    measured again before every phase, so the final check's reserve
    (``VALIDATE_SECONDS_PER_BUFFER`` per buffer, times ``slowdown``) follows the load while
    the call runs (a reserve measured once, over the first 15 ms, let random 20k buffers
    end 22 % past a 0.1 s budget at load 6).
    """
    wall, cpu = time.perf_counter() - t0, time.thread_time() - cpu0
    slowdown = min(max(wall / cpu, 1.0), MAX_SLOWDOWN) if cpu > 0.01 else 1.0
    return slowdown, t0 + time_limit_s - VALIDATE_SECONDS_PER_BUFFER * n * slowdown


def _checked(p: Problem, offsets: Sequence[int]) -> bool:
    """True if ``offsets`` is a valid plan of ``p`` (aligned, non-negative, no overlap)."""
    try:
        off = np.asarray(offsets, dtype=np.int64)
        aligned = not ((off < 0).any() or (off % np.asarray(p.align, dtype=np.int64)).any())
    except OverflowError:  # beyond int64
        aligned = not any(off < 0 or off % a for off, a in zip(offsets, p.align))
    if not aligned:
        return False
    lo, hi, num_steps = p.step_arrays
    return no_overlap_on_steps(lo, hi, offsets, p.size, num_steps)


def first_pass_count(n: int, left_s: float, slowdown: float = 1.0,
                     per_s: float = SWEEP_SECONDS_PER_BUFFER,
                     drop_s: float = DROP_SECONDS_PER_BUFFER) -> Optional[int]:
    """How many buffers the first skyline pass places lowest-first, or None for all.

    A full pass costs about ``per_s`` per buffer (``SWEEP_SECONDS_PER_BUFFER`` in Python,
    ``JIT_SECONDS_PER_BUFFER`` compiled), a drop into the lanes ``drop_s``
    (``DROP_SECONDS_PER_BUFFER``, compiled ``JIT_DROP_SECONDS_PER_BUFFER``; both times
    ``slowdown``, the wall/CPU ratio measured while
    compiling). When the full pass does not fit in ``left_s`` seconds, the pass places
    lowest-first as many buffers of largest priority (area) as fit with the drop of the
    others: the small ones dropped last waste little (random 100k buffers, a quarter placed
    lowest-first and the rest in lanes: 1.34 x LB, where cutting a full pass at the same
    point gave 2.1). 0 means no buffer: the lanes alone.
    """
    per, drop = per_s * slowdown, drop_s * slowdown
    if n * per <= left_s:
        return None
    if per <= drop:  # a pass as cheap as the drop: let it measure itself
        return None
        return None
    return max(0, int((left_s - n * drop) / (per - drop)))


def use_skyline(pairs: int, time_limit_s: float) -> bool:
    """Whether a problem with ``pairs`` time-overlapping buffer pairs skips the conflict lists.

    True above ``MAX_CONFLICT_PAIRS`` or when building the lists and one pass on them
    (``SECONDS_PER_PAIR``) would take more than a quarter of the budget.
    """
    return pairs > MAX_CONFLICT_PAIRS or pairs * SECONDS_PER_PAIR > 0.25 * time_limit_s


def _sweep_names(names: Sequence[str]) -> list[str]:
    """The names that run on the skyline (lowest-first ones), or the default one."""
    kept = [name for name in names if name in lowest_first_keys]
    return kept or [SWEEP_ORDER[0]]
