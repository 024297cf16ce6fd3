"""Data model of the offset planner: buffers with half-open live ranges, plans, lower bound.

A buffer lives over the half-open step interval ``[start, end)`` and needs ``size_bytes``
contiguous bytes at an offset that is a multiple of ``alignment_bytes``. Two buffers may
share addresses only if their live ranges do not intersect, so ``[0, 2)`` and ``[2, 4)``
may sit at the same offset. This is the model of dynamic storage allocation used by the
XLA heap simulator, TFLite's offset planners and MiniMalloc (ASPLOS 2023).

The lower bound next to every plan is :func:`peak_live_bytes`: no placement can be lower
than the largest total size of buffers live at one step (it ignores fragmentation and
alignment padding).
"""

from __future__ import annotations

import operator
from dataclasses import dataclass, field
from typing import Iterable, Sequence, Tuple

import numpy as np

__all__ = ["Buffer", "Plan", "peak_live_bytes", "live_bytes_profile", "check_unique_ids",
           "union_bytes"]


def _as_int(value, name: str, buffer_id) -> int:
    """Return ``value`` as a Python int (numpy integers accepted, bools rejected)."""
    if isinstance(value, bool):
        raise ValueError(f"buffer {buffer_id!r}: {name} must be an integer, got bool {value!r}")
    try:
        return operator.index(value)
    except TypeError:
        raise ValueError(
            f"buffer {buffer_id!r}: {name} must be an integer, got {type(value).__name__} {value!r}"
        ) from None


@dataclass(frozen=True)
class Buffer:
    """One allocation request of the offset planner.

    Parameters
    ----------
    id : str
        Unique, non-empty name of the buffer (unique within one planning problem).
    start : int
        First program step (inclusive) at which the buffer is live, in steps.
    end : int
        First step (exclusive) at which the buffer is dead, in steps; ``end > start``.
        The live range is the half-open interval ``[start, end)``.
    size_bytes : int
        Number of bytes the buffer occupies; ``> 0``.
    alignment_bytes : int, optional
        The offset must be a multiple of this many bytes; ``>= 1`` (a power of two is not
        required). Default 1.

    Raises
    ------
    ValueError
        If a field has the wrong type or value; the message names the buffer id.
    """

    id: str
    start: int
    end: int
    size_bytes: int
    alignment_bytes: int = 1

    def __post_init__(self):
        if not isinstance(self.id, str) or not self.id:
            raise ValueError(f"buffer id must be a non-empty str, got {self.id!r}")
        for name in ("start", "end", "size_bytes", "alignment_bytes"):
            object.__setattr__(self, name, _as_int(getattr(self, name), name, self.id))
        if self.end <= self.start:
            raise ValueError(
                f"buffer {self.id!r}: end ({self.end}) must be > start ({self.start}); "
                "live ranges are half-open [start, end)"
            )
        if self.size_bytes <= 0:
            raise ValueError(f"buffer {self.id!r}: size_bytes must be > 0, got {self.size_bytes}")
        if self.alignment_bytes < 1:
            raise ValueError(
                f"buffer {self.id!r}: alignment_bytes must be >= 1, got {self.alignment_bytes}"
            )

    @property
    def lifetime(self) -> int:
        """Number of steps the buffer is live (``end - start``)."""
        return self.end - self.start

    def overlaps_in_time(self, other: "Buffer") -> bool:
        """Return True if the half-open live ranges of ``self`` and ``other`` intersect."""
        return self.start < other.end and other.start < self.end


@dataclass(frozen=True)
class Plan:
    """Result of offset planning.

    Parameters
    ----------
    offsets : dict of str to int
        Byte offset of every buffer, keyed by buffer id.
    height_bytes : int
        Arena size needed: max over buffers of ``offset + size_bytes`` (0 if empty).
    lower_bound_bytes : int
        :func:`peak_live_bytes` of the same buffers; no plan can be lower.
    algorithm : str
        Name of the algorithm that produced the offsets (a key of ``ALGORITHMS`` or the
        improvement search).
    sweep : str
        Which lowest-first skyline sweep ran on a large graph: ``"numba"`` (compiled, see
        :mod:`relax_memplan.planner.compiled`) or ``"python"``; ``""`` when the problem
        was planned on its conflict lists (the Python sweep's orders may have seeded it).
    sweep_reason : str
        Why the Python sweep ran (numba not importable, its cache cold, no time to load
        it; see :func:`relax_memplan.planner.warm_up`); ``""`` otherwise.
    """

    offsets: dict = field(default_factory=dict)
    height_bytes: int = 0
    lower_bound_bytes: int = 0
    algorithm: str = ""
    sweep: str = ""
    sweep_reason: str = ""

    @property
    def ratio(self) -> float:
        """``height_bytes / lower_bound_bytes`` (1.0 if the lower bound is 0)."""
        if self.lower_bound_bytes == 0:
            return 1.0
        return self.height_bytes / self.lower_bound_bytes

    def summary(self) -> str:
        """One line in plain words: height, lower bound and how far above it the plan is."""
        extra = self.height_bytes - self.lower_bound_bytes
        return (
            f"{self.algorithm}: arena {self.height_bytes} bytes for {len(self.offsets)} buffers, "
            f"lower bound {self.lower_bound_bytes} bytes, {extra} bytes "
            f"({100.0 * (self.ratio - 1.0):.1f}%) above it"
        )


