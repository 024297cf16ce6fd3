"""The report's tensor rows (dicts of ``size_bytes``, half-open ``live_range`` in program steps,
``offset_bytes`` and ``arena`` when placed): which rows hold storage, the bytes they occupy
together and the step where they peak. Pure Python over the rows, so that the text, the
plot and the summaries that write the rows share one rule, the lower bound's.
"""

from __future__ import annotations

from typing import Dict, List, Optional, Sequence, Tuple

from ..planner.buffer import union_bytes

__all__ = ["storage_rows", "peak_of", "live_storage_bytes", "concrete_tensors"]


def storage_rows(rows: Sequence[Dict]) -> List[Dict]:
    """The rows that hold storage (not those placed inside another), a group's root with the
    bytes and span of its whole group (``group_size_bytes``, ``group_live_range``)."""
    return [dict(r, size_bytes=r.get("group_size_bytes", r["size_bytes"]),
                 live_range=list(r.get("group_live_range", r["live_range"])))
            for r in rows if "inside" not in r]


def peak_of(rows: Sequence[Dict]) -> Tuple[Optional[int], List[str]]:
    """The step where the storage of ``rows`` (``size_bytes``, half-open ``live_range``)
    peaks, and the names of the rows holding storage there, largest first; ``(None, [])``
    for no rows. Members of a placement group (``inside``) hold no storage of their own:
    their root does, over the group's span (:func:`storage_rows`, the lower bound's rule);
    rows without groups that overlap in bytes count once (:func:`live_storage_bytes`)."""
    rows = storage_rows(rows)
    if not rows:
        return None, []

    def live_at(step):
        return [r for r in rows if r["live_range"][0] <= step < r["live_range"][1]]

    best, peak_step = -1, None
    for step in sorted({r["live_range"][0] for r in rows}):  # bytes rise only where one starts
        live = live_storage_bytes(live_at(step))
        if live > best:
            best, peak_step = live, step
    at_peak = sorted(live_at(peak_step), key=lambda r: (-r["size_bytes"], r["name"]))
    return peak_step, [r["name"] for r in at_peak]


def live_storage_bytes(rows: Sequence[Dict]) -> int:
    """Bytes the tensors of ``rows`` occupy together: with ``offset_bytes`` (and ``arena``),
    the union of their byte ranges per arena (a concatenation's inputs placed inside its
    output, an in-place chain at one offset: counted once); else the sum of ``size_bytes``.

    Counted as a sum, yolov8n's report would say "live at the peak: 4 tensors, 2,457,600 B",
    above its 2,048,000 B arena: the concat output and its three inputs placed inside it
    twice."""
    if not all("offset_bytes" in r for r in rows):
        return sum(r["size_bytes"] for r in rows)
    arenas: Dict[int, List[Tuple[int, int]]] = {}
    for r in rows:
        arenas.setdefault(r.get("arena", 0), []).append((r["offset_bytes"], r["size_bytes"]))
    return sum(union_bytes(ranges) for ranges in arenas.values())


def _storage_rows(rows: Sequence[Dict]) -> List[Dict]:
    """One row per storage: an in-place group as its first tensor's row, live over the group's
    span (its tensors share one offset, so their bytes count once)."""
    by_name = {r["name"]: dict(r) for r in rows}
    for r in rows:
        first = by_name.get(r.get("shares_storage_with"))
        if first is not None:
            first["live_range"] = [min(first["live_range"][0], r["live_range"][0]),
                                   max(first["live_range"][1], r["live_range"][1])]
    return [r for r in by_name.values() if not r.get("shares_storage_with")]


def concrete_tensors(tensors: Sequence[Dict], k: int) -> List[Dict]:
    """``tensors`` of a dynamic report at its ``k``-th sampled shape: ``size_bytes`` and
    ``offset_bytes`` as in a static report's rows."""
    return [dict(t, size_bytes=t["size_bytes_at_shapes"][k],
                 offset_bytes=t["offset_bytes_at_shapes"][k]) for t in tensors]
