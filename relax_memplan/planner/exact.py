"""Exact search for small hard problems: branch and bound over canonical placements.

The ideas are those of Moffitt, "MiniMalloc: A Lightweight Memory Allocator for
Hardware-Accelerated Machine Learning" (ASPLOS 2024); the code is our own, written for
Python with numpy state. The decision problem "do all buffers fit below ``capacity``
bytes?" is searched depth first over *canonical* solutions: every buffer sits at its
lowest feasible offset given the buffers placed before it (the max top of the placed
time-overlapping ones, aligned), and buffers are placed in non-decreasing
``(offset, preorder index)`` order, so each solution is reached once.

Time is cut into *sections*, the maximal cliques of the interval graph (the sets of
buffers live just before a buffer dies); two buffers overlap in time exactly when they
share a section, and a buffer spans a contiguous run of sections. State, in numpy arrays
updated and undone by slices per placement: the lowest offset of every unplaced buffer
(``min_offset``), per section the top of the placed buffers (``floor``), the total size
of its unplaced buffers (``total``) and the number of unplaced buffers crossing into the
next section (``cuts``). Pruning:

* **canonical order**: a buffer whose ``(offset, preorder)`` is below the last placed
  one's is skipped (that solution is reached on another branch);
* **dominance**: a buffer whose offset is at or above the lowest *top* any unplaced buffer
  could reach is skipped (that buffer would fit in the gap below it);
* **section inference**: in every section the floor (max of the last offset, the placed
  tops and the lowest ``min_offset`` of its unplaced buffers, one ``minimum.reduceat``)
  plus the total size of its unplaced buffers must stay within ``capacity``; since a
  placement at ``offset`` lifts every floor to ``offset`` at least, the buffers with
  ``offset + max total > capacity`` are filtered out before any is placed (numpy, per
  node), and a node where some unplaced buffer's lowest top exceeds ``capacity`` fails;
* **failed states**: a state (unplaced buffers, section floors under them) that failed
  under a looser canonical bound fails again (a 128-bit digest per state, per preorder,
  kept across node-limit rounds);
* **decomposition**: when no unplaced buffer crosses between two sections any more, the
  two sides are independent and are solved one after the other (a failure on one side
  never re-searches the other).

The preorder heuristics (``WAT``, ``TAW``, ``TWA``: sections spanned, area, section total)
take turns with a node limit that doubles per round, as in MiniMalloc. :func:`exact_offsets`
first asks for the lower bound, then bisects between the capacities proven infeasible and
the best height known. Meant for hundreds of buffers (about 15,000 nodes per CPU second on
MiniMalloc's G, 308 buffers).
"""

from __future__ import annotations

import hashlib
import sys
import time
from typing import Callable, Optional, Sequence

import numpy as np

__all__ = ["exact_offsets", "solve_capacity", "sections_of", "FOUND", "INFEASIBLE",
           "UNKNOWN"]

FOUND, INFEASIBLE, UNKNOWN = "found", "infeasible", "unknown"
#: Preordering heuristics: letters W (sections spanned), A (area), T (max section total),
#: each sorted largest first.
HEURISTICS = ("WAT", "TAW", "TWA")
#: The search looks at the clock once per this many nodes.
CLOCK_EVERY = 64
#: Failed search states remembered per preorder (about 200 bytes each).
MAX_STATES = 500_000


class _NodeLimit(Exception):
    pass


class _Deadline(Exception):
    pass


def _digest(*parts: bytes) -> bytes:
    """A 128-bit digest of the byte strings (collisions are out of practical reach)."""
    h = hashlib.blake2b(digest_size=16)
    for part in parts:
        h.update(part)
    return h.digest()