def check_unique_ids(buffers: Sequence[Buffer]) -> None:
    """Raise ValueError naming the first id that occurs twice in ``buffers``."""
    seen = set()
    for buf in buffers:
        if buf.id in seen:
            raise ValueError(f"buffer id {buf.id!r} occurs more than once")
        seen.add(buf.id)


def _events(buffers: Iterable[Buffer]) -> list[tuple[int, int]]:
    """Return (step, delta bytes) events sorted so that frees precede allocations at a step."""
    events = []
    for buf in buffers:
        events.append((buf.start, buf.size_bytes))
        events.append((buf.end, -buf.size_bytes))
    # Negative deltas sort first at the same step: [0, 2) and [2, 4) never count together.
    events.sort()
    return events


def live_bytes_profile(buffers: Iterable[Buffer]) -> list[tuple[int, int]]:
    """Total live bytes after each event step.

    Parameters
    ----------
    buffers : iterable of Buffer
        The buffers; ids are not used.

    Returns
    -------
    list of (int, int)
        ``(step, live_bytes)`` for every distinct step at which some buffer starts or ends,
        in increasing step order; ``live_bytes`` holds from that step until the next listed
        step. The last entry has 0 live bytes. Empty input gives an empty list.
    """
    profile: list[tuple[int, int]] = []
    live = 0
    for step, delta in _events(buffers):
        live += delta
        if profile and profile[-1][0] == step:
            profile[-1] = (step, live)
        else:
            profile.append((step, live))
    return profile


def union_bytes(ranges: Iterable[Tuple[int, int]]) -> int:
    """Bytes covered by byte ranges ``(offset, size)`` (each ``[offset, offset + size)``),
    overlaps counted once: what tensors placed inside one another (a concatenation's inputs
    inside its output, an in-place chain at one offset) occupy together."""
    covered, end = 0, None
    for start, size in sorted((o, s) for o, s in ranges if s > 0):
        stop = start + size
        if end is None or start >= end:
            covered += size
            end = stop
        elif stop > end:
            covered += stop - end
            end = stop
    return covered


def peak_live_bytes(buffers: Iterable[Buffer]) -> int:
    """Lower bound on the arena size: the max over steps of the sum of live sizes, in bytes.

    Parameters
    ----------
    buffers : iterable of Buffer
        The buffers; live ranges are half-open, so a buffer ending at step ``t`` and one
        starting at ``t`` are never counted together.

    Returns
    -------
    int
        Peak live bytes (0 for no buffers).
    """
    buffers = list(buffers)
    sizes = [b.size_bytes for b in buffers]
    if not buffers:
        return 0
    if sum(sizes) >= 1 << 62:  # beyond int64: exact Python ints
        peak = live = 0
        for _, delta in _events(buffers):
            live += delta
            peak = max(peak, live)
        return peak
    return live_peak_of_arrays([b.start for b in buffers], [b.end for b in buffers], sizes)


def live_peak_of_arrays(start, end, size_bytes) -> int:
    """:func:`peak_live_bytes` of buffers given as parallel sequences (numpy, int64 sums)."""
    if len(start) == 0:
        return 0
    size = np.asarray(size_bytes, dtype=np.int64)
    steps = np.concatenate([np.asarray(start, dtype=np.int64), np.asarray(end, dtype=np.int64)])
    delta = np.concatenate([size, -size])
    if steps.size and (steps.min() < -(1 << 61) or steps.max() >= 1 << 61):
        order = np.lexsort((delta, steps))  # at one step, frees (negative) first
    else:  # the same order from one argsort of 2 * step + (allocation)
        order = np.argsort(2 * steps + (delta > 0))
    return max(int(np.cumsum(delta[order]).max()), 0)


def sorted_distinct(values) -> np.ndarray:
    """The distinct values of an int64 array, sorted (``np.unique`` without its first-call
    import of ``numpy.ma``, about 40 ms, which would count against a planning budget)."""
    values = np.sort(np.asarray(values, dtype=np.int64))
    keep = np.ones(len(values), dtype=bool)
    keep[1:] = values[1:] != values[:-1]
    return values[keep]
