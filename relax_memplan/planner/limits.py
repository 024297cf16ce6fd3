"""The check of a planner's wall-clock budget, shared by :func:`~relax_memplan.planner.plan`,
:func:`~relax_memplan.planner.iterated_greedy` and the planning passes
(``relax_memplan.transform._args.check_planner_args``), so each refuses the same values with
the same message."""

from __future__ import annotations

import math

__all__ = ["check_time_limit_s"]


def check_time_limit_s(time_limit_s) -> float:
    """``time_limit_s`` as a float after checking it is a finite number of seconds > 0.

    Parameters
    ----------
    time_limit_s : int or float
        Wall-clock budget in seconds.

    Returns
    -------
    float
        The same budget in seconds.

    Raises
    ------
    TypeError
        Not an int or float (a bool or a string such as ``'2'`` included).
    ValueError
        Zero, negative, NaN or infinite (with ``time_limit_s=0``, ``-1`` or ``nan`` the planner
        would run no pass and return a plan 4.13x the lower bound).
    """
    if isinstance(time_limit_s, bool) or not isinstance(time_limit_s, (int, float)):
        raise TypeError(f"time_limit_s must be a number, got {time_limit_s!r}")
    if not math.isfinite(time_limit_s) or time_limit_s <= 0:
        raise ValueError(f"time_limit_s must be a finite number > 0, got {time_limit_s}")
    return float(time_limit_s)
