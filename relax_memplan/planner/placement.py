"""Placement core shared by all algorithms: put buffers one by one into an arena.

Every algorithm of this package is an *order* of the buffers fed to one placement routine,
the greedy heap simulation used by the XLA heap simulator (``GlobalDecreasingSizeBestFit``)
and by TFLite's offset planners (Pisarchyk & Lee 2020, "Efficient Memory Management for
Deep Neural Net Inference"): each buffer goes into a gap between the already placed
buffers that are live at a common step, either the lowest gap that fits (first fit) or the
smallest gap that fits (best fit), else above them all. Offsets are rounded up to the
buffer's alignment.

:meth:`Problem.place_lowest_first` builds the order on the fly instead: it repeatedly places,
among all unplaced buffers, one that can go lowest (ties broken by a priority). Its result
lists buffers in non-decreasing offset order, the "canonical" solutions that MiniMalloc
(Moffitt, ASPLOS 2023) searches over; this code is a greedy single descent, not its search.

:class:`Problem` compiles the buffers once into flat lists. The time-conflict graph is
built on first use by a sweep over start steps (buffers starting inside another's live
range form a contiguous run in start order), so a placement only looks at time-overlapping
buffers; on large graphs with many overlapping pairs (``Problem.sweep``) lowest-first runs on
a skyline over time instead (:mod:`.skyline`) and the graph is never built.
"""

from __future__ import annotations

import heapq
from bisect import bisect_left
from typing import Optional, Sequence

import numpy as np

from .buffer import (Buffer, check_unique_ids, live_peak_of_arrays, peak_live_bytes,
                     sorted_distinct)
from .compiled import compiled_sweep
from .skyline import lowest_first_sweep, rank_of

__all__ = ["Problem", "FIRST_FIT", "BEST_FIT"]

FIRST_FIT = "first_fit"
BEST_FIT = "best_fit"


