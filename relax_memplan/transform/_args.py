"""Checks of the arguments shared by the planning passes (clear errors at construction)."""

from __future__ import annotations

from typing import Dict, List, Mapping, Optional, Sequence, Tuple

from ..planner import ALGORITHMS
from ..planner.limits import check_time_limit_s

__all__ = ["check_planner_args", "check_buckets"]


def check_planner_args(
    alignment_bytes, algorithms: Optional[Sequence[str]], time_limit_s
) -> Tuple[int, Optional[Tuple[str, ...]], float]:
    """Validate and normalise ``alignment_bytes``, ``algorithms`` and ``time_limit_s``.

    Raises
    ------
    TypeError
        A value of the wrong type.
    ValueError
        Alignment not a power of two >= 64, an empty or unknown algorithm list,
        a time limit that is not a finite number > 0.
    """
    if isinstance(alignment_bytes, bool) or not isinstance(alignment_bytes, int):
        raise TypeError(f"alignment_bytes must be an int, got {alignment_bytes!r}")
    if alignment_bytes < 64 or alignment_bytes & (alignment_bytes - 1):
        raise ValueError(f"alignment_bytes must be a power of two >= 64, got {alignment_bytes}")
    if algorithms is not None:
        if isinstance(algorithms, str):
            raise TypeError("algorithms must be a sequence of names, not one string")
        algorithms = tuple(algorithms)
        if not algorithms:
            raise ValueError("algorithms is empty; pass None to try all")
        unknown = [a for a in algorithms if a not in ALGORITHMS]
        if unknown:
            raise ValueError(f"unknown algorithm(s) {unknown}; known: {', '.join(sorted(ALGORITHMS))}")
    return alignment_bytes, algorithms, check_time_limit_s(time_limit_s)


def check_buckets(buckets) -> Dict[str, Tuple[int, ...]]:
    """Validate ``{dim name: bucket values}``; values de-duplicated, in the order given.

    Raises
    ------
    TypeError
        Not a mapping of non-empty names to sequences of ints.
    ValueError
        An empty value list or a value < 1.
    """
    if isinstance(buckets, (str, bytes)) or not isinstance(buckets, Mapping):
        raise TypeError(f"buckets must map var names to bucket values, got {buckets!r}")
    out: Dict[str, Tuple[int, ...]] = {}
    for name, values in buckets.items():
        if not isinstance(name, str) or not name:
            raise TypeError(f"bucket var names must be non-empty strings, got {name!r}")
        if isinstance(values, (str, bytes)) or not isinstance(values, Sequence):
            raise TypeError(f"buckets['{name}'] must be a list of ints (any sequence of ints), "
                            f"got {values!r}")
        if not values:
            raise ValueError(f"buckets['{name}'] is empty; give at least one bucket value")
        clean: List[int] = []
        for v in values:
            if isinstance(v, bool) or not isinstance(v, int):
                raise TypeError(f"buckets['{name}'] must hold ints, got {v!r}")
            if v <= 0:
                raise ValueError(f"bucket value {v} of var '{name}' is not positive (a value < 1 "
                                 f"cannot be a dim)")
            if v not in clean:
                clean.append(v)
        out[name] = tuple(clean)
    return out
