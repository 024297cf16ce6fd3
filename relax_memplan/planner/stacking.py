"""Stacking: turn one plan into a layout that stays valid when buffer sizes change.

A plan found at one *reference* size of every buffer fixes, for each pair of
buffers live at the same time, which one lies below the other. Keeping that
order and recomputing offsets as

    offset(b) = align(max(0, max over buffers c below b of offset(c) + size(c)))

gives a valid plan for **any** sizes: two time-overlapping buffers never
overlap in address, because the upper one starts at or above the end of the
lower one. This is how a symbolic arena (sizes depending on dims such as
``seq_len``) gets offsets that are expressions valid at every shape; at the
reference sizes it is the reference plan pushed down as far as it goes
(never higher). The idea follows the "gravity" compaction of strip-packing
heuristics (e.g. Baker, Coffman & Rivest's bottom-left packing, 1980).
"""

from __future__ import annotations

from typing import Callable, Dict, List, Mapping, Sequence, Tuple

from .buffer import Buffer

__all__ = ["stacking_order", "stacked_offsets"]


def stacking_order(
    buffers: Sequence[Buffer], offsets: Mapping[str, int]
) -> List[Tuple[str, Tuple[str, ...]]]:
    """The below-relation of a plan, in an order where every buffer follows those below it.

    Parameters
    ----------
    buffers : sequence of Buffer
        The buffers (live ranges in steps).
    offsets : mapping of str to int
        A valid plan of ``buffers`` (bytes).

    Returns
    -------
    list of (str, tuple of str)
        ``(buffer id, ids of the time-overlapping buffers placed below it)``,
        sorted by offset (then id), so each buffer comes after all buffers below it.

    Raises
    ------
    KeyError
        If a buffer has no offset.
    """
    ordered = sorted(buffers, key=lambda b: (offsets[b.id], b.id))
    result: List[Tuple[str, Tuple[str, ...]]] = []
    for k, b in enumerate(ordered):
        # In a valid plan a time-overlapping buffer with a lower offset ends below b.
        below = tuple(c.id for c in ordered[:k] if c.start < b.end and b.start < c.end)
        result.append((b.id, below))
    return result


def stacked_offsets(
    order: Sequence[Tuple[str, Tuple[str, ...]]],
    size_bytes: Callable[[str], int] | Mapping[str, int],
    alignment_bytes: int = 1,
) -> Tuple[Dict[str, int], int]:
    """Offsets (and height) of a stacking for concrete sizes.

    Parameters
    ----------
    order : sequence of (str, tuple of str)
        From :func:`stacking_order`.
    size_bytes : mapping or callable
        Size in bytes of each buffer id at the shape of interest.
    alignment_bytes : int
        Every offset is rounded up to a multiple of this.

    Returns
    -------
    (dict of str to int, int)
        Offsets in bytes, and the height (max of offset + size).
    """
    size = size_bytes if callable(size_bytes) else size_bytes.__getitem__
    offsets: Dict[str, int] = {}
    top: Dict[str, int] = {}
    height = 0
    for bid, below in order:
        base = max((top[c] for c in below), default=0)
        off = -(-base // alignment_bytes) * alignment_bytes
        offsets[bid] = off
        top[bid] = off + size(bid)
        height = max(height, top[bid])
    return offsets, height
