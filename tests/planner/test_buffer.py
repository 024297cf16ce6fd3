"""Tests of the data model: Buffer checks, lower bound and live-bytes profile."""

from itertools import combinations

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from relax_memplan.planner import Buffer, Plan, live_bytes_profile, peak_live_bytes
from relax_memplan.planner.buffer import sorted_distinct
from relax_memplan.planner.placement import Problem

from .strategies import buffer_lists


@pytest.mark.parametrize(
    "kwargs, fragment",
    [
        (dict(start=2, end=2, size_bytes=8), "end (2) must be > start (2)"),
        (dict(start=3, end=1, size_bytes=8), "end (1) must be > start (3)"),
        (dict(start=0, end=1, size_bytes=0), "size_bytes must be > 0"),
        (dict(start=0, end=1, size_bytes=8, alignment_bytes=0), "alignment_bytes must be >= 1"),
        (dict(start=0.5, end=1, size_bytes=8), "start must be an integer"),
        (dict(start=True, end=2, size_bytes=8), "start must be an integer"),
    ],
)
def test_buffer_rejects_bad_fields_naming_id(kwargs, fragment):
    with pytest.raises(ValueError, match="'weight_7'") as info:
        Buffer("weight_7", **kwargs)
    assert fragment in str(info.value)


def test_buffer_rejects_empty_id():
    with pytest.raises(ValueError, match="non-empty str"):
        Buffer("", 0, 1, 8)


def test_buffer_accepts_numpy_integers_as_python_ints():
    buf = Buffer("x", np.int64(1), np.int32(4), np.int64(16), np.int64(8))
    assert (buf.start, buf.end, buf.size_bytes, buf.alignment_bytes) == (1, 4, 16, 8)
    assert type(buf.size_bytes) is int


def test_buffer_is_frozen():
    buf = Buffer("x", 0, 1, 8)
    with pytest.raises(AttributeError):
        buf.size_bytes = 4


@pytest.mark.parametrize(
    "ranges, expected",
    [
        ([], 0),
        ([(0, 2, 100)], 100),
        ([(0, 2, 100), (2, 4, 100)], 100),  # half-open: touching ranges never coexist
        ([(0, 3, 100), (2, 4, 100)], 200),
        ([(0, 2, 100), (2, 4, 50), (4, 6, 70)], 100),  # chain
        ([(0, 10, 10), (1, 3, 20), (2, 5, 30), (4, 6, 40)], 80),  # peak at step 4
        ([(0, 1, 5), (0, 1, 7), (0, 1, 11)], 23),
    ],
)
def test_peak_live_bytes_exact(ranges, expected):
    buffers = [Buffer(f"b{i}", s, e, size) for i, (s, e, size) in enumerate(ranges)]
    assert peak_live_bytes(buffers) == expected


def test_live_bytes_profile_lists_each_event_step():
    buffers = [Buffer("a", 0, 2, 100), Buffer("b", 2, 4, 100), Buffer("c", 1, 3, 10)]
    assert live_bytes_profile(buffers) == [(0, 100), (1, 110), (2, 110), (3, 100), (4, 0)]
    assert live_bytes_profile([]) == []


def test_plan_ratio():
    assert Plan({"a": 0}, 150, 100, "x").ratio == 1.5
    assert Plan({}, 0, 0, "x").ratio == 1.0
    assert "50 bytes (50.0%) above it" in Plan({"a": 0}, 150, 100, "x").summary()


@settings(max_examples=80, deadline=None)
@given(st.lists(st.integers(-5, 40), max_size=60))
def test_sorted_distinct_equals_numpy_unique(values):
    assert sorted_distinct(values).tolist() == np.unique(np.asarray(values, dtype=np.int64)).tolist()


@settings(max_examples=80, deadline=None)
@given(buffer_lists(max_buffers=30))
def test_overlapping_pairs_count_equals_brute_force(buffers):
    pairs = sum(x.overlaps_in_time(y) for x, y in combinations(buffers, 2))
    assert Problem(buffers).count_overlapping_pairs() == pairs
