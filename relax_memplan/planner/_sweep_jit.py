"""The lowest-first skyline sweep of :mod:`.skyline`, compiled with numba (imported lazily).

The same rule and tie-breaks as
:func:`~relax_memplan.planner.skyline.lowest_first_sweep` (identical offsets, height and
placement order), written over int64 arrays so numba (``njit(cache=True, nogil=True)``)
compiles it: the segments are arrays indexed by their first compressed step, the heap of
segments is a binary heap on two arrays ordered by (height, first step), as the Python
heap's key ``height * width + first step`` orders them (no product here: heights reach
2**61 bytes), and the candidate query scans the slice of :class:`~.candidates.StartIndex`
inline when short, else only the blocks holding a candidate that ends by ``b`` and a rank
below the best so far (:func:`_best_inside`), each with a branch-free loop that LLVM
vectorises. The answer is the same buffer (ranks are unique), so the plan is the same; the
tests compare both sweeps.

Measured (random buffers on 10,000 steps, one pass by area with the problem compiled, CPU,
best of 5, load 2-4 on 2 cores, one run each): the loop takes 4.7-5.3 ms at 10k and
68-76 ms at 100k buffers (at 100k every segment holds 10x more candidates: 36.7 million
positions in the slices of all queries, 0.6 million at 10k). Tried and dropped, same plans:
a min tree over the positions (0.19 s at 100k), blocks visited best-first by smallest rank
(0.09-0.13 s), a scan with branches instead of the branch-free one (0.13-0.15 s).

Only :mod:`.compiled` imports this module, which imports numba (about 0.5 s): the planner
runs without numba, and a process that never uses the compiled sweep never pays the import.
:func:`sweep_steps` runs at most ``st[MAX_STEPS]`` heap pops and returns, so the Python
driver can look at the clock (numba's nopython mode has no cheap ``perf_counter``), compact
the candidates and drop the rest into the lanes. Every array argument is int64, C-contiguous,
so one signature (:data:`SIGNATURE`) covers every call and the on-disk cache is found.
"""

from __future__ import annotations

import numpy as np
from numba import njit, types


__all__ = ["sweep_steps", "packed_candidates", "empty_state", "SIGNATURE", "ST_FIELDS"]

#: Slots of the state array ``st`` shared between the driver and :func:`sweep_steps`.
ST_FIELDS = ("max_steps", "count", "placed", "height", "heap_len", "n", "num_steps", "gone",
             "steps", "cand_placed", "compact_at", "shift")
(MAX_STEPS, COUNT, PLACED, HEIGHT, HEAP_LEN, N, NUM_STEPS, GONE, STEPS, CAND_PLACED,
 COMPACT_AT, SHIFT) = range(len(ST_FIELDS))
#: Slices up to this many positions are scanned inline, longer ones block by block.
INLINE_SCAN = 32
#: Positions per block of the minima: ``1 << BLOCK_BITS``.
BLOCK_BITS = 5
#: The argument types of :func:`sweep_steps`: 18 int64 C arrays.
SIGNATURE = (types.int64[::1],) * 18

_jit = njit(cache=True, nogil=True)


@_jit
def _push(heap_h, heap_a, size, h, a):
    """Push (h, a) on the heap of ``size`` entries; return the new size."""
    q = size
    while q > 0:
        parent = (q - 1) >> 1
        if heap_h[parent] < h or (heap_h[parent] == h and heap_a[parent] <= a):
            break
        heap_h[q], heap_a[q] = heap_h[parent], heap_a[parent]
        q = parent
    heap_h[q], heap_a[q] = h, a
    return size + 1


@_jit
def _pop(heap_h, heap_a, size):
    """Remove the smallest (h, a) from the heap of ``size`` > 0 entries; return it."""
    h0, a0 = heap_h[0], heap_a[0]
    size -= 1
    h, a = heap_h[size], heap_a[size]
    q = 0
    while True:
        child = 2 * q + 1
        if child >= size:
            break
        if child + 1 < size and (heap_h[child + 1] < heap_h[child] or (
                heap_h[child + 1] == heap_h[child] and heap_a[child + 1] < heap_a[child])):
            child += 1
        if h < heap_h[child] or (h == heap_h[child] and a <= heap_a[child]):
            break
        heap_h[q], heap_a[q] = heap_h[child], heap_a[child]
        q = child
    heap_h[q], heap_a[q] = h, a
    return h0, a0


