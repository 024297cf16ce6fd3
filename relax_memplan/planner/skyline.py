"""Lowest-first placement without pairwise conflict lists: a skyline over compressed time.

:meth:`Problem.place_lowest_first <relax_memplan.planner.placement.Problem.place_lowest_first>`
places buffers in non-decreasing offset order, so the lowest feasible offset of an unplaced
buffer is simply the highest top of the placed buffers live during its range: the *skyline*
``sky[t]`` (max top over placed buffers live at step ``t``) maximised over the buffer's
steps, rounded up to its alignment. Placing a buffer at that spot raises the skyline over
its range to its top, which is above every value there, so the update is a range
assignment.

This module keeps the skyline as one numpy array over the compressed steps (the distinct
start/end steps, at most ``2 n``): a query is ``sky[lo:hi].max()`` and an update is
``sky[lo:hi] = top``, both one vectorised call. The next buffer comes from a heap keyed by
``(lowest offset, priority rank)`` whose offsets are lower bounds refreshed lazily: a popped
buffer whose skyline has risen since is pushed back with its new offset. Memory is ``O(n)``
and a pass costs ``O(n log n)`` heap work plus one slice per pop, where the conflict-list
version costs one step per overlapping pair (180 million pairs on idealloc's ``Y_1``).
Both give the same offsets for the same priorities.

A pass can be given a deadline: when the buffers left would not be placed exactly in time,
it places each of them, in heap order, at its current lowest feasible offset (a Tetris
drop: valid, one pop per buffer, gaps possible), so a valid plan comes back on time.
"""

from __future__ import annotations

import heapq
import time
from typing import Optional, Sequence

import numpy as np

__all__ = ["lowest_first_sweep", "rank_of"]

#: A pass looks at the clock once per this many heap pops.
CLOCK_EVERY = 512


def rank_of(priority: Sequence) -> list[int]:
    """Rank of each buffer index when sorted by ``priority`` (ties by index).

    ``priority`` may be a list of sort keys or a numpy array (sorted with a stable argsort).
    """
    n = len(priority)
    if isinstance(priority, np.ndarray):
        by_rank = np.argsort(priority, kind="stable")
    else:
        by_rank = sorted(range(n), key=priority.__getitem__)
    rank = np.empty(n, dtype=np.int64)
    rank[np.asarray(by_rank, dtype=np.int64)] = np.arange(n, dtype=np.int64)
    return rank.tolist()


def lowest_first_sweep(
    p, priority: Sequence, deadline: Optional[float] = None
) -> tuple[list[int], int, list[int], bool]:
    """Lowest-offset-first placement on a skyline (same result as the conflict-list version).

    Parameters
    ----------
    p : Problem
        The compiled buffers (its compressed steps ``step_lo`` / ``step_hi`` are used).
    priority : sequence
        Sort key per buffer index (list of keys or numpy array); among buffers whose lowest
        feasible offset is equal, the smallest key goes first (ties by buffer index).
    deadline : float, optional
        ``time.perf_counter()`` value to finish by. When the buffers left, at the cost per
        heap pop measured so far, would not be done in time, the pass switches to *drop*
        mode: every buffer popped is placed at its current lowest feasible offset even if
        that rose since it was queued (a Tetris drop in heap order, one pop per buffer;
        always valid, possibly leaving gaps).

    Returns
    -------
    (list of int, int, list of int, bool)
        Offset per buffer index (bytes), height (bytes), the placement order, and whether
        the pass stayed exact (False if it switched to drop mode).
    """
    n = p.n
    if n == 0:
        return [], 0, [], True
    t0 = time.perf_counter()
    rank = rank_of(priority)
    by_rank = [0] * n
    for i, r in enumerate(rank):
        by_rank[r] = i
    lo_of, hi_of, size, align = p.step_lo, p.step_hi, p.size, p.align
    unaligned = any(a != 1 for a in align)
    sky = np.zeros(p.num_steps, dtype=np.int64)
    offsets = [-1] * n
    order: list[int] = []
    heap = list(range(n))  # keys low * n + rank, all lows 0
    pop, push, clock = heapq.heappop, heapq.heappush, time.perf_counter
    height = 0
    pops = 0
    exact = True
    while heap:
        pops += 1
        if exact and deadline is not None and pops % CLOCK_EVERY == 0:
            now = clock()
            # Drop mode costs about one pop per buffer left; keep a 50 % margin.
            if now + 1.5 * len(heap) * (now - t0) / pops > deadline:
                exact = False
        low, r = divmod(pop(heap), n)
        u = by_rank[r]
        s, e = lo_of[u], hi_of[u]
        floor = int(sky[s:e].max())
        if unaligned:
            a = align[u]
            floor = -(-floor // a) * a
        if floor != low:  # the skyline rose over u since it was queued
            if exact:
                push(heap, floor * n + r)
                continue
            low = floor
        top = low + size[u]
        sky[s:e] = top
        offsets[u] = low
        order.append(u)
        if top > height:
            height = top
    return offsets, height, order, exact
