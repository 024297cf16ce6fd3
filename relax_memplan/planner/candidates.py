"""Unplaced buffers by start step, with block minima of their end steps, for the skyline.

:func:`~relax_memplan.planner.skyline.lowest_first_sweep` asks, for the lowest skyline
segment ``[a, b)`` (compressed steps), which unplaced buffer of smallest rank lies wholly
inside it: ``a <= lo`` and ``hi <= b``. The buffers starting in ``[a, b)`` are a slice
``[ia, ib)`` of the buffers sorted by (start step, rank); a buffer of the slice fits when it
ends by ``b``. Buffers past the slice start at ``b`` or later, so they never end by ``b``.

Scanning the whole slice made a query cost grow with the number of buffers per step:
random instances on a 10,000-step horizon have 10x more buffers starting in each segment at
100k buffers than at 10k (36.7 million buffers scanned in all, 0.6 million at 10k). Here
the positions are cut into blocks of ``BLOCK`` and each block keeps the smallest end step
of its unplaced buffers (a sqrt decomposition, as for range-minimum queries), so a query

* fails after one ``min`` over the block minima of the slice when nothing ends by ``b``,
  without looking at a buffer (91,846 of the 212,288 queries on slices over 16 buffers,
  random 100k);
* in start order (ranks growing with the position) scans only the first block whose
  minimum is ``<= b``, from its first position in the slice;
* in any other order scans (in Python when short, else with numpy) only the positions from
  the first to the last block whose minimum is ``<= b``. That is not sub-linear: the
  buffers that fit are spread over the slice, and random 100k still reads 22.1 million
  positions (36.7 million before).

A placed buffer gets rank ``n`` and end step ``gone`` (past every segment, so it never
fits again); its block's minimum is recomputed only when the buffer held it. Placed
buffers are dropped from the arrays (:meth:`compact`) when they make up a share of them.
The answer is the same buffer as a scan of the whole slice (the tests compare both).
"""

from __future__ import annotations

import numpy as np

__all__ = ["StartIndex", "BLOCK_BITS", "BLOCK", "PYTHON_SCAN_MAX"]

#: Positions per block of the end-step minima: ``1 << BLOCK_BITS``.
BLOCK_BITS = 5
BLOCK = 1 << BLOCK_BITS
#: Position ranges up to this length are scanned in Python, longer ones with numpy.
PYTHON_SCAN_MAX = 64