@_jit
def _fit_rank(c_key, first, stop, limit, mask, n):
    """Smallest rank of the candidates at positions ``[first, stop)`` whose key is below
    ``limit`` (they end by the segment's end), else ``n``: a branch-free loop (vectorised)."""
    best = n
    for q in range(first, stop):
        key = c_key[q]
        best = min(best, key & mask if key < limit else n)
    return best


@_jit
def _best_inside(ia, ib, b, c_key, block_hi, block_rank, st):
    """Position of the smallest-rank candidate of positions ``[ia, ib)`` ending by ``b``.

    ``c_key`` packs ``end step << st[SHIFT] | rank`` (one read per candidate): a candidate
    ends by ``b`` when its key is below ``(b + 1) << st[SHIFT]``. Short slices are
    scanned whole; in longer ones only the blocks of ``1 << BLOCK_BITS`` positions where
    some candidate ends by ``b`` (block minimum end step) and some rank is below the best
    found so far (block minimum rank). The position of the best rank (ranks are unique)
    is then looked up in the range that held it.
    """
    n = st[N]
    limit, mask = (b + 1) << st[SHIFT], (1 << st[SHIFT]) - 1
    first, stop = ia, ib
    if ib - ia <= INLINE_SCAN:
        best = _fit_rank(c_key, ia, ib, limit, mask, n)
    else:
        best = n
        for blk in range(ia >> BLOCK_BITS, ((ib - 1) >> BLOCK_BITS) + 1):
            if block_hi[blk] <= b and block_rank[blk] < best:
                lo, hi = max(ia, blk << BLOCK_BITS), min(ib, (blk + 1) << BLOCK_BITS)
                rank = _fit_rank(c_key, lo, hi, limit, mask, n)
                if rank < best:
                    best, first, stop = rank, lo, hi
    if best == n:
        return -1
    for q in range(first, stop):
        if c_key[q] & mask == best:
            return q
    return -1


@_jit
def _remove(q, st, c_hi, c_key, block_hi, block_rank):
    """Mark the candidate at position ``q`` placed; keep its block's minima."""
    shift = st[SHIFT]
    mask = (1 << shift) - 1
    end, rank = c_key[q] >> shift, c_key[q] & mask
    c_hi[q] = st[GONE]
    c_key[q] = (st[GONE] << shift) | st[N]
    st[CAND_PLACED] += 1
    blk = q >> BLOCK_BITS
    if block_hi[blk] == end or block_rank[blk] == rank:
        low, low_rank = st[GONE], st[N]
        for r in range(blk << BLOCK_BITS, min(len(c_hi), (blk + 1) << BLOCK_BITS)):
            low, low_rank = min(low, c_key[r] >> shift), min(low_rank, c_key[r] & mask)
        block_hi[blk], block_rank[blk] = low, low_rank


@_jit
def _end_at(x, b, height, seg_end, seg_h, seg_prev, alive, num_steps):
    """Segment ``x`` (at ``height``) now reaches step ``b``: merge the segment starting at
    ``b`` into it if that one has the same height; link the next one back; return the end."""
    if b < num_steps and seg_h[b] == height:
        alive[b] = 0
        b = seg_end[b]
    seg_end[x] = b
    if b < num_steps:
        seg_prev[b] = x
    return b


@_jit
def _raise_segment(a, b, seg_end, seg_h, seg_prev, alive, heap_h, heap_a, st):
    """Nothing fits in segment ``[a, b)``: raise it to its lower neighbour and merge."""
    num_steps = st[NUM_STEPS]
    left = seg_prev[a]
    new_h = seg_h[b] if b < num_steps else seg_h[left]
    if left >= 0 and seg_h[left] < new_h:
        new_h = seg_h[left]
    seg_h[a] = new_h
    b = _end_at(a, b, new_h, seg_end, seg_h, seg_prev, alive, num_steps)
    if left >= 0 and seg_h[left] == new_h:
        alive[a] = 0
        seg_end[left] = b
        if b < num_steps:
            seg_prev[b] = left
        return  # the left segment's entry at new_h is in the heap already
    st[HEAP_LEN] = _push(heap_h, heap_a, st[HEAP_LEN], new_h, a)


