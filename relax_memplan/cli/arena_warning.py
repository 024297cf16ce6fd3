"""The warning ``relax-memplan compile --dim`` prints when the arena at the largest sampled
shape (the upper bounds of the declared ranges) would not fit in this machine's memory.

``--dim batch=1..1000000`` plans a 393 GB arena; a range that generous is usually a typo or
a bound copied from a placeholder, and without the warning nothing says so.
"""

from __future__ import annotations

import os
from typing import Iterable, Mapping, Optional, Tuple

__all__ = ["FALLBACK_LIMIT_BYTES", "machine_memory_bytes", "large_arena_warning"]

FALLBACK_LIMIT_BYTES = 64 * 1024 ** 3
"""Limit used where the physical memory cannot be read (not Linux/macOS): 64 GiB, the memory of
a large workstation; an arena above it does not fit on most machines that run these models."""


def machine_memory_bytes() -> Optional[int]:
    """Physical memory of this machine in bytes (``os.sysconf``), or ``None`` if unknown."""
    try:
        return os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")
    except (AttributeError, ValueError, OSError):
        return None


def _largest_row(reports: Iterable) -> Optional[Tuple[int, Mapping[str, int], Mapping]]:
    """(arena bytes, dims, declared ranges) of the planned row with the largest arena."""
    rows = [(s.arena_bytes, s.dims, r.dims) for r in reports for s in r.shapes
            if s.planned and s.arena_bytes]
    return max(rows, key=lambda row: row[0]) if rows else None


def large_arena_warning(reports: Iterable, limit_bytes: Optional[int] = None) -> Optional[str]:
    """One line when the largest arena of the sampled shapes exceeds ``limit_bytes``, naming
    the shape and the dims that drive it (each dim's value over its declared lower bound,
    largest factor first); ``None`` otherwise.

    Parameters
    ----------
    reports : iterable of CompileReport
        The reports of one ``compile --dim`` (one per strategy); static ones have no rows with
        dims and give nothing.
    limit_bytes : int, optional
        Bytes; default this machine's physical memory (:func:`machine_memory_bytes`), else
        :data:`FALLBACK_LIMIT_BYTES`.
    """
    found = _largest_row(reports)
    if found is None:
        return None
    arena, dims, ranges = found
    where = "the limit"
    if limit_bytes is None:
        limit_bytes, where = machine_memory_bytes(), "this machine's memory"
        if limit_bytes is None:
            limit_bytes, where = FALLBACK_LIMIT_BYTES, "the limit (memory size unknown)"
    if arena <= limit_bytes or not dims:
        return None
    factors = sorted(((value / max(ranges[name][0], 1), name, value)
                      for name, value in dims.items() if name in ranges), reverse=True)
    drivers = ", ".join(f"{name}={value} ({factor:,.0f}x its lower bound {ranges[name][0]})"
                        for factor, name, value in factors if factor > 1)
    shape = ", ".join(f"{k}={v}" for k, v in dims.items())
    return (f"the arena at {shape} is {arena:,} B ({arena / 1024 ** 3:,.1f} GiB), more than "
            f"{where} ({limit_bytes / 1024 ** 3:,.1f} GiB); it grows with "
            f"{drivers or 'no dim (constant)'}: lower the upper bound of --dim")
