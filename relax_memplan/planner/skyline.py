"""Lowest-first placement without pairwise conflict lists: a skyline of segments over time.

:meth:`Problem.place_lowest_first <relax_memplan.planner.placement.Problem.place_lowest_first>`
places buffers in non-decreasing offset order, so the lowest feasible offset of an unplaced
buffer is the highest top of the placed buffers live during its range: the *skyline*
maximised over the buffer's steps. This module runs the same greedy on the skyline kept as
*segments*, maximal runs of compressed steps (the distinct start/end steps) of equal height,
the bottom-left "skyline" of strip packing (Burke, Kendall & Whitwell 2004):

1. take the lowest segment ``[a, b)`` at height ``h`` (a heap, leftmost on ties);
2. among the unplaced buffers whose whole live range lies in ``[a, b)``, place the one of
   smallest priority key at ``h`` (rounded up to its alignment); the segment splits into
   up to three: ``[a, lo)`` and ``[hi, b)`` at ``h``, ``[lo, hi)`` at the buffer's top;
3. if none fits, no unplaced buffer can go as low as ``h``: raise the segment to its lower
   neighbour and merge with it.

Every buffer whose lowest feasible offset is ``h`` lies inside a segment of height ``h``
(its neighbours are higher), so with alignment 1 this is lowest-first up to how ties
between equal-height segments are broken. A step either places a buffer or removes a
segment, so there are at most ``3 n`` queries (plus stale heap entries skipped): the
unplaced buffers starting in ``[a, b)`` are a slice of the buffers sorted by start
(:class:`~.candidates.StartIndex`), scanned inline when short; longer slices first look at
the smallest end step per block of positions, so a query where nothing ends by ``b`` fails
without reading a buffer, and only the blocks holding one are scanned. Placed buffers are
dropped from the sorted arrays whenever they make up a quarter of them. When the ranks
follow the start order (``lowest_first_by_start``), the first buffer of the slice that fits
has the smallest rank and the scan stops there. The earlier version of this module kept a
heap of buffers and re-checked every buffer whose lowest offset had risen since it was
queued: 6.2 million checks for pangu_2.6B's 18,692 buffers, against 44,000 queries here.

A pass can be given a deadline: when it is so close that only *dropping* the buffers left
still fits, they go into the size-class lanes of :mod:`.lanes`, stacked above the buffers
placed so far (about 1 us per buffer, valid). A pass can also be told to place only the
``count`` buffers of smallest priority (largest area) and drop the rest: at a quarter of
the buffers that gives 1.09 / 1.11 / 1.34 x LB on pangu_2.6B / S_1 / random 100k with the
lanes (the earlier drop on top of the skyline, one numpy slice per buffer, about 3 us:
1.18 / 1.11 / 1.69; a pass cut at the same point 9.1 / 1.9 / 2.1). A pass with a deadline
also measures its own speed (once ``MEASURE_SHARE`` of its buffers are placed) and, when it
cannot place them all in time, keeps lowest-first only the smallest ranks it can afford
(:func:`_affordable`), the rest going to the lanes: the ``count`` chosen as it goes.
"""

from __future__ import annotations

import heapq
import time
from typing import Optional, Sequence

import numpy as np

from .candidates import BLOCK_BITS, StartIndex
from .lanes import lane_offsets

__all__ = ["lowest_first_sweep", "rank_of"]

#: A pass looks at the clock once per this many steps.
CLOCK_EVERY = 1024
#: A pass judges its speed only after placing this share of its buffers: the first
#: placements are the slowest (wide segments, long candidate slices): measured earlier,
#: Y_1's pass is cut short under load (1 s budget, load 5: lanes 1.0524 x LB, against
#: 1.02-1.04 measured at this share).
MEASURE_SHARE = 0.125
#: When a pass measures that it cannot place all its buffers in time, it keeps this share
#: of the number it can afford (the speed varies on a shared machine).
AFFORD_SHARE = 0.9
#: Candidate slices up to ``INLINE_SCAN_MAX`` buffers are scanned inline, and so are those
#: up to ``INLINE_SCAN_LONG`` with at most ``DENSE_SLICE`` buffers starting per step of the
#: segment; the others go through the block minima of :class:`~.candidates.StartIndex`.
#: Dense slices are where the block minima pay: many buffers start in a narrow segment and
#: end past it (random 100k, one pass by area: 1.24 -> 1.11 s CPU); on sparse ones the
#: inline scan is cheaper (random 10k: 0.072 s inline up to 64, 0.077 s through the blocks
#: from 16). Measured at load 4 on 2 cores: ranges, not points.
INLINE_SCAN_MAX = 16
INLINE_SCAN_LONG = 64
DENSE_SLICE = 4
#: The sorted arrays are compacted when placed buffers exceed this share of them.
COMPACT_SHARE = 0.25
#: Cost of dropping one buffer into the lanes, kept from the deadline: at least this many
#: seconds, and at least this share of the time per buffer placed so far (lanes: 0.074 s
#: CPU for random 100k buffers, a tenth of a placement; the share follows a slow machine).
DROP_SECONDS_PER_BUFFER = 2e-6
DROP_SHARE = 0.15


