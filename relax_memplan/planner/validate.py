"""Validator of offset plans, separate from the planning algorithms.

A plan is valid when every buffer has a non-negative integer offset that is a multiple of
its ``alignment_bytes``, no two buffers that are live at a common step share a byte, and,
if a capacity is given, every buffer ends within it. :func:`find_violations` returns every
violation as a specific :class:`PlanError`; :func:`validate` raises the first one.

The overlap check sweeps over time (frees before allocations at the same step, since live
ranges are half-open) and keeps the live buffers in a list sorted by offset, so a valid
plan of ``n`` buffers is checked in about ``O(n log n)`` plus list-insertion cost instead
of looking at all pairs.
"""

from __future__ import annotations

from bisect import bisect_left
from typing import Mapping, Optional, Sequence

from .buffer import Buffer, check_unique_ids

__all__ = [
    "PlanError",
    "OverlapError",
    "MisalignmentError",
    "MissingOffsetError",
    "InvalidOffsetError",
    "CapacityExceededError",
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


def _checked_offsets(buffers, offsets, errors):
    """Return [(buffer, offset)] of buffers with a usable offset; append offset errors."""
    placed, missing = [], []
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


def _overlaps(placed, errors):
    """Sweep over time; append an OverlapError for every overlapping pair."""
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


def find_violations(
    buffers: Sequence[Buffer],
    offsets: Mapping[str, int],
    capacity_bytes: Optional[int] = None,
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

    Returns
    -------
    list of PlanError
        At most one :class:`MissingOffsetError` (first, listing all ids without offset),
        then :class:`InvalidOffsetError` / :class:`MisalignmentError` per buffer,
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
    if capacity_bytes is not None:
        for buf, off in placed:
            if off + buf.size_bytes > capacity_bytes:
                errors.append(CapacityExceededError(buf, off, capacity_bytes))
    return errors


def validate(
    buffers: Sequence[Buffer],
    offsets: Mapping[str, int],
    capacity_bytes: Optional[int] = None,
) -> None:
    """Raise the first violation :func:`find_violations` reports; return None if valid.

    Raises
    ------
    PlanError
        The first violation (a subclass naming the buffer ids at fault).
    ValueError
        If two buffers share an id.
    """
    errors = find_violations(buffers, offsets, capacity_bytes)
    if errors:
        raise errors[0]
