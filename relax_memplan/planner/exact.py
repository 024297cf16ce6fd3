"""Exact search for small hard problems: branch and bound over canonical placements.

After Moffitt, "MiniMalloc: A Lightweight Memory Allocator for Hardware-Accelerated Machine
Learning" (ASPLOS 2023). The decision problem "do all buffers fit below ``capacity``
bytes?" is searched depth first over *canonical* solutions: every buffer sits at its
lowest feasible offset given the buffers placed before it (the max top of the placed
time-overlapping ones, aligned), and buffers are placed in non-decreasing
``(offset, preorder index)`` order, so each solution is reached once. Pruning:

* **canonical order**: a buffer whose ``(offset, preorder)`` is below the last placed
  one's is skipped (that solution is reached on another branch);
* **dominance**: a buffer whose offset is at or above the lowest *top* any unplaced buffer
  could reach is skipped (that buffer would fit in the gap below, so the branch leaves an
  unnecessary gap);
* **section inference**: at every compressed step (section) the floor (max of the last
  offset, the tops placed there and the lowest offset of its unplaced buffers) plus the
  total size of its unplaced buffers must stay within ``capacity``.

The preorder heuristics (``WAT``, ``TAW``, ``TWA``: section width, area, section total)
take turns with a node limit that doubles per round, as in MiniMalloc. :func:`exact_offsets`
first asks for the lower bound, then bisects between the capacities proven infeasible and
the best height known. Pure Python on conflict lists: meant for hundreds of buffers.
"""

from __future__ import annotations

import sys
import time
from typing import Optional, Sequence

__all__ = ["exact_offsets", "solve_capacity", "FOUND", "INFEASIBLE", "UNKNOWN"]

FOUND, INFEASIBLE, UNKNOWN = "found", "infeasible", "unknown"
#: Preordering heuristics: letters W (sections spanned), A (area), T (max section total),
#: each sorted largest first.
HEURISTICS = ("WAT", "TAW", "TWA")


class _NodeLimit(Exception):
    pass


class _Deadline(Exception):
    pass


class _Search:
    """Depth-first search of canonical placements below one capacity."""

    def __init__(self, p, capacity: int, deadline: float):
        self.p, self.capacity, self.deadline = p, capacity, deadline
        self.n = n = p.n
        self.lo_of, self.hi_of = p.step_lo, p.step_hi
        self.members = [[] for _ in range(p.num_steps)]
        for i in range(n):
            for s in range(self.lo_of[i], self.hi_of[i]):
                self.members[s].append(i)
        self.nodes = 0
        self.node_limit = 0

    def preorder(self, heuristic: str) -> list[int]:
        p = self.p
        total0 = [sum(p.size[i] for i in m) for m in self.members]
        feature = {}
        for i in range(self.n):
            lo, hi = self.lo_of[i], self.hi_of[i]
            feature[i] = {
                "W": hi - lo,
                "A": p.size[i] * (p.end[i] - p.start[i]),
                "T": max(total0[lo:hi]),
            }
        return sorted(range(self.n), key=lambda i: tuple(-feature[i][c] for c in heuristic))

    def run(self, heuristic: str, node_limit: int) -> Optional[list[int]]:
        """Search with one preorder; raises _NodeLimit / _Deadline, returns None if none."""
        p = self.p
        self.pidx = [0] * self.n
        for k, i in enumerate(self.preorder(heuristic)):
            self.pidx[i] = k
        self.offsets = [-1] * self.n
        self.low = [0] * self.n
        self.floor = [0] * p.num_steps
        self.total = [sum(p.size[i] for i in m) for m in self.members]
        self.nodes, self.node_limit = 0, node_limit
        return self._search(0, -1)

    def _search(self, min_offset: int, min_pidx: int) -> Optional[list[int]]:
        self.nodes += 1
        if self.nodes > self.node_limit:
            raise _NodeLimit
        if self.nodes % 16 == 0 and time.perf_counter() > self.deadline:
            raise _Deadline
        p, offsets, low, pidx = self.p, self.offsets, self.low, self.pidx
        size, align, conflicts = p.size, p.align, p.conflicts
        todo = sorted((low[i], pidx[i], i) for i in range(self.n) if offsets[i] < 0)
        if not todo:
            return list(offsets)
        min_height = min(off + size[i] for off, _, i in todo)
        floor, total, lo_of, hi_of, cap = self.floor, self.total, self.lo_of, self.hi_of, self.capacity
        for off, k, i in todo:
            if off >= min_height:
                break  # dominance: sorted by offset, so all later ones too
            if off < min_offset or (off == min_offset and k < min_pidx):
                continue  # canonical order
            top = off + size[i]
            if top > cap:
                continue
            offsets[i] = off
            low_changes = []
            for j in conflicts[i]:
                if offsets[j] < 0 and low[j] < top:
                    low_changes.append((j, low[j]))
                    a = align[j]
                    low[j] = top if a == 1 else -(-top // a) * a
            floor_changes = []
            lo, hi = lo_of[i], hi_of[i]
            for s in range(lo, hi):
                floor_changes.append((s, floor[s]))
                floor[s] = top
                total[s] -= size[i]
            # A section's floor is at least the lowest offset of its unplaced buffers.
            touched = set()
            for j, _ in low_changes:
                touched.update(range(lo_of[j], hi_of[j]))
            for s in touched:
                m = min((low[j] for j in self.members[s] if offsets[j] < 0), default=None)
                if m is not None and floor[s] < m:
                    floor_changes.append((s, floor[s]))
                    floor[s] = m
            ok = True
            for s in range(len(floor)):
                f = floor[s] if floor[s] > off else off
                if f + total[s] > cap:
                    ok = False
                    break
            found = self._search(off, k) if ok else None
            for s, old in reversed(floor_changes):
                floor[s] = old
            for s in range(lo, hi):
                total[s] += size[i]
            for j, old in reversed(low_changes):
                low[j] = old
            offsets[i] = -1
            if found is not None:
                return found
        return None


def solve_capacity(p, capacity: int, deadline: float) -> tuple[str, Optional[list[int]]]:
    """Decide whether all buffers fit below ``capacity`` bytes, before ``deadline``.

    Parameters
    ----------
    p : Problem
        Compiled buffers (its conflict lists are built if needed).
    capacity : int
        Arena size to fit in, bytes.
    deadline : float
        ``time.perf_counter()`` value at which to give up.

    Returns
    -------
    (str, list of int or None)
        ``(FOUND, offsets)``, ``(INFEASIBLE, None)`` when the search space was exhausted
        (a proof that no plan fits), or ``(UNKNOWN, None)`` at the deadline.
    """
    if p.n == 0:
        return FOUND, []
    if p.lower_bound > capacity:
        return INFEASIBLE, None
    search = _Search(p, capacity, deadline)
    old_limit = sys.getrecursionlimit()
    sys.setrecursionlimit(max(old_limit, 4 * p.n + 200))
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