@_jit
def _split(a, b, h, s, e, top, seg_end, seg_h, seg_prev, alive, heap_h, heap_a, st):
    """A buffer of steps ``[s, e)`` went at ``h`` into segment ``[a, b)``, its top at
    ``top``: split the segment into ``[a, s)`` and ``[e, b)`` at ``h``, ``[s, e)`` at top."""
    num_steps = st[NUM_STEPS]
    if s > a:  # left remainder [a, s) at h
        seg_end[a] = s
        st[HEAP_LEN] = _push(heap_h, heap_a, st[HEAP_LEN], h, a)
        left = a
    else:
        alive[a] = 0
        left = seg_prev[a]
    if left >= 0 and left != a and seg_h[left] == top:
        mid = left  # the buffer's top continues the segment on its left
    else:
        mid = s
        alive[s], seg_h[s], seg_prev[s] = 1, top, left
    if e < b:  # right remainder [e, b) at h
        alive[e], seg_h[e], seg_end[e], seg_prev[e] = 1, h, b, mid
        if b < num_steps:
            seg_prev[b] = e
        st[HEAP_LEN] = _push(heap_h, heap_a, st[HEAP_LEN], h, e)
        seg_end[mid] = e
    else:
        _end_at(mid, b, top, seg_end, seg_h, seg_prev, alive, num_steps)
    if mid == s:
        st[HEAP_LEN] = _push(heap_h, heap_a, st[HEAP_LEN], top, s)


@_jit
def sweep_steps(st, c_index, c_lo, c_hi, c_key, first_at, block_hi, block_rank, size, align,
                seg_end, seg_h, seg_prev, alive, heap_h, heap_a, offsets, order):
    """Run the sweep until ``st[COUNT]`` buffers are placed, ``st[MAX_STEPS]`` heap pops
    are done, or more than ``st[COMPACT_AT]`` candidates are placed (to be compacted).

    ``st`` holds the scalars (:data:`ST_FIELDS`); the candidate arrays are those of
    :class:`~.candidates.StartIndex` (``c_hi`` is ``st[GONE]`` once placed), ``c_key``
    and ``block_hi``, ``block_rank`` from :func:`packed_candidates`;
    ``offsets`` (bytes, -1 unplaced) and ``order`` are written in place.
    """
    steps = 0
    while st[PLACED] < st[COUNT] and steps < st[MAX_STEPS] and st[HEAP_LEN] > 0:
        if st[CAND_PLACED] > st[COMPACT_AT]:
            break  # the driver drops the placed candidates
        steps += 1
        h, a = _pop(heap_h, heap_a, st[HEAP_LEN])
        st[HEAP_LEN] -= 1
        if alive[a] == 0 or seg_h[a] != h:
            continue
        b = seg_end[a]
        k = _best_inside(first_at[a], first_at[b], b, c_key, block_hi, block_rank, st)
        if k < 0:
            _raise_segment(a, b, seg_end, seg_h, seg_prev, alive, heap_h, heap_a, st)
            continue
        u, s, e = c_index[k], c_lo[k], c_hi[k]
        _remove(k, st, c_hi, c_key, block_hi, block_rank)
        al = align[u]
        off = h if al == 1 else (h + al - 1) // al * al
        top = off + size[u]
        offsets[u] = off
        order[st[PLACED]] = u
        st[PLACED] += 1
        if top > st[HEIGHT]:
            st[HEIGHT] = top
        _split(a, b, h, s, e, top, seg_end, seg_h, seg_prev, alive, heap_h, heap_a, st)
    st[STEPS] += steps


def packed_candidates(hi: np.ndarray, rank: np.ndarray, shift: int):
    """``(c_key, block_hi, block_rank)``: ``hi << shift | rank`` per position, and the
    smallest end step and rank per block of ``1 << BLOCK_BITS`` positions (int64)."""
    key = (hi << shift) | rank
    if len(hi) == 0:
        return key, np.zeros(1, np.int64), np.zeros(1, np.int64)
    cut = np.arange(0, len(hi), 1 << BLOCK_BITS)
    return key, np.minimum.reduceat(hi, cut), np.minimum.reduceat(rank, cut)


def empty_state() -> np.ndarray:
    """A zeroed state array ``st`` (int64, one slot per name of :data:`ST_FIELDS`)."""
    return np.zeros(len(ST_FIELDS), dtype=np.int64)