class Problem:
    """Buffers compiled for repeated placement.

    Parameters
    ----------
    buffers : sequence of Buffer
        Buffers with unique ids; index ``i`` below refers to ``buffers[i]``.

    Attributes
    ----------
    start, end, size, align : list of int
        Live range (steps), size and alignment (bytes) per buffer index.
    conflicts : list of list of int
        Indices of the buffers whose live range intersects buffer ``i``'s (lazy).
    sweep : bool
        Whether :meth:`lowest_first` uses the skyline instead of ``conflicts``.
    jit : bool
        Whether the skyline sweep runs compiled (:func:`~.compiled.compiled_sweep`, the
        same plans) rather than in Python.
    lower_bound : int
        :func:`peak_live_bytes` of the buffers, in bytes.
    """

    def __init__(self, buffers: Sequence[Buffer]):
        check_unique_ids(buffers)
        self.buffers = list(buffers)
        self.n = len(self.buffers)
        self.start = [b.start for b in self.buffers]
        self.end = [b.end for b in self.buffers]
        self.size = [b.size_bytes for b in self.buffers]
        self.align = [b.alignment_bytes for b in self.buffers]
        #: Sizes as int64 when their sum fits in 2**61 bytes (else None: Python ints).
        self._size_np: Optional[np.ndarray] = None
        #: Start and end steps as int64 arrays (built once, also for ``step_arrays``).
        self._ends_np: Optional[tuple[np.ndarray, np.ndarray]] = None
        if sum(self.size) < 1 << 61:
            self._size_np = np.asarray(self.size, dtype=np.int64)
            self._ends_np = (np.asarray(self.start, dtype=np.int64),
                             np.asarray(self.end, dtype=np.int64))
            self.lower_bound = live_peak_of_arrays(*self._ends_np, self._size_np)
        else:  # beyond int64
            self.lower_bound = peak_live_bytes(self.buffers)
        self._conflicts: Optional[list[list[int]]] = None
        self._steps: Optional[tuple[np.ndarray, np.ndarray, int]] = None
        self._step_lists: Optional[tuple[list[int], list[int]]] = None
        #: Place lowest-first on the skyline (:mod:`.skyline`) instead of conflict lists.
        self.sweep = False
        #: Run the skyline sweep compiled (:mod:`.compiled`; set by ``plan()``).
        self.jit = False

    @property
    def conflicts(self) -> list[list[int]]:
        """Indices of the buffers whose live range intersects buffer ``i``'s (built once).

        Built on first use by a sweep over start steps; ``O(n + pairs)`` time and memory,
        so the large-instance path (:mod:`.skyline`) never asks for it.
        """
        if self._conflicts is None:
            n = self.n
            by_start = sorted(range(n), key=self.start.__getitem__)
            starts = [self.start[i] for i in by_start]
            conflicts: list[list[int]] = [[] for _ in range(n)]
            for pos, i in enumerate(by_start):
                later = by_start[pos + 1 : bisect_left(starts, self.end[i], pos + 1)]
                if later:
                    conflicts[i].extend(later)
                    for j in later:
                        conflicts[j].append(i)
            self._conflicts = conflicts
        return self._conflicts

    @property
    def step_arrays(self) -> tuple[np.ndarray, np.ndarray, int]:
        """``(step_lo, step_hi, num_steps)`` with the per-buffer steps as int64 arrays.

        Compressed steps index the distinct start/end steps; buffer ``i`` covers compressed
        steps ``[step_lo[i], step_hi[i])``.
        """
        if self._steps is None:
            start, end = self._ends_np or (np.asarray(self.start, dtype=np.int64),
                                           np.asarray(self.end, dtype=np.int64))
            steps = sorted_distinct(np.concatenate([start, end]))
            self._steps = (np.searchsorted(steps, start), np.searchsorted(steps, end),
                           max(len(steps) - 1, 0))
        return self._steps

    def _step_list(self, k: int) -> list[int]:
        if self._step_lists is None:
            lo, hi, _ = self.step_arrays
            self._step_lists = (lo.tolist(), hi.tolist())
        return self._step_lists[k]

    @property
    def step_lo(self) -> list[int]:
        """First compressed step of each buffer (index into the distinct start/end steps)."""
        return self._step_list(0)

    @property
    def step_hi(self) -> list[int]:
        """Compressed step one past each buffer's last; ``[step_lo, step_hi)`` is its range."""
        return self._step_list(1)

    @property
    def num_steps(self) -> int:
        """Number of compressed steps (distinct start/end steps minus one)."""
        return self.step_arrays[2]

    def count_overlapping_pairs(self) -> int:
        """Number of time-overlapping buffer pairs, counted with numpy in ``O(n log n)``.

        The size of :attr:`conflicts` is twice this; :func:`~.portfolio.plan` uses it to
        decide whether building the lists pays off. Counted on the compressed steps of
        :attr:`step_arrays` (which the skyline needs anyway): same order, same pairs.
        """
        lo, hi, num_steps = self.step_arrays
        start = np.sort(lo)
        # For each buffer i: the buffers j that start in [start_i, end_i), minus i itself;
        # a pair (i, j) with start_i < start_j is counted exactly once this way, a pair
        # with equal starts twice: subtract those.
        counted = int((np.searchsorted(start, hi, "left")
                       - np.searchsorted(start, lo, "left")).sum()) - self.n
        same = np.bincount(lo, minlength=num_steps + 1)  # buffers per start step
        return counted - int((same * (same - 1) // 2).sum())

    def offsets_by_id(self, offsets: Sequence[int]) -> dict[str, int]:
        """Map a list of offsets by buffer index to a dict keyed by buffer id."""
        return {b.id: off for b, off in zip(self.buffers, offsets)}

    def height(self, offsets: Sequence[int]) -> int:
        """Max of ``offset + size`` over buffers (0 if none), in bytes (numpy when the sums
        fit in int64, exact Python ints otherwise)."""
        if self.n and self._size_np is not None:
            off = np.asarray(offsets, dtype=object if max(offsets) >= 1 << 61 else np.int64)
            if off.dtype == np.int64:
                return int((off + self._size_np).max())
        return max(map(int.__add__, offsets, self.size), default=0)

    def place(self, order: Sequence[int], fit: str = BEST_FIT) -> tuple[list[int], int]:
        """Place buffers greedily in ``order``.

        Parameters
        ----------
        order : sequence of int
            A permutation of ``range(n)``: the placement order.
        fit : {"best_fit", "first_fit"}
            Choose the smallest gap that fits (TFLite / XLA best fit) or the lowest one.

        Returns
        -------
        (list of int, int)
            Offset per buffer index (bytes) and the resulting height (bytes).
        """
        offsets = [-1] * self.n
        tops = [0] * self.n
        self.place_into(order, offsets, tops, fit == BEST_FIT)
        return offsets, max(tops, default=0)

    def place_into(self, order, offsets, tops, best_fit: bool) -> None:
        """Place the buffers of ``order`` given the already placed ones (offset >= 0).

        ``offsets`` and ``tops`` (offset + size) are lists by buffer index, updated in place;
        unplaced buffers have offset -1.
        """
        size, align, conflicts = self.size, self.align, self.conflicts
        for i in order:
            s = size[i]
            a = align[i]
            busy = sorted([(offsets[j], tops[j]) for j in conflicts[i] if offsets[j] >= 0])
            cand = 0  # lowest aligned offset above all busy intervals seen so far
            best = -1
            best_gap = 0
            for lo, hi in busy:
                if lo - cand >= s:
                    if not best_fit:
                        best = cand
                        break
                    gap = lo - cand
                    if best < 0 or gap < best_gap:
                        best, best_gap = cand, gap
                if hi > cand:
                    cand = hi if a == 1 else -(-hi // a) * a
            if best < 0:
                best = cand
            offsets[i] = best
            tops[i] = best + s

    def lowest_first(
        self, priority: Sequence, deadline: Optional[float] = None
    ) -> tuple[list[int], int, list[int], bool]:
        """Lowest-first placement on the conflict lists or, if ``self.sweep``, the skyline.

        Returns offsets by index, height, placement order and whether the pass was exact
        (see :func:`~relax_memplan.planner.skyline.lowest_first_sweep`; the conflict-list
        version ignores ``deadline`` and is always exact).
        """
        if self.sweep:
            sweep = compiled_sweep if self.jit else lowest_first_sweep
            return sweep(self, priority, deadline)
        return (*self.place_lowest_first(priority), True)

    def place_lowest_first(self, priority: Sequence) -> tuple[list[int], int, list[int]]:
        """Place repeatedly the unplaced buffer that fits at the lowest offset.

        Parameters
        ----------
        priority : sequence
            Sort key per buffer index; among buffers whose lowest feasible offset is equal,
            the smallest key goes first (ties between keys by buffer index).

        Returns
        -------
        (list of int, int, list of int)
            Offset per buffer index (bytes), height (bytes) and the placement order. Placing
            that order with first fit reproduces the same offsets.
        """
        n, size, align, conflicts = self.n, self.size, self.align, self.conflicts
        rank = rank_of(priority).tolist()
        by_rank = [0] * n
        for i, r in enumerate(rank):
            by_rank[r] = i
        # Buffers are placed in non-decreasing offset order, so every placed neighbour of an
        # unplaced buffer starts at or below the current floor: once a buffer's lowest spot
        # is taken, its next feasible offset is simply above all its placed neighbours.
        ceiling = [0] * n  # max top of placed time-overlapping buffers
        low = [0] * n  # lowest feasible offset given the placed buffers
        offsets = [-1] * n
        order = []
        heap = list(range(n))  # keys low * n + rank, low possibly stale (too small)
        pop, push = heapq.heappop, heapq.heappush
        height = 0
        while heap:
            lo_u, r = divmod(pop(heap), n)
            u = by_rank[r]
            if lo_u != low[u]:
                # Heap keys are lower bounds of low[] (raised lazily below): requeue.
                push(heap, low[u] * n + r)
                continue
            top = lo_u + size[u]
            offsets[u] = lo_u
            order.append(u)
            if top > height:
                height = top
            for v in conflicts[u]:
                if offsets[v] >= 0:
                    continue
                if top > ceiling[v]:
                    ceiling[v] = top
                if low[v] < top:  # low[v] >= lo_u, so u covers v's lowest spot
                    a = align[v]
                    c = ceiling[v]
                    low[v] = c if a == 1 else -(-c // a) * a
        return offsets, height, order
