"""Window repair: re-place the few buffers that set a plan's height, the rest held fixed.

On large graphs a lowest-first pass often ends a few buffers above the lower bound: on
pangu_2.6B (18,692 buffers) two 20 MiB buffers live just after the peak step find no hole
(a 390 MiB buffer starting one step later took their space) and end stacked above the
lower bound, with a dozen tiny long-lived buffers on top of them. Changing the global
priorities moves thousands of other buffers and makes things worse; this module instead
keeps the plan and solves the small neighbourhood where the height is set, a large
neighbourhood search step (Shaw 1998, "Using constraint programming and local search
methods to solve vehicle routing problems"):

1. the *culprits* are the buffers whose top passes the target height ``cap``; the *big*
   ones (at least ``BIG_SHARE`` of the excess) set the window, a time range around their
   live ranges widened by ``margin`` compressed steps on each side;
2. the *free* buffers are the big culprits and every buffer that starts inside the
   window (whatever its end); every other buffer stays where it is, an obstacle;
3. the free buffers are placed one by one at the lowest aligned offset where no
   time-overlapping obstacle or already placed free buffer sits (first fit against the
   obstacles, numpy per buffer), in a few orders (size, area, the old offsets, start,
   then random size perturbations), until an order keeps every top within ``cap``;
4. the small culprits are then put back, largest first, at the lowest free offset given
   everything else (no cap: tiny long-lived buffers may end a few bytes above ``cap``).

The result is returned only if it is lower than the plan given. Wider windows are tried
in turn while time remains. The plan is checked by the caller (the validator replay of
:func:`~relax_memplan.planner.portfolio.plan`).
"""

from __future__ import annotations

import time
from typing import Optional, Sequence

import numpy as np

__all__ = ["window_repair", "lowest_free_offset"]

#: A culprit at least this share of the excess above ``cap`` sets the window.
BIG_SHARE = 1 / 16
#: Window margins tried, compressed steps on each side of the big culprits' ranges.
MARGINS = (5, 20, 50, 200)
#: Placement orders tried per window (the first four are deterministic).
ORDERS_PER_WINDOW = 100
#: The clock is read once per this many buffers placed.
CLOCK_EVERY = 32
#: A window whose free buffers exceed this count is not tried (too slow to re-place).
MAX_FREE = 2000


