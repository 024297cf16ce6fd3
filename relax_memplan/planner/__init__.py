"""Pure-Python offset planner for arena memory planning (no TVM import).

Buffers with half-open live ranges ``[start, end)`` in program steps and sizes in bytes go
in, byte offsets come out, with the no-fragmentation lower bound (:func:`peak_live_bytes`)
next to every result and a separate validator. Problems can be read and written in the
MiniMalloc CSV format.

Example
-------
>>> from relax_memplan.planner import Buffer, plan
>>> result = plan([Buffer("a", 0, 2, 100), Buffer("b", 2, 4, 100)], time_limit_s=0.1)
>>> result.height_bytes, result.lower_bound_bytes
(100, 100)
"""

from .algorithms import ALGORITHMS, DETERMINISTIC, iterated_greedy
from .buffer import Buffer, Plan, live_bytes_profile, peak_live_bytes
from .compiled import warm_up
from .csv_io import read_csv, read_csv_solution, write_csv
from .portfolio import plan
from .stacking import stacked_offsets, stacking_order
from .validate import (
    CapacityExceededError,
    InvalidOffsetError,
    MisalignmentError,
    MissingOffsetError,
    NestingError,
    OverlapError,
    PlanError,
    find_violations,
    validate,
)

__all__ = [
    "ALGORITHMS",
    "DETERMINISTIC",
    "Buffer",
    "CapacityExceededError",
    "InvalidOffsetError",
    "MisalignmentError",
    "MissingOffsetError",
    "NestingError",
    "OverlapError",
    "Plan",
    "PlanError",
    "find_violations",
    "iterated_greedy",
    "live_bytes_profile",
    "peak_live_bytes",
    "plan",
    "read_csv",
    "read_csv_solution",
    "stacked_offsets",
    "stacking_order",
    "validate",
    "warm_up",
    "write_csv",
]
