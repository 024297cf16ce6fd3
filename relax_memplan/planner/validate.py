"""Validator of offset plans, separate from the planning algorithms.

A plan is valid when every buffer has a non-negative integer offset that is a multiple of
its ``alignment_bytes``, no two buffers that are live at a common step share a byte, and,
if a capacity is given, every buffer ends within it. :func:`find_violations` returns every
violation as a specific :class:`PlanError`; :func:`validate` raises the first one.

The overlap check first replays the plan in offset order on a skyline over time (numpy,
one slice per buffer): a buffer overlaps none of the lower ones exactly when the skyline
over its live range is at or below its offset. Only a plan failing that is swept over time
(frees before allocations at the same step, since live ranges are half-open) with the live
buffers in a list sorted by offset, to name every overlapping pair.
"""

from __future__ import annotations

from bisect import bisect_left
from typing import Mapping, Optional, Sequence

import numpy as np

from .buffer import Buffer, check_unique_ids, sorted_distinct

__all__ = [
    "no_overlap_on_steps",
    "PlanError",
    "OverlapError",
    "MisalignmentError",
    "MissingOffsetError",
    "InvalidOffsetError",
    "CapacityExceededError",
    "NestingError",
    "find_violations",
    "validate",
]


class PlanError(Exception):
    """Base class of all plan violations."""


class OverlapError(PlanError):
    """Two buffers live at a common step share at least one byte.

    Attributes ``first`` and ``second`` are the two :class:`Buffer` objects, ``first_offset``
    and ``second_offset`` their offsets in bytes.
    """

    def __init__(self, first: Buffer, first_offset: int, second: Buffer, second_offset: int):
        self.first, self.second = first, second
        self.first_offset, self.second_offset = first_offset, second_offset
        super().__init__(
            f"buffers {first.id!r} (steps [{first.start}, {first.end}), bytes "
            f"[{first_offset}, {first_offset + first.size_bytes})) and {second.id!r} (steps "
            f"[{second.start}, {second.end}), bytes [{second_offset}, "
            f"{second_offset + second.size_bytes})) overlap in time and address"
        )


class MisalignmentError(PlanError):
    """A buffer's offset is not a multiple of its ``alignment_bytes``."""

    def __init__(self, buffer: Buffer, offset: int):
        self.buffer, self.offset = buffer, offset
        super().__init__(
            f"buffer {buffer.id!r}: offset {offset} is not a multiple of its alignment "
            f"{buffer.alignment_bytes} bytes"
        )


class MissingOffsetError(PlanError):
    """Some buffers have no offset. Attribute ``ids`` lists them in input order."""

    def __init__(self, ids: Sequence[str]):
        self.ids = list(ids)
        shown = ", ".join(repr(i) for i in self.ids[:10])
        more = f" and {len(self.ids) - 10} more" if len(self.ids) > 10 else ""
        super().__init__(f"{len(self.ids)} buffer(s) without offset: {shown}{more}")


class InvalidOffsetError(PlanError):
    """A buffer's offset is negative or not an integer."""

    def __init__(self, buffer: Buffer, offset):
        self.buffer, self.offset = buffer, offset
        super().__init__(
            f"buffer {buffer.id!r}: offset {offset!r} must be a non-negative integer"
        )


class CapacityExceededError(PlanError):
    """A buffer ends above the arena capacity."""

    def __init__(self, buffer: Buffer, offset: int, capacity_bytes: int):
        self.buffer, self.offset, self.capacity_bytes = buffer, offset, capacity_bytes
        super().__init__(
            f"buffer {buffer.id!r}: bytes [{offset}, {offset + buffer.size_bytes}) exceed "
            f"the capacity of {capacity_bytes} bytes"
        )


class NestingError(PlanError):
    """A buffer declared to lie at a fixed byte delta inside a parent buffer (``nested``) is
    not there: offset not ``parent offset + delta``, bytes outside the parent, unknown parent,
    or a cycle of parents."""

    def __init__(self, member_id: str, parent_id: str, why: str):
        self.member_id, self.parent_id = member_id, parent_id
        super().__init__(f"buffer {member_id!r} declared inside {parent_id!r}: {why}")