def lowest_free_offset(offsets: np.ndarray, tops: np.ndarray, size_bytes: int,
                       alignment_bytes: int) -> int:
    """Lowest aligned offset where ``size_bytes`` fit between the busy byte intervals.

    Parameters
    ----------
    offsets, tops : numpy.ndarray of int64
        The busy intervals ``[offsets[k], tops[k])`` in bytes (any order, may overlap).
    size_bytes, alignment_bytes : int
        Size and alignment of the buffer to place, bytes.

    Returns
    -------
    int
        The lowest offset ``o`` (a multiple of ``alignment_bytes``) with ``[o, o + size)``
        disjoint from every busy interval; above them all if no gap fits.
    """
    if not len(offsets):
        return 0
    order = np.argsort(offsets, kind="stable")
    reach = np.maximum.accumulate(tops[order])  # top of everything up to interval k
    cand = np.concatenate([[0], reach])  # the lowest spot above intervals < k
    if alignment_bytes != 1:
        cand = -(-cand // alignment_bytes) * alignment_bytes
    nxt = np.concatenate([offsets[order], [np.iinfo(np.int64).max]])
    return int(cand[int(np.argmax(cand + size_bytes <= nxt))])  # the last always fits


def window_repair(p, offsets: Sequence[int], deadline: float, cap: Optional[int] = None,
                  seed: int = 0) -> Optional[list[int]]:
    """Lower the plan ``offsets`` by re-placing the buffers around its highest ones.

    Runs after the lowest-first passes of :func:`~relax_memplan.planner.portfolio.plan` on
    large graphs (see the module docstring for the algorithm).

    Parameters
    ----------
    p : Problem
        The compiled buffers (compressed steps, sizes in bytes, alignments).
    offsets : sequence of int
        A valid plan, bytes by buffer index.
    deadline : float
        ``time.perf_counter()`` value after which no new order or window is started.
    cap : int, optional
        Target height in bytes; default the lower bound.
    seed : int
        Seed of the random orders.

    Returns
    -------
    list of int or None
        Offsets by buffer index (bytes) lower than ``offsets``, or None.
    """
    size = np.asarray(p.size, dtype=np.int64)
    offs = np.asarray(offsets, dtype=np.int64)
    tops = offs + size
    height = int(tops.max(initial=0))
    cap = p.lower_bound if cap is None else cap
    culprits = np.flatnonzero(tops > cap)
    if not culprits.size or height > 1 << 62:
        return None
    threshold = min((height - cap) * BIG_SHARE, int(size[culprits].max()))
    big = culprits[size[culprits] >= threshold]
    small = culprits[size[culprits] < threshold]
    rng = np.random.default_rng(seed)
    for margin in MARGINS:
        if time.perf_counter() > deadline:
            break
        out = _repair_window(p, offs, big, small, margin, cap, deadline, rng)
        if out is not None and int((out + size).max()) < height:
            return out.tolist()
    return None


def _repair_window(p, offs, big, small, margin, cap, deadline, rng) -> Optional[np.ndarray]:
    """Re-place the buffers of one window below ``cap``, then the small culprits."""
    lo, hi, num_steps = p.step_arrays
    size, align = np.asarray(p.size, dtype=np.int64), p.align
    t0, t1 = max(int(lo[big].min()) - margin, 0), min(int(hi[big].max()) + margin, num_steps)
    is_free = (lo >= t0) & (lo < t1)
    is_free[big] = True
    is_free[small] = False
    free = np.flatnonzero(is_free)
    if free.size > MAX_FREE:
        return None
    placed = ~is_free
    placed[small] = False
    obst = np.flatnonzero(placed & (lo < hi[free].max()) & (hi > lo[free].min()))
    o_lo, o_hi, o_off = lo[obst], hi[obst], offs[obst]
    o_top = o_off + size[obst]
    f_lo, f_hi, f_size = lo[free], hi[free], size[free]
    blocking = [np.flatnonzero((o_lo < f_hi[k]) & (o_hi > f_lo[k])) for k in range(free.size)]
    overlap = [np.flatnonzero((f_lo < f_hi[k]) & (f_hi > f_lo[k])) for k in range(free.size)]
    orders = [np.argsort(-f_size, kind="stable"),
              np.argsort(-f_size * (f_hi - f_lo), kind="stable"),
              np.argsort(offs[free], kind="stable"), np.lexsort((-f_size, f_lo))]
    for attempt in range(ORDERS_PER_WINDOW):
        if time.perf_counter() > deadline:
            return None
        order = orders[attempt] if attempt < len(orders) else np.argsort(
            -f_size * rng.uniform(0.5, 1.5, free.size), kind="stable")
        new = _first_fit_below(order, free, (blocking, overlap), (o_off, o_top), f_size,
                               align, cap, deadline)
        if new is not None:
            out = offs.copy()
            out[free] = new
            return _put_back(p, out, small, size, deadline)
    return None


def _first_fit_below(order, free, conflicts, obstacles, f_size, align, cap, deadline):
    """Offsets of the free buffers placed in ``order`` at their lowest spot, or None when
    one ends above ``cap`` or the deadline passes."""
    blocking, overlap = conflicts
    o_off, o_top = obstacles
    new = np.full(free.size, -1, dtype=np.int64)
    for count, k in enumerate(order.tolist()):
        if count % CLOCK_EVERY == CLOCK_EVERY - 1 and time.perf_counter() > deadline:
            return None
        mine = overlap[k]
        mine = mine[new[mine] >= 0]
        busy_off = np.concatenate([o_off[blocking[k]], new[mine]])
        busy_top = np.concatenate([o_top[blocking[k]], new[mine] + f_size[mine]])
        off = lowest_free_offset(busy_off, busy_top, int(f_size[k]), align[int(free[k])])
        if off + int(f_size[k]) > cap:
            return None
        new[k] = off
    return new


def _put_back(p, out: np.ndarray, small: np.ndarray, size: np.ndarray, deadline: float
              ) -> Optional[np.ndarray]:
    """Place the small culprits, largest first, at their lowest spot given the others;
    None if the deadline passes first."""
    lo, hi, _ = p.step_arrays
    out[small] = -1
    for count, i in enumerate(small[np.argsort(-size[small], kind="stable")].tolist()):
        if count % CLOCK_EVERY == CLOCK_EVERY - 1 and time.perf_counter() > deadline:
            return None
        near = np.flatnonzero((lo < hi[i]) & (hi > lo[i]) & (out >= 0))
        out[i] = lowest_free_offset(out[near], out[near] + size[near], int(size[i]),
                                    p.align[i])
    return out
