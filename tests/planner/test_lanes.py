"""Size-class lanes: valid plans, within their bound, and the short-budget fallback of plan()."""

import math
import random

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from relax_memplan.planner import Buffer, peak_live_bytes, plan, validate
from relax_memplan.planner.lanes import size_class_lanes
from relax_memplan.planner.placement import Problem
from relax_memplan.planner.portfolio import LANES_NAME

from .clocks import work_clock
from .strategies import assert_no_overlap_brute_force, buffer_lists


@settings(max_examples=150, deadline=None)
@given(buffer_lists(max_buffers=40), st.sampled_from([2.0, 2 ** 0.5, 1.1]))
def test_lanes_never_overlap(buffers, ratio):
    offsets = size_class_lanes(Problem(buffers), ratio)
    assert_no_overlap_brute_force(buffers, offsets)


@settings(max_examples=100, deadline=None)
@given(buffer_lists(max_buffers=40, alignments=(1,)), st.sampled_from([2.0, 2 ** 0.5]))
def test_lanes_height_within_ratio_times_the_class_peaks(buffers, ratio):
    # Each class uses as many lanes as it has buffers live at once, each lane at most
    # ``ratio`` times its smallest member: height <= ratio x sum of per-class peaks.
    p = Problem(buffers)
    height = p.height(size_class_lanes(p, ratio))
    classes = {}
    for b in buffers:
        classes.setdefault(math.floor(math.log(b.size_bytes) / math.log(ratio)), []).append(b)
    assert height <= ratio * sum(peak_live_bytes(c) for c in classes.values()) + 1e-6


def test_lanes_bound_check_fails_on_a_stacked_plan():
    # The bound of the test above is not vacuous: stacking three buffers live at different
    # times (the plan lanes must beat) breaks it.
    buffers = [Buffer("a", 0, 1, 10), Buffer("b", 1, 2, 10), Buffer("c", 2, 3, 10)]
    assert Problem(buffers).height([0, 10, 20]) > 2.0 * peak_live_bytes(buffers)
    assert Problem(buffers).height(size_class_lanes(Problem(buffers), 2.0)) == 10


def test_bad_ratio_is_rejected():
    with pytest.raises(ValueError, match="lane ratio"):
        size_class_lanes(Problem([Buffer("a", 0, 1, 8)]), 1.0)


def _random_buffers(count, seed):
    """The benchmark's random instance: 10,000 steps, lifetimes 1..100, 64 B..1 MiB."""
    rnd = random.Random(seed)
    out = []
    for i in range(count):
        start = rnd.randrange(10_000)
        out.append(Buffer(f"t{i}", start, start + rnd.randint(1, 100), rnd.randint(64, 1 << 20)))
    return out


@pytest.fixture(scope="module")
def random_20k():
    return _random_buffers(20_000, 0)


def test_budget_far_below_one_pass_returns_a_valid_plan(random_20k):
    # One skyline pass on 20k buffers costs about 0.2-0.3 s CPU; 0.1 s is far below it, so
    # the plan comes from the lanes (or a pass cut short on top of them). Whether the budget
    # is kept is measured by benchmarks/planner_budget_bench.py (real work, moved by load).
    with work_clock():
        result = plan(random_20k, time_limit_s=0.1)
    validate(random_20k, result.offsets)
    assert result.ratio <= 2.0
    assert result.algorithm in (LANES_NAME, "lowest_first_by_area")


def _skyline_drop_height(p):
    """Height of the old fallback: every buffer dropped, largest first, on top of the
    skyline over its range (what a pass past its deadline did before the lanes)."""
    lo, hi, num_steps = p.step_arrays
    sky = np.zeros(num_steps, dtype=np.int64)
    for u in np.argsort(-np.asarray(p.size), kind="stable").tolist():
        sky[lo[u]:hi[u]] = sky[lo[u]:hi[u]].max() + p.size[u]
    return int(sky.max())


def test_old_fallback_fails_the_short_budget_ratio_bound(random_20k):
    # The bound above is one the old fallback does not meet (2.28 x LB); the lanes do.
    p = Problem(random_20k)
    assert _skyline_drop_height(p) / p.lower_bound > 2.0
    assert p.height(size_class_lanes(p)) / p.lower_bound <= 2.0


def test_no_time_for_any_pass_returns_the_lanes():
    # first_pass_count 0 (not even a partial pass fits) once read as "a full pass fits"
    # (0 is falsy): the full pass ran and overran the budget.
    from unittest.mock import patch

    from relax_memplan.planner import portfolio

    buffers = _random_buffers(500, 3)
    with patch.object(portfolio, "use_skyline", return_value=True), \
            patch.object(portfolio, "first_pass_count", return_value=0), \
            patch.object(portfolio, "lowest_first_sweep", side_effect=AssertionError):
        result = plan(buffers, time_limit_s=1.0, search=False)
    assert result.algorithm == LANES_NAME
    validate(buffers, result.offsets)