def _nesting(by_id, offsets, nested, errors):
    """Check every declared placement; return id -> set of its ancestors' ids."""
    ancestors = {}
    for member, (parent, delta) in nested.items():
        if member not in by_id or parent not in by_id:
            errors.append(NestingError(member, parent, "unknown buffer id"))
            continue
        chain, node = set(), member
        while node in nested and node not in chain:
            chain.add(node)
            node = nested[node][0]
        if node in chain:
            errors.append(NestingError(member, parent, "the parents form a cycle"))
            continue
        ancestors[member] = chain - {member} | {node}
        mem, par = by_id[member], by_id[parent]
        if delta < 0 or delta + mem.size_bytes > par.size_bytes:
            errors.append(NestingError(member, parent, f"bytes [{delta}, "
                                       f"{delta + mem.size_bytes}) of the parent exceed its "
                                       f"{par.size_bytes} bytes"))
        elif member in offsets and parent in offsets and \
                offsets[member] != offsets[parent] + delta:
            errors.append(NestingError(member, parent, f"offset {offsets[member]} != parent "
                                       f"offset {offsets[parent]} + delta {delta}"))
    return ancestors


def _declared_nesting(errors, ancestors):
    """Drop the overlaps between a buffer and one of its declared ancestors."""
    return [e for e in errors if not (
        isinstance(e, OverlapError)
        and (e.first.id in ancestors.get(e.second.id, ()) or
             e.second.id in ancestors.get(e.first.id, ())))]


def _checked_offsets(buffers, offsets, errors):
    """Return [(buffer, offset)] of buffers with a usable offset; append offset errors."""
    placed, missing = [], []
    if all(type(offsets.get(buf.id)) is int and offsets[buf.id] >= 0
           and buf.alignment_bytes == 1 for buf in buffers):
        return [(buf, offsets[buf.id]) for buf in buffers]  # the common case, checked fast
    for buf in buffers:
        if buf.id not in offsets:
            missing.append(buf.id)
            continue
        off = offsets[buf.id]
        if isinstance(off, bool) or not hasattr(off, "__index__") or off < 0:
            errors.append(InvalidOffsetError(buf, off))
            continue
        off = int(off)
        if off % buf.alignment_bytes:
            errors.append(MisalignmentError(buf, off))
        placed.append((buf, off))
    if missing:
        errors.insert(0, MissingOffsetError(missing))
    return placed


def _no_overlap(placed) -> bool:
    """True if no two placed buffers overlap; False if some may (then sweep to name them)."""
    if not placed:
        return True
    start = np.array([buf.start for buf, _ in placed], dtype=np.int64)
    end = np.array([buf.end for buf, _ in placed], dtype=np.int64)
    steps = sorted_distinct(np.concatenate([start, end]))
    return no_overlap_on_steps(np.searchsorted(steps, start).tolist(),
                               np.searchsorted(steps, end).tolist(),
                               [off for _, off in placed], [buf.size_bytes for buf, _ in placed],
                               len(steps))


#: Buffers checked together by :func:`no_overlap_on_steps` (pairwise inside a chunk).
CHECK_CHUNK = 128


