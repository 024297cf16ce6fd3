"""Tests of plan(): best-of selection, validity, lower bound, speed."""

import random
from pathlib import Path

import pytest
from hypothesis import given, settings

from relax_memplan.planner import Buffer, Plan, peak_live_bytes, plan, read_csv, validate
from relax_memplan.planner.portfolio import SEARCH_NAME

from .strategies import buffer_lists, padded_total_bytes

BENCH = Path(__file__).parents[2].parent / "shared" / "bench" / "minimalloc-challenging"


@settings(max_examples=40, deadline=None)
@given(buffer_lists())
def test_plan_is_valid_and_within_bounds(buffers):
    result = plan(buffers, time_limit_s=0.02)
    validate(buffers, result.offsets)
    assert result.lower_bound_bytes == peak_live_bytes(buffers)
    assert result.lower_bound_bytes <= result.height_bytes <= padded_total_bytes(buffers)
    assert result.height_bytes == max(
        (result.offsets[b.id] + b.size_bytes for b in buffers), default=0
    )


def test_empty_input_has_zero_height():
    result = plan([])
    assert isinstance(result, Plan)
    assert (result.offsets, result.height_bytes, result.lower_bound_bytes) == ({}, 0, 0)
    assert result.ratio == 1.0


@pytest.mark.parametrize(
    "ranges, expected_height",
    [
        ([(0, 2, 100), (2, 4, 100)], 100),  # chain: one slot
        ([(0, 3, 100), (2, 4, 100)], 200),  # overlap: stacked
        ([(0, 4, 30), (0, 2, 50), (2, 4, 50)], 80),  # two reuse one slot beside a long one
    ],
)
def test_tiny_instances_reach_lower_bound(ranges, expected_height):
    buffers = [Buffer(f"b{i}", s, e, size) for i, (s, e, size) in enumerate(ranges)]
    result = plan(buffers, time_limit_s=0.1)
    assert result.height_bytes == result.lower_bound_bytes == expected_height


def test_stops_early_at_lower_bound():
    buffers = [Buffer(f"b{i}", i, i + 2, 64) for i in range(50)]
    result = plan(buffers, time_limit_s=10.0)
    # the search is skipped once the lower bound is reached (no 10 s wait)
    assert result.algorithm != SEARCH_NAME
    assert result.height_bytes == result.lower_bound_bytes == 128


def test_selected_algorithms_only_without_search():
    buffers = [Buffer("a", 0, 3, 100), Buffer("b", 2, 4, 100)]
    result = plan(buffers, algorithms=["greedy_by_size"], search=False)
    assert result.algorithm == "greedy_by_size"
    with pytest.raises(KeyError, match="no_such"):
        plan(buffers, algorithms=["no_such"])


def test_10k_random_buffers_plan_validly():
    """Speed is measured in benchmarks/planner_bench.py; here only the result."""
    rnd = random.Random(1)
    buffers = []
    for i in range(10_000):
        start = rnd.randrange(10_000)
        buffers.append(Buffer(f"t{i}", start, start + rnd.randint(1, 100), rnd.randint(64, 1 << 20)))
    result = plan(buffers, time_limit_s=0.05)
    validate(buffers, result.offsets)
    assert result.ratio < 1.2


@pytest.mark.skipif(not BENCH.is_dir(), reason="MiniMalloc benchmark not checked out")
def test_minimalloc_instance_a_within_target():
    buffers = read_csv(BENCH / "A.1048576.csv")
    result = plan(buffers, time_limit_s=0.5)
    assert result.lower_bound_bytes == 1048576
    assert result.ratio <= 1.35