class StartIndex:
    """Unplaced buffers sorted by (start step, rank); placed ones get rank ``n``, then go.

    Parameters
    ----------
    lo, hi : numpy.ndarray
        Compressed live steps ``[lo, hi)`` per buffer index (int64).
    rank : numpy.ndarray
        Rank per buffer index (a permutation of ``range(n)``, int64).
    num_steps : int
        Number of compressed steps; segments lie in ``[0, num_steps)``.
    count : int
        Keep only the buffers of rank ``< count``.
    lists : bool
        Keep the Python lists below (the Python sweep reads them); the compiled sweep of
        :mod:`.compiled` reads only the arrays ``*_np``.

    Attributes
    ----------
    index, lo, hi, rank : list of int
        Buffer index, steps and rank per position (``hi`` is ``gone`` once placed).
    first_at : list of int
        ``first_at[x]``: position of the first buffer starting at step ``x`` or later.
    index_np, lo_np, hi_np, rank_np, first_at_np : numpy.ndarray
        The same as int64 arrays.
    monotone : bool
        Ranks grow with the position (a start-order priority): the first buffer that fits
        has the smallest rank.
    """

    def __init__(self, lo: np.ndarray, hi: np.ndarray, rank: np.ndarray, num_steps: int,
                 count: int, lists: bool = True):
        self.n = len(rank)
        self.lists = lists
        order = np.lexsort((rank, lo))
        if count < self.n:  # only the ``count`` buffers of smallest rank
            order = order[rank[order] < count]
        self.steps = np.arange(num_steps + 1)
        #: End step of placed buffers: past every segment, so they never fit again.
        self.gone = num_steps + 1
        self._set(order, lo[order], hi[order], rank[order])
        self.monotone = bool(np.all(np.diff(self.rank_np) > 0))

    def _set(self, index, lo, hi, rank):
        self.index_np, self.lo_np, self.hi_np, self.rank_np = index, lo, hi, rank
        self.first_at_np = np.searchsorted(lo, self.steps)
        self.placed = 0
        if not self.lists:
            return
        self.index, self.lo, self.hi, self.rank = (
            index.tolist(), lo.tolist(), hi.tolist(), rank.tolist())
        self.first_at = self.first_at_np.tolist()
        size = len(hi)
        self.block_min = (np.minimum.reduceat(hi, np.arange(0, size, BLOCK)).tolist()
                          if size else [])
        # ``max((hi - b) << shift, rank)`` is the rank where hi <= b, else above every rank:
        # one subtraction, one maximum and one argmin per numpy scan. ``hi << shift`` is
        # below (2n + 2)**2, inside int64 up to a billion buffers.
        self.shift = (self.n + 1).bit_length()
        self.hi_shifted = hi << self.shift
        self.scratch = np.empty(size, dtype=np.int64)

    def views(self):
        """``(first_at, hi, rank, block_min)``: the lists the sweep reads in its loop
        (replaced by :meth:`compact` and :meth:`restrict`)."""
        return self.first_at, self.hi, self.rank, self.block_min

    def compact(self) -> None:
        """Drop the placed buffers (positions change)."""
        keep = self.hi_np < self.gone
        self._set(self.index_np[keep], self.lo_np[keep], self.hi_np[keep], self.rank_np[keep])

    def restrict(self, keep: int) -> None:
        """Keep only the ``keep`` unplaced buffers of smallest rank (the others are left
        unplaced, for the lanes), then compact."""
        self.compact()
        if keep < len(self.rank_np):
            cut = np.partition(self.rank_np, keep)[keep] if keep > 0 else -1
            kept = self.rank_np < cut
            self._set(self.index_np[kept], self.lo_np[kept], self.hi_np[kept],
                      self.rank_np[kept])

    def remove(self, q: int) -> None:
        """Mark the buffer at position ``q`` placed."""
        end = self.hi[q]
        self.rank[q] = self.rank_np[q] = self.n
        self.hi[q] = self.hi_np[q] = self.gone
        self.hi_shifted[q] = self.gone << self.shift
        self.placed += 1
        k = q // BLOCK
        if self.block_min[k] == end:  # it held its block's minimum
            start = k * BLOCK
            self.block_min[k] = min(self.hi[start:start + BLOCK])

    def best_inside(self, a: int, b: int) -> int:
        """Position of the smallest-rank unplaced buffer inside steps ``[a, b)``, or -1.

        ``O(blocks in the slice)`` when nothing fits, plus the scan of the positions between
        the first and the last block holding a buffer that ends by ``b`` (one block in start
        order).
        """
        ia, ib = self.first_at[a], self.first_at[b]
        if ib <= ia or min(self.block_min[ia >> BLOCK_BITS:((ib - 1) >> BLOCK_BITS) + 1]) > b:
            return -1
        return self.best_between(ia, ib, b)

    def best_between(self, ia: int, ib: int, b: int) -> int:
        """:meth:`best_inside` on the positions ``[ia, ib)`` of the buffers starting in
        ``[a, b)``, once a block minimum there is ``<= b``."""
        block_min = self.block_min
        k0, k1 = ia >> BLOCK_BITS, ((ib - 1) >> BLOCK_BITS) + 1
        hi = self.hi
        if self.monotone:
            for k in range(k0, k1):
                if block_min[k] <= b:
                    for q in range(max(ia, k * BLOCK), min(ib, k * BLOCK + BLOCK)):
                        if hi[q] <= b:
                            return q
            return -1
        # Smallest rank: only the positions from the first to the last block holding a
        # buffer that ends by b are scanned.
        first = k0
        while block_min[first] > b:
            first += 1
        last = k1 - 1
        while block_min[last] > b:
            last -= 1
        start, stop = max(ia, first * BLOCK), min(ib, last * BLOCK + BLOCK)
        if stop - start <= PYTHON_SCAN_MAX:
            rank, best, k = self.rank, self.n, -1
            for q in range(start, stop):
                if rank[q] < best and hi[q] <= b:
                    best, k = rank[q], q
            return k
        keys = self.scratch[:stop - start]
        np.subtract(self.hi_shifted[start:stop], b << self.shift, out=keys)
        np.maximum(keys, self.rank_np[start:stop], out=keys)
        q = int(keys.argmin())
        return start + q if keys[q] < self.n else -1
