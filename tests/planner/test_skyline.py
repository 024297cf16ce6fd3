"""The skyline placement equals the conflict-list one, and its plans have no overlap."""

import time
from itertools import combinations

from hypothesis import given, settings

from relax_memplan.planner import Buffer
from relax_memplan.planner.algorithms import area_key, lifetime_key, size_key
from relax_memplan.planner.placement import Problem
from relax_memplan.planner.skyline import lowest_first_sweep

from .strategies import buffer_lists


def _brute_force_valid(buffers, offsets):
    for i, j in combinations(range(len(buffers)), 2):
        x, y = buffers[i], buffers[j]
        if x.overlaps_in_time(y):
            assert offsets[i] + x.size_bytes <= offsets[j] or offsets[j] + y.size_bytes <= offsets[i]
    for b, off in zip(buffers, offsets):
        assert off >= 0 and off % b.alignment_bytes == 0


@settings(max_examples=80, deadline=None)
@given(buffer_lists())
def test_sweep_matches_conflict_lists_and_has_no_overlap(buffers):
    p = Problem(buffers)
    for key in (size_key, lifetime_key, area_key):
        keys = key(p)
        offsets, height, order = p.place_lowest_first(keys)
        assert lowest_first_sweep(p, keys) == (offsets, height, order, True)
        _brute_force_valid(buffers, offsets)


@settings(max_examples=40, deadline=None)
@given(buffer_lists())
def test_drop_mode_past_the_deadline_is_still_valid(buffers):
    p = Problem(buffers)
    offsets, height, _, _ = lowest_first_sweep(p, size_key(p), deadline=time.perf_counter() - 1)
    _brute_force_valid(buffers, offsets)
    assert height == max((o + b.size_bytes for o, b in zip(offsets, buffers)), default=0)


def test_pair_count_matches_conflict_lists():
    buffers = [Buffer("a", 0, 4, 1), Buffer("b", 0, 2, 1), Buffer("c", 2, 5, 1),
               Buffer("d", 4, 6, 1), Buffer("e", 0, 1, 1)]
    p = Problem(buffers)
    assert p.count_overlapping_pairs() == sum(map(len, p.conflicts)) // 2 == 5