def no_overlap_on_steps(step_lo, step_hi, offsets, sizes, num_steps) -> bool:
    """True if no two buffers overlap in time and address; False if some may.

    Buffers are given as parallel sequences: compressed live steps ``[step_lo, step_hi)``,
    offsets and sizes in bytes (sizes > 0). They are visited by increasing offset in chunks
    of ``CHECK_CHUNK`` while a skyline keeps, per step, the highest top of the chunks
    visited so far. Each buffer must start at or above that skyline over its live range
    (one ``maximum.reduceat`` per chunk) and above the top of every buffer before it in its
    chunk that overlaps it in time (a pairwise check inside the chunk); then no lower buffer
    overlaps it, and the chunk's tops are written into the skyline (one slice assignment per
    buffer, the only per-buffer step). ``O(n log n + n * CHECK_CHUNK + sum of live steps)``.
    Tops of ``2**62`` bytes or more (beyond int64) give False.
    """
    n = len(offsets)
    if n == 0:
        return True
    try:
        off_all = np.asarray(offsets, dtype=np.int64)
        size_all = np.asarray(sizes, dtype=np.int64)
    except OverflowError:  # beyond int64
        return False
    if off_all.max() >= 1 << 62 or size_all.max() >= 1 << 62:
        return False
    top_all = off_all + size_all
    if top_all.max() >= 1 << 62:
        return False
    lo_all = np.asarray(step_lo, dtype=np.int64)
    hi_all = np.asarray(step_hi, dtype=np.int64)
    sky = np.zeros(max(num_steps, 1) + 1, dtype=np.int64)  # one more: reduceat's last end
    later = np.triu(np.ones((CHECK_CHUNK, CHECK_CHUNK), dtype=bool), k=1)
    order = np.argsort(off_all, kind="stable")
    for c in range(0, n, CHECK_CHUNK):
        idx = order[c:c + CHECK_CHUNK]
        lo, hi, off, top = lo_all[idx], hi_all[idx], off_all[idx], top_all[idx]
        # Ranges by decreasing start: reduceat then reads each live range, and the pairs
        # (end, next start) in between go backwards, a single element each (in offset
        # order they spanned half the steps: a third of the check's time on 100k buffers).
        back = np.argsort(-lo, kind="stable")
        ends = np.empty(2 * len(idx), dtype=np.int64)
        ends[0::2], ends[1::2] = lo[back], hi[back]
        if (np.maximum.reduceat(sky, ends)[0::2] > off[back]).any():
            return False
        # j after i in offset order, live at a common step, starting below i's top.
        clash = (lo[:, None] < hi[None, :]) & (lo[None, :] < hi[:, None]) & (
            off[None, :] < top[:, None])
        if (clash & later[:len(idx), :len(idx)]).any():
            return False
        # Every top is above the skyline over its range: assigning in increasing top order
        # leaves the highest top per step (one slice each, cheap for long live ranges).
        by_top = np.argsort(top, kind="stable")
        for s, e, t in zip(lo[by_top].tolist(), hi[by_top].tolist(), top[by_top].tolist()):
            sky[s:e] = t
    return True


def _overlaps(placed, errors):
    """Sweep over time; append an OverlapError for every overlapping pair."""
    if _no_overlap(placed):
        return
    events = []
    for k, (buf, _) in enumerate(placed):
        events.append((buf.start, 1, k))
        events.append((buf.end, 0, k))
    events.sort()  # at one step, frees (0) before allocations (1)
    max_size = max((buf.size_bytes for buf, _ in placed), default=0)
    live: list[tuple[int, int, int]] = []  # (offset, end offset, k) sorted
    involved = [0] * len(placed)  # live overlapping partners of each buffer
    dirty = 0  # live buffers with at least one live overlapping partner
    for _, is_alloc, k in events:
        buf, off = placed[k]
        item = (off, off + buf.size_bytes, k)
        if not is_alloc:
            del live[bisect_left(live, item)]
            if involved[k]:
                dirty -= 1
            continue
        pos = bisect_left(live, item)
        hits = []
        j = pos
        while j < len(live) and live[j][0] < item[1]:
            hits.append(live[j][2])
            j += 1
        j = pos - 1
        while j >= 0:
            other_off, other_end, other = live[j]
            if other_end > off:
                hits.append(other)
            elif not dirty or other_off <= off - max_size:
                # Live intervals are disjoint (or too far below): nothing further left can reach.
                break
            j -= 1
        live.insert(pos, item)
        for other in hits:
            other_buf, other_off = placed[other]
            errors.append(OverlapError(other_buf, other_off, buf, off))
            for x in (other, k):
                if not involved[x]:
                    dirty += 1
                involved[x] += 1


