"""Size-class lanes: a valid plan in a few numpy passes, for budgets below one greedy pass.

When :func:`~relax_memplan.planner.portfolio.plan` has less time than one lowest-first
pass needs (random 100k buffers: about 1.5 s CPU; a 0.5 s budget), it needs a plan that
costs about a microsecond per buffer and is not twice the lower bound, which the Tetris
drop on the skyline gave (2.28 / 2.39 x LB on random 20k / 100k). Lanes do better there:

1. buffers are grouped into size classes, ``size`` in ``[r**k, r**(k+1))`` with
   ``r = LANE_RATIO``;
2. within a class, the live ranges are coloured greedily in start order (a buffer takes
   the most recently freed lane of its class, else a new one), which uses exactly as many
   lanes as the class has buffers live at its fullest step (interval graphs are perfect);
3. a lane is as tall as its largest buffer; lanes are stacked, classes largest first,
   each lane's offset rounded up to a multiple of every alignment in it.

Height: at most ``r`` times the sum over classes of their peak live bytes (each buffer
padded to its lane). One skyline pass is much better where it fits: random 20k / 100k
buffers 1.65 / 1.32 x LB by lanes, pangu_2.6B 2.24 (one pass by area: 1.07 / 1.05,
1.0076). This is the classic size-segregated arena of slab allocators (Bonwick 1994,
"The Slab Allocator"), planned offline.
"""

from __future__ import annotations

from typing import Sequence

import numpy as np

__all__ = ["size_class_lanes", "lane_offsets", "LANE_RATIO"]

#: Ratio between consecutive size classes (measured on random 20k / 100k buffers: 2**0.5
#: gives 1.65 / 1.32 x LB, 2**0.25 gives 1.86 / 1.37: more classes, more peaks summed).
LANE_RATIO = 2 ** 0.5


def size_class_lanes(p, ratio: float = LANE_RATIO) -> list[int]:
    """Offsets (bytes, by buffer index) of the size-class lane plan of ``p``.

    Parameters
    ----------
    p : Problem
        The compiled buffers (compressed steps, sizes and alignments in bytes).
    ratio : float
        Size ratio between consecutive classes, ``> 1``.

    Returns
    -------
    list of int
        A valid plan: time-overlapping buffers never share a lane, lanes never overlap in
        bytes, every offset is a multiple of its buffer's alignment.

    Raises
    ------
    ValueError
        If ``ratio <= 1``.
    """
    lo, hi, _ = p.step_arrays
    return lane_offsets(lo, hi, p.size, p.align, ratio=ratio)


def lane_offsets(lo: np.ndarray, hi: np.ndarray, size: Sequence[int], align: Sequence[int],
                 base_bytes: int = 0, ratio: float = LANE_RATIO) -> list[int]:
    """Lane plan of the buffers given as arrays, stacked from ``base_bytes`` up.

    ``lo``/``hi`` are the buffers' step ranges ``[lo, hi)`` (int arrays), ``size`` and
    ``align`` their sizes and alignments in bytes. Returns offsets in bytes, in the order
    given, all at or above ``base_bytes`` (see :func:`size_class_lanes`).
    """
    if ratio <= 1:
        raise ValueError(f"lane ratio must be > 1, got {ratio}")
    if len(size) == 0:
        return []
    size_int = np.asarray(size, dtype=object if max(size) >= 1 << 62 else np.int64)
    cls = np.floor(np.log(np.asarray(size, dtype=np.float64)) / np.log(ratio)).astype(np.int64)
    lane = _colour(cls, np.asarray(lo), np.asarray(hi))
    # Lanes numbered per class; a global lane id per (class, lane), classes largest first.
    classes, cls_index = np.unique(-cls, return_inverse=True)
    lanes_per_class = np.zeros(len(classes), dtype=np.int64)
    np.maximum.at(lanes_per_class, cls_index, lane + 1)
    first_lane = np.concatenate([[0], np.cumsum(lanes_per_class)[:-1]])
    lane_id = first_lane[cls_index] + lane
    num_lanes = int(lanes_per_class.sum())
    tall = np.zeros(num_lanes, dtype=size_int.dtype)
    np.maximum.at(tall, lane_id, size_int)  # the largest buffer of each lane
    lane_align = np.ones(num_lanes, dtype=np.int64)
    np.lcm.at(lane_align, lane_id, np.asarray(align, dtype=np.int64))
    base, offset = [0] * num_lanes, base_bytes
    for k, (top, a) in enumerate(zip(tall.tolist(), lane_align.tolist())):
        base[k] = offset = -(-offset // a) * a  # a multiple of every alignment in the lane
        offset += top
    return [base[k] for k in lane_id.tolist()]


def _colour(cls: np.ndarray, lo: np.ndarray, hi: np.ndarray) -> np.ndarray:
    """Lane of each buffer within its class: greedy interval colouring in step order."""
    n = len(cls)
    # Events by (step, ends before starts): a buffer ending at step s frees its lane for one
    # starting at s (half-open ranges).
    step = np.concatenate([hi, lo])
    kind = np.concatenate([np.zeros(n, dtype=np.int64), np.ones(n, dtype=np.int64)])
    order = np.lexsort((kind, step))
    lane = [0] * n
    free: dict[int, list[int]] = {}
    used: dict[int, int] = {}
    cls_l = cls.tolist()
    for e in order.tolist():
        i = e if e < n else e - n
        c = cls_l[i]
        if e < n:  # end of buffer i
            free[c].append(lane[i])
        else:
            stack = free.setdefault(c, [])
            if stack:
                lane[i] = stack.pop()
            else:
                lane[i] = used.get(c, 0)
                used[c] = lane[i] + 1
    return np.asarray(lane, dtype=np.int64)