def sections_of(start: Sequence[int], end: Sequence[int]) -> tuple[list[int], list[int], int]:
    """Maximal cliques of the half-open live ranges, as a section range per buffer.

    Returns ``(first, stop, count)``: buffer ``i`` is live in sections
    ``first[i] .. stop[i] - 1``; two buffers overlap in time exactly when their ranges of
    sections intersect. A section is closed at each death that follows a birth.
    """
    n = len(start)
    events = sorted([(end[i], 0, i) for i in range(n)] + [(start[i], 1, i) for i in range(n)])
    first, stop = [0] * n, [0] * n
    count, opened = 0, False
    for _, is_start, i in events:
        if is_start:
            first[i], opened = count, True
        else:
            if opened:
                count, opened = count + 1, False
            stop[i] = count
    return first, stop, count


class _Search:
    """Depth-first search of canonical placements below one capacity."""

    def __init__(self, p, capacity: int, deadline: float, clock=time.perf_counter):
        self.capacity, self.deadline, self.clock = capacity, deadline, clock
        self.n = n = p.n
        self.size = np.asarray(p.size, dtype=np.int64)
        self.size_l = list(p.size)
        self.align = np.asarray(p.align, dtype=np.int64)
        self.aligned = bool((self.align == 1).all())
        self.area = [p.size[i] * (p.end[i] - p.start[i]) for i in range(n)]
        first, stop, self.num_sections = sections_of(p.start, p.end)
        self.first, self.stop = first, stop
        self.first_np = np.asarray(first, dtype=np.int64)
        self.stop_np = np.asarray(stop, dtype=np.int64)
        self.overlaps = [np.asarray(c, dtype=np.int64) for c in p.conflicts]
        # (section, buffer) pairs sorted by section, for the per-section minimum.
        span = self.stop_np - self.first_np
        owner = np.repeat(np.arange(n, dtype=np.int64), span)
        sec = np.concatenate([np.arange(f, s) for f, s in zip(first, stop)]) if n else owner
        order = np.argsort(sec, kind="stable")
        self.pair_buffer = owner[order]
        self.section_ptr = np.searchsorted(sec[order], np.arange(self.num_sections + 1))
        self.total0 = np.bincount(sec, weights=self.size[owner], minlength=self.num_sections
                                  ).astype(np.int64)
        cuts = np.zeros(self.num_sections + 1, dtype=np.int64)
        np.add.at(cuts, self.first_np, 1)
        np.add.at(cuts, self.stop_np - 1, -1)
        self.cuts0 = np.cumsum(cuts)[: max(self.num_sections - 1, 0)]
        self.nodes = 0
        self.node_limit = 0
        self.max_states = MAX_STATES
        self.failed_by_heuristic: dict[str, dict] = {}

    def preorder(self, heuristic: str) -> np.ndarray:
        """Preorder index per buffer (0 first) for one heuristic name."""
        totals = self.total0.tolist()
        feature = {}
        for i in range(self.n):
            lo, hi = self.first[i], self.stop[i]
            feature[i] = {"W": hi - lo, "A": self.area[i], "T": max(totals[lo:hi])}
        by = sorted(range(self.n), key=lambda i: tuple(-feature[i][c] for c in heuristic))
        pidx = np.empty(self.n, dtype=np.int64)
        pidx[by] = np.arange(self.n, dtype=np.int64)
        return pidx

    def run(self, heuristic: str, node_limit: int) -> Optional[list[int]]:
        """Search with one preorder; raises _NodeLimit / _Deadline, returns None if none."""
        self.pidx = self.preorder(heuristic)
        # Failures stay true across node-limit rounds of one preorder.
        self.failed = self.failed_by_heuristic.setdefault(heuristic, {})
        self.min_offset = np.zeros(self.n, dtype=np.int64)
        self.placed = np.zeros(self.n, dtype=bool)
        self.floor = np.zeros(self.num_sections, dtype=np.int64)
        self.total = self.total0.copy()
        self.cuts = self.cuts0.copy()
        self.solution = [-1] * self.n
        self.nodes, self.node_limit = 0, node_limit
        everyone = np.arange(self.n, dtype=np.int64)
        if not self._split(0, self.num_sections, everyone, self.cuts0):
            return None
        return list(self.solution)

    def _split(self, a: int, b: int, bufs: np.ndarray, cuts: np.ndarray) -> bool:
        """Solve sections ``[a, b)`` as independent parts at the zero ``cuts`` (offset a)."""
        zeros = (np.flatnonzero(cuts[: b - a - 1] == 0) + a + 1).tolist()
        if not zeros:
            return self._search(a, b, bufs, 0, -1)
        bounds = [a] + zeros + [b]
        bufs = bufs[~self.placed[bufs]]
        lo, hi = self.first_np[bufs], self.stop_np[bufs]
        for x, y in zip(bounds[:-1], bounds[1:]):
            part = bufs[(lo < y) & (hi > x)]
            if part.size and not self._search(x, y, part, 0, -1):
                return False
        return True

    def _search(self, a: int, b: int, bufs: np.ndarray, last_offset: int, last_pidx: int
                ) -> bool:
        self.nodes += 1
        if self.nodes > self.node_limit:
            raise _NodeLimit
        if self.nodes % CLOCK_EVERY == 0 and self.clock() > self.deadline:
            raise _Deadline
        bufs = bufs[~self.placed[bufs]]
        if not bufs.size:
            return True
        # Dominance by state: the placed buffers matter only through the section floors
        # (the skyline) under the unplaced ones; a state that failed under a looser
        # canonical bound fails again.
        key = self.state_key(a, b, bufs)
        seen = self.failed.get(key)
        if seen is not None and seen <= (last_offset, last_pidx):
            return False
        if self._children(a, b, bufs, last_offset, last_pidx):
            return True
        if seen is None or (last_offset, last_pidx) < seen:
            if len(self.failed) < self.max_states:
                self.failed[key] = (last_offset, last_pidx)
        return False

    def state_key(self, a: int, b: int, bufs: np.ndarray) -> bytes:
        """Digest of what the rest of the search of sections ``[a, b)`` depends on: the
        unplaced buffers ``bufs`` and the section floors (placed tops) where any is left."""
        total = self.total[a:b]
        return _digest(bufs.tobytes(), np.where(total > 0, self.floor[a:b], 0).tobytes())

    def _children(self, a: int, b: int, bufs: np.ndarray, last_offset: int, last_pidx: int
                  ) -> bool:
        """Try every allowed placement of an unplaced buffer of ``bufs``, lowest first."""
        offs = self.min_offset[bufs]
        sizes = self.size[bufs]
        tops = offs + sizes
        cap = self.capacity
        if int(tops.max()) > cap:
            return False  # inference: some buffer can no longer fit
        pidx = self.pidx[bufs]
        # Dominance (a lower top is left unfilled below) and canonical order.
        keep = (offs < tops.min()) & ((offs > last_offset)
                                      | ((offs == last_offset) & (pidx >= last_pidx)))
        # Monotonic floor: a buffer placed at ``off`` lifts every section to ``off`` at
        # least (the ones under it to its top, minus its own size from their totals).
        keep &= offs <= cap - int(self.total[a:b].max())
        idx = np.flatnonzero(keep)
        if not idx.size:
            return False
        order = idx[np.argsort(offs[idx] * self.n + pidx[idx])].tolist()
        offs, pidx, bufs_l, sizes = offs.tolist(), pidx.tolist(), bufs.tolist(), sizes.tolist()
        for q in order:
            off = offs[q]
            if self._place_and_go(a, b, bufs, bufs_l[q], off, off + sizes[q], pidx[q]):
                return True
        return False

    def _place_and_go(self, a, b, bufs, i, off, top, k) -> bool:
        """Place buffer ``i`` at ``off``, search on if the sections allow it, undo."""
        self.solution[i] = off
        mo, floor, total = self.min_offset, self.floor, self.total
        ov = self.overlaps[i]
        old_mo = mo[ov]
        if self.aligned:
            mo[ov] = np.maximum(old_mo, top)
        else:
            al = self.align[ov]
            mo[ov] = np.maximum(old_mo, -(-top // al) * al)
        self.placed[i] = True
        mo[i] = self.capacity  # placed: no lower bound on the section floors
        lo, hi = self.first[i], self.stop[i]
        old_floor = floor[lo:hi].copy()
        floor[lo:hi] = top
        size = self.size_l[i]
        total[lo:hi] -= size
        found = False
        if self._sections_fit(a, b, off):
            cuts = self.cuts[lo:hi - 1]
            cuts -= 1
            if hi - lo > 1 and not cuts.all():
                found = self._split(a, b, bufs, self.cuts[a:b - 1])
            else:
                found = self._search(a, b, bufs, off, k)
            cuts += 1
        total[lo:hi] += size
        floor[lo:hi] = old_floor
        self.placed[i] = False
        mo[i] = off
        mo[ov] = old_mo
        return found

    def _sections_fit(self, a: int, b: int, offset: int) -> bool:
        """Section inference on sections ``[a, b)`` after a placement at ``offset``.

        Placed buffers have ``min_offset == capacity``, so a section with no unplaced
        buffer gets the floor ``capacity`` and total 0.
        """
        pa, pb = self.section_ptr[a], self.section_ptr[b]
        floor = np.minimum.reduceat(self.min_offset[self.pair_buffer[pa:pb]],
                                    self.section_ptr[a:b] - pa)
        np.maximum(floor, self.floor[a:b], out=floor)
        np.maximum(floor, offset, out=floor)
        floor += self.total[a:b]
        return int(floor.max()) <= self.capacity


def solve_capacity(p, capacity: int, deadline: float, clock: Callable[[], float] = time.perf_counter
                   ) -> tuple[str, Optional[list[int]]]:
    """Decide whether all buffers fit below ``capacity`` bytes, before ``deadline``.

    Parameters
    ----------
    p : Problem
        Compiled buffers (its conflict lists are built if needed).
    capacity : int
        Arena size to fit in, bytes.
    deadline : float
        ``clock()`` value at which to give up.
    clock : callable, optional
        The clock of ``deadline``: wall time by default; ``time.process_time`` gives a
        CPU-time budget (benchmarks on a shared machine).

    Returns
    -------
    (str, list of int or None)
        ``(FOUND, offsets)`` (bytes, by buffer index), ``(INFEASIBLE, None)`` when the
        search space was exhausted (a proof that no plan fits), or ``(UNKNOWN, None)`` at
        the deadline.
    """
    if p.n == 0:
        return FOUND, []
    if p.lower_bound > capacity:
        return INFEASIBLE, None
    search = _Search(p, capacity, deadline, clock)
    old_limit = sys.getrecursionlimit()
    sys.setrecursionlimit(max(old_limit, 6 * p.n + 200))
    try:
        node_limit = p.n
        while True:
            node_limit *= 2
            for heuristic in HEURISTICS:
                try:
                    found = search.run(heuristic, node_limit)
                except _NodeLimit:
                    continue
                return (FOUND, found) if found is not None else (INFEASIBLE, None)
    except _Deadline:
        return UNKNOWN, None
    finally:
        sys.setrecursionlimit(old_limit)


def exact_offsets(
    p, best_offsets: Sequence[int], time_limit_s: float
) -> Optional[list[int]]:
    """Lower offsets than ``best_offsets`` by exact search, or None if none found in time.

    Tries the lower bound first (it is often reachable), then bisects the heights between
    the largest capacity proven infeasible and the best height found so far.

    Parameters
    ----------
    p : Problem
        Compiled buffers.
    best_offsets : sequence of int
        A valid plan (bytes, by buffer index); its height is the first upper bound.
    time_limit_s : float
        Wall-clock budget in seconds.

    Returns
    -------
    list of int or None
        Offsets by buffer index (bytes) lower than ``best_offsets``, or None.
    """
    deadline = time.perf_counter() + time_limit_s
    lo, hi = p.lower_bound, p.height(best_offsets)  # hi is feasible; below lo is not
    result = None
    capacity = lo
    while lo < hi and time.perf_counter() < deadline:
        status, offsets = solve_capacity(p, capacity, deadline)
        if status == FOUND:
            result, hi = offsets, p.height(offsets)
        elif status == INFEASIBLE:
            lo = capacity + 1
        else:
            break
        capacity = (lo + hi - 1) // 2 if lo < hi else lo
    return result