def rank_of(priority: Sequence) -> np.ndarray:
    """Rank of each buffer index when sorted by ``priority`` (ties by index), as an array.

    ``priority`` may be a list of sort keys or a numpy array (sorted with a stable argsort).
    """
    n = len(priority)
    if isinstance(priority, np.ndarray):
        by_rank = np.argsort(priority, kind="stable")
    else:
        by_rank = np.asarray(sorted(range(n), key=priority.__getitem__), dtype=np.int64)
    rank = np.empty(n, dtype=np.int64)
    rank[by_rank] = np.arange(n, dtype=np.int64)
    return rank


def lowest_first_sweep(
    p, priority: Sequence, deadline: Optional[float] = None, count: Optional[int] = None
) -> tuple[list[int], int, list[int], bool]:
    """Lowest-offset-first placement on a skyline of segments (see the module docstring).

    Parameters
    ----------
    p : Problem
        The compiled buffers (its compressed steps are used).
    priority : sequence
        Sort key per buffer index (list of keys or numpy array); among the buffers that fit
        in the lowest segment, the smallest key goes first (ties by buffer index).
    deadline : float, optional
        ``time.perf_counter()`` value to finish by; past it the buffers left are dropped
        into size-class lanes above the placed ones (valid, possibly leaving gaps).
    count : int, optional
        Place only the ``count`` buffers of smallest priority lowest-first, then drop the
        others (a pass that fits a short budget; see :func:`~.portfolio.plan`).

    Returns
    -------
    (list of int, int, list of int, bool)
        Offset per buffer index (bytes), height (bytes), the placement order, and whether
        the pass finished without dropping buffers.
    """
    n = p.n
    if n == 0:
        return [], 0, [], True
    lo_np, hi_np, num_steps = p.step_arrays
    count = n if count is None else max(0, min(count, n))
    rank = rank_of(priority)
    cands = StartIndex(lo_np, hi_np, rank, num_steps, count)
    size, align = p.size, p.align
    # Segments by first step: end step, height, previous segment's first step, alive.
    seg_end = [0] * (num_steps + 1)
    seg_h = [0] * (num_steps + 1)
    seg_prev = [-1] * (num_steps + 1)
    alive = [False] * (num_steps + 1)
    seg_end[0], alive[0] = num_steps, True
    width = num_steps + 1
    heap = [0]  # keys height * width + first step; stale entries skipped
    pop, push, clock = heapq.heappop, heapq.heappush, time.perf_counter
    offsets = [-1] * n
    order: list[int] = []
    height = steps = 0
    compact_at = COMPACT_SHARE * n + 64
    started = clock()
    first_at, c_hi, c_rank, block_min = cands.views()
    monotone = cands.monotone
    while len(order) < count:
        steps += 1
        if deadline is not None and steps % CLOCK_EVERY == 1:
            now = clock()
            if _must_drop(now, started, len(order), n, deadline):
                break
            keep = _affordable(now, started, len(order), count, n, deadline)
            if keep is not None:  # too slow to place them all: keep the smallest ranks
                keep = min(keep, count - len(order))
                cands.restrict(keep)
                count = len(order) + keep
                compact_at = COMPACT_SHARE * len(cands.rank) + 64
                first_at, c_hi, c_rank, block_min = cands.views()
        h, a = divmod(pop(heap), width)
        if not alive[a] or seg_h[a] != h:
            continue
        b = seg_end[a]
        if cands.placed > compact_at:
            cands.compact()
            compact_at = COMPACT_SHARE * len(cands.rank) + 64
            first_at, c_hi, c_rank, block_min = cands.views()
        ia, ib = first_at[a], first_at[b]
        k = -1
        if ib - ia > INLINE_SCAN_MAX and (ib - ia > INLINE_SCAN_LONG
                                          or ib - ia > DENSE_SLICE * (b - a)):
            # Nothing ends by b when every block minimum of the slice is past it.
            if min(block_min[ia >> BLOCK_BITS:((ib - 1) >> BLOCK_BITS) + 1]) <= b:
                k = cands.best_between(ia, ib, b)
        elif monotone:  # the first buffer inside [a, b) has the smallest rank, inlined
            for q in range(ia, ib):
                if c_hi[q] <= b:
                    k = q
                    break
        else:  # the smallest-rank buffer inside [a, b), inlined
            best = n
            for q in range(ia, ib):
                if c_rank[q] < best and c_hi[q] <= b:
                    best, k = c_rank[q], q
        if k < 0:  # nothing fits at h: raise the segment to its lower neighbour, merge
            left = seg_prev[a]
            new_h = seg_h[b] if b < num_steps else seg_h[left]
            if left >= 0 and seg_h[left] < new_h:
                new_h = seg_h[left]
            seg_h[a] = new_h
            if b < num_steps and seg_h[b] == new_h:
                alive[b] = False
                b = seg_end[a] = seg_end[b]
                if b < num_steps:
                    seg_prev[b] = a
            if left >= 0 and seg_h[left] == new_h:
                alive[a] = False
                seg_end[left] = b
                if b < num_steps:
                    seg_prev[b] = left
                continue  # the left segment's entry at new_h is in the heap already
            push(heap, new_h * width + a)
            continue
        u, s, e = cands.index[k], cands.lo[k], c_hi[k]
        cands.remove(k)
        al = align[u]
        off = h if al == 1 else -(-h // al) * al
        top = off + size[u]
        offsets[u] = off
        order.append(u)
        if top > height:
            height = top
        # Left remainder [a, s) at h, or the segment before a as the middle's left neighbour.
        if s > a:
            seg_end[a] = s
            push(heap, h * width + a)
            left = a
        else:
            alive[a] = False
            left = seg_prev[a]
        if left >= 0 and left != a and seg_h[left] == top:
            mid = left  # the buffer's top continues the segment on its left
        else:
            mid = s
            alive[s], seg_h[s], seg_prev[s] = True, top, left
        if e < b:  # right remainder [e, b) at h
            alive[e], seg_h[e], seg_end[e], seg_prev[e] = True, h, b, mid
            if b < num_steps:
                seg_prev[b] = e
            push(heap, h * width + e)
            seg_end[mid] = e
        else:
            if b < num_steps and seg_h[b] == top:
                alive[b] = False
                b = seg_end[b]
            seg_end[mid] = b
            if b < num_steps:
                seg_prev[b] = mid
        if mid == s:
            push(heap, top * width + s)
    if len(order) < n:
        height = _lanes_for_rest(p, offsets, order, height)
        return offsets, height, order, False
    return offsets, height, order, True


def _must_drop(now: float, started: float, placed: int, n: int, deadline: float,
               drop_s: float = DROP_SECONDS_PER_BUFFER) -> bool:
    """Whether only dropping the buffers left (at least ``drop_s`` seconds each) still ends
    before ``deadline``."""
    per_buffer = drop_s
    if placed >= CLOCK_EVERY:  # enough placements to measure this machine's speed
        per_buffer = max(per_buffer, DROP_SHARE * (now - started) / placed)
    return now + per_buffer * (n - placed) > deadline


def _affordable(now: float, started: float, placed: int, count: int, n: int,
                deadline: float, drop_s: float = DROP_SECONDS_PER_BUFFER) -> Optional[int]:
    """How many more buffers the pass can place lowest-first and still drop the rest into
    the lanes before ``deadline``, at the speed measured so far; None if all of them."""
    if placed < max(CLOCK_EVERY, MEASURE_SHARE * count):
        return None
    per = (now - started) / placed
    drop = max(drop_s, DROP_SHARE * per)
    left = deadline - now - (n - placed) * drop
    if (count - placed) * (per - drop) <= left:
        return None
    return max(0, int(AFFORD_SHARE * left / (per - drop)))


def _lanes_for_rest(p, offsets, order, height) -> int:
    """Put the unplaced buffers in size-class lanes above ``height``; return the height."""
    rest = [u for u in range(p.n) if offsets[u] < 0]
    lo, hi, _ = p.step_arrays
    pick = np.asarray(rest, dtype=np.int64)
    size, align = p.size, p.align
    placed = lane_offsets(lo[pick], hi[pick], [size[u] for u in rest], [align[u] for u in rest],
                          base_bytes=height)
    for u, off in zip(rest, placed):
        offsets[u] = off
        if off + size[u] > height:
            height = off + size[u]
    order.extend(rest)
    return height