def _declared_sharing(errors, offsets, shared):
    """Drop the overlaps between two buffers of one declared group at one offset, same size."""
    group_of = {}
    for k, group in enumerate(shared):
        for bid in group:
            group_of[bid] = k
    kept = []
    for e in errors:
        if (isinstance(e, OverlapError) and e.first_offset == e.second_offset
                and e.first.size_bytes == e.second.size_bytes
                and group_of.get(e.first.id, -1) == group_of.get(e.second.id, -2)):
            continue
        kept.append(e)
    return kept


def find_violations(
    buffers: Sequence[Buffer],
    offsets: Mapping[str, int],
    capacity_bytes: Optional[int] = None,
    shared: Sequence[Sequence[str]] = (),
    nested: Optional[Mapping[str, tuple]] = None,
) -> list[PlanError]:
    """Return every violation of a plan; an empty list means the plan is valid.

    Parameters
    ----------
    buffers : sequence of Buffer
        The buffers with unique ids.
    offsets : mapping of str to int
        Byte offset per buffer id; ids not among ``buffers`` are ignored.
    capacity_bytes : int, optional
        If given, every buffer must satisfy ``offset + size_bytes <= capacity_bytes``.
    shared : sequence of sequence of str
        Groups of buffer ids that may share storage (in-place reuse: a kernel writes its
        output over an input that dies there). Two buffers of one group that overlap in
        time are accepted exactly when they have the same offset and the same size; any
        other overlap is still an :class:`OverlapError`.
    nested : mapping of str to (str, int), optional
        Declared placements inside a parent buffer (concatenation written in place: each
        input at ``offset(output) + prefix bytes``; in-place reuse: delta 0):
        member id -> (parent id, delta in bytes). Each must hold exactly
        (``offset(member) == offset(parent) + delta``, the member's bytes inside the
        parent's, else a :class:`NestingError`); then a buffer may overlap its ancestors
        (parent, parent's parent...) and nothing else: siblings, cousins and every other
        buffer that overlaps it in time and address are still :class:`OverlapError` s.

    Returns
    -------
    list of PlanError
        At most one :class:`MissingOffsetError` (first, listing all ids without offset),
        then :class:`InvalidOffsetError` / :class:`MisalignmentError` per buffer,
        :class:`NestingError` per declared placement not held,
        :class:`OverlapError` per overlapping pair and :class:`CapacityExceededError` per
        buffer above the capacity.

    Raises
    ------
    ValueError
        If two buffers share an id.
    TypeError
        If ``offsets`` is not a mapping.
    """
    check_unique_ids(buffers)
    if not isinstance(offsets, Mapping):
        raise TypeError(f"offsets must be a mapping of buffer id to byte offset, "
                        f"got {type(offsets).__name__}")
    errors: list[PlanError] = []
    placed = _checked_offsets(buffers, offsets, errors)
    _overlaps(placed, errors)
    if shared:
        errors = _declared_sharing(errors, offsets, shared)
    if nested:
        nesting_errors: list[PlanError] = []
        ancestors = _nesting({b.id: b for b in buffers}, offsets, nested, nesting_errors)
        errors = nesting_errors + _declared_nesting(errors, ancestors)
    if capacity_bytes is not None:
        for buf, off in placed:
            if off + buf.size_bytes > capacity_bytes:
                errors.append(CapacityExceededError(buf, off, capacity_bytes))
    return errors


def validate(
    buffers: Sequence[Buffer],
    offsets: Mapping[str, int],
    capacity_bytes: Optional[int] = None,
    shared: Sequence[Sequence[str]] = (),
    nested: Optional[Mapping[str, tuple]] = None,
) -> None:
    """Raise the first violation :func:`find_violations` reports; return None if valid.

    ``shared``: groups of ids allowed to share storage; ``nested``: member id -> (parent id,
    byte delta) placements inside a parent (see :func:`find_violations`).

    Raises
    ------
    PlanError
        The first violation (a subclass naming the buffer ids at fault).
    ValueError
        If two buffers share an id.
    """
    errors = find_violations(buffers, offsets, capacity_bytes, shared, nested)
    if errors:
        raise errors[0]
