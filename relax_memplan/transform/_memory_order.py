"""Peak live bytes of a dataflow block under a binding order, and orders that lower it.

Private helper of :mod:`relax_memplan.transform.reorder_for_memory`; pure Python on a small
model of the block (no TVM): binding ``k`` allocates ``alloc_bytes[k]`` (0 for views,
rebindings, tuples), reads the storage *roots* in ``uses[k]`` and must follow the bindings
in ``deps[k]``. A root is freed once every binding that reads it has run, unless it is
``pinned`` (it outlives the block). At binding ``k`` its output and all live roots are live
together (the kernel reads its inputs while writing its output), as in the planner's
liveness.

Two schedulers, as in XLA's memory schedulers and Inductor's ``reorder_for_peak_memory``:
a list scheduler that runs, among the ready bindings, the one that frees the most bytes net
of what it allocates (ties: program order), and an exact dynamic program over the sets of
bindings already run (the live bytes after a set do not depend on the order inside it) for
blocks of at most ``exact_max_bindings`` bindings.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Dict, List, Sequence, Set

__all__ = ["BlockModel", "peak_of_order", "list_schedule", "exact_schedule", "is_topological"]


@dataclass
class BlockModel:
    """The memory model of one block.

    Attributes
    ----------
    alloc_bytes : list of int
        Bytes binding ``k`` allocates (its own root; 0 if it allocates nothing).
    uses : list of set of int
        Roots (binding indices) whose storage binding ``k`` reads.
    deps : list of set of int
        Bindings that must run before binding ``k``.
    pinned : set of int
        Roots live until the end of the block (block outputs and their aliases).
    """

    alloc_bytes: List[int]
    uses: List[Set[int]]
    deps: List[Set[int]]
    pinned: Set[int]

    def readers(self) -> Dict[int, int]:
        """Root -> number of bindings that read it."""
        count: Dict[int, int] = {}
        for used in self.uses:
            for r in used:
                count[r] = count.get(r, 0) + 1
        return count


def is_topological(model: BlockModel, order: Sequence[int]) -> bool:
    """Whether ``order`` runs every binding once, each after all of its ``deps``."""
    if sorted(order) != list(range(len(model.alloc_bytes))):
        return False
    pos = {b: i for i, b in enumerate(order)}
    return all(pos[d] < pos[b] for b in order for d in model.deps[b])


def peak_of_order(model: BlockModel, order: Sequence[int]) -> int:
    """Peak live bytes of the block when its bindings run in ``order``."""
    left = model.readers()
    live, peak = 0, 0
    for b in order:
        live += model.alloc_bytes[b]
        peak = max(peak, live)
        for r in model.uses[b]:
            left[r] -= 1
            if left[r] == 0 and r not in model.pinned:
                live -= model.alloc_bytes[r]
        if left.get(b, 0) == 0 and b not in model.pinned:
            live -= model.alloc_bytes[b]  # never read: dead right after it is written
    return peak


def _freed_by(model: BlockModel, b: int, left: Dict[int, int]) -> int:
    freed = sum(model.alloc_bytes[r] for r in model.uses[b]
                if left[r] == 1 and r not in model.pinned)
    if left.get(b, 0) == 0 and b not in model.pinned:
        freed += model.alloc_bytes[b]
    return freed


def list_schedule(model: BlockModel) -> List[int]:
    """A topological order chosen greedily: the ready binding with the largest
    ``bytes freed - bytes allocated`` first, program order breaking ties."""
    n = len(model.alloc_bytes)
    left = model.readers()
    waiting = [len(d) for d in model.deps]
    users: List[List[int]] = [[] for _ in range(n)]
    for b, deps in enumerate(model.deps):
        for d in deps:
            users[d].append(b)
    ready = {b for b in range(n) if waiting[b] == 0}
    order = []
    while ready:
        b = min(ready, key=lambda k: (model.alloc_bytes[k] - _freed_by(model, k, left), k))
        ready.remove(b)
        order.append(b)
        for r in model.uses[b]:
            left[r] -= 1
        for u in users[b]:
            waiting[u] -= 1
            if waiting[u] == 0:
                ready.add(u)
    return order


def exact_schedule(model: BlockModel) -> List[int]:
    """A topological order of minimum peak live bytes (dynamic program over the sets of
    bindings already run; ``2**n`` states, for small blocks)."""
    n = len(model.alloc_bytes)
    dep_mask = [sum(1 << d for d in deps) for deps in model.deps]
    readers_mask: Dict[int, int] = {}
    for b, used in enumerate(model.uses):
        for r in used:
            readers_mask[r] = readers_mask.get(r, 0) | (1 << b)

    def live(mask: int) -> int:
        total = 0
        for r in range(n):
            if not (mask >> r) & 1 or not model.alloc_bytes[r]:
                continue
            rm = readers_mask.get(r, 0)
            if r in model.pinned or (rm & mask) != rm:
                total += model.alloc_bytes[r]
        return total

    best: Dict[int, tuple] = {0: (0, None, None)}
    for mask in sorted(range(1 << n), key=lambda m: bin(m).count("1")):
        if mask not in best:
            continue
        peak, _, _ = best[mask]
        base = live(mask)
        for b in range(n):
            if (mask >> b) & 1 or (dep_mask[b] & mask) != dep_mask[b]:
                continue
            new = mask | (1 << b)
            cand = max(peak, base + model.alloc_bytes[b])
            if new not in best or cand < best[new][0]:
                best[new] = (cand, mask, b)
    order, mask = [], (1 << n) - 1
    while mask:
        _, prev, b = best[mask]
        order.append(b)
        mask = prev
    return order[::-1]
