"""Clocks for the planner's budget tests that the machine's load does not move.

The planner reads its wall clock as ``time.perf_counter()`` (and its thread's CPU time as
``time.thread_time()``) at every budget decision; these context managers replace
``time.perf_counter`` while a test runs and yield the clock the planner then reads, so that a
test asserts the budget on that clock, never on the time of the machine running the suite.
"""

from __future__ import annotations

import contextlib
import time
from typing import Callable, Iterator
from unittest.mock import patch

__all__ = ["ticking_clock", "work_clock"]


@contextlib.contextmanager
def ticking_clock(step_s: float = 0.01) -> Iterator[Callable[[], float]]:
    """A wall clock that moves ``step_s`` seconds at each reading and never else: a pass
    that keeps reading it (spinning) runs into its deadline in a few hundred readings."""
    now = [time.perf_counter()]

    def read() -> float:
        now[0] += step_s
        return now[0]

    with patch.object(time, "perf_counter", read):
        yield read


@contextlib.contextmanager
def work_clock(slowdown: float = 1.0) -> Iterator[Callable[[], float]]:
    """A wall clock that runs ``slowdown`` times as fast as the calling thread's CPU time (the
    planner's work): 2.0 is a machine where the wall clock runs twice as fast as the work,
    as the planner sees a loaded machine, whatever the real load. The CPU clock
    (``time.thread_time``) is the real one."""
    cpu, start, cpu0 = time.thread_time, time.perf_counter(), time.thread_time()

    def read() -> float:
        return start + slowdown * (cpu() - cpu0)

    with patch.object(time, "perf_counter", read):
        yield read
