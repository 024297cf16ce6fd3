"""Exact search: tiny problems whose optimum is known and checked by brute force."""

import time
from itertools import product
from pathlib import Path

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from relax_memplan.planner import Buffer, read_csv, validate
from relax_memplan.planner.exact import (FOUND, INFEASIBLE, UNKNOWN, exact_offsets,
                                         sections_of, solve_capacity)
from relax_memplan.planner.placement import Problem
from relax_memplan.planner.validate import OverlapError

from .strategies import buffer_lists

SHARED_BENCH = Path(__file__).parents[2].parent / "shared" / "bench" / "minimalloc-challenging"


def _brute_force_optimum(buffers):
    """Lowest height over all offsets in [0, sum of sizes), by enumeration (tiny only)."""
    total = sum(b.size_bytes for b in buffers)
    best = total
    for offsets in product(range(total), repeat=len(buffers)):
        ok = all(
            not x.overlaps_in_time(y)
            or offsets[i] + x.size_bytes <= offsets[j]
            or offsets[j] + y.size_bytes <= offsets[i]
            for i, x in enumerate(buffers) for j, y in enumerate(buffers) if i < j
        )
        if ok:
            best = min(best, max(o + b.size_bytes for o, b in zip(offsets, buffers)))
    return best


# The classic gap case: lower bound 4 but no plan below 5 (b must sit on a or c, then d
# sits on top of whichever of them is not below b).
GAP = [(0, 2, 2), (1, 3, 2), (2, 4, 2), (0, 4, 1)]
# Lower bound reachable, but greedy by size puts the 3-byte buffers side by side first.
TIGHT = [(0, 2, 3), (1, 3, 2), (2, 4, 3), (0, 1, 2), (3, 4, 2)]


@pytest.mark.parametrize("ranges", [GAP, TIGHT, [(0, 1, 1)], [(0, 2, 2), (2, 4, 3)]])
def test_exact_matches_brute_force(ranges):
    _assert_optimum_found_and_proven(
        [Buffer(f"b{i}", s, e, z) for i, (s, e, z) in enumerate(ranges)])


def _assert_optimum_found_and_proven(buffers):
    """The brute-force optimum is found and one byte less is proven infeasible."""
    optimum = _brute_force_optimum(buffers)
    p = Problem(buffers)
    status, offsets = solve_capacity(p, optimum, time.perf_counter() + 30)
    assert status == FOUND and p.height(offsets) <= optimum
    validate(buffers, p.offsets_by_id(offsets))
    if optimum > p.lower_bound:
        assert solve_capacity(p, optimum - 1, time.perf_counter() + 30)[0] == INFEASIBLE


def test_exact_offsets_improves_a_poor_plan_to_the_optimum():
    buffers = [Buffer(f"b{i}", s, e, z) for i, (s, e, z) in enumerate(GAP)]
    p = Problem(buffers)
    stacked = [0, 2, 4, 6]  # valid but 7 bytes high
    better = exact_offsets(p, stacked, time_limit_s=5)
    assert p.height(better) == _brute_force_optimum(buffers) == 5
    validate(buffers, p.offsets_by_id(better))


def test_alignment_is_respected():
    # b, c at multiples of 4: b [0, 3), c [4, 7), a [7, 10); the lower bound 9 is unreachable.
    buffers = [Buffer("a", 0, 2, 3), Buffer("b", 0, 2, 3, 4), Buffer("c", 0, 2, 3, 4)]
    p = Problem(buffers)
    status, offsets = solve_capacity(p, 10, time.perf_counter() + 5)
    assert status == FOUND
    validate(buffers, p.offsets_by_id(offsets))
    assert p.lower_bound == 9
    assert solve_capacity(p, 9, time.perf_counter() + 5)[0] == INFEASIBLE


def _overlap(x, y):
    return x.start < y.end and y.start < x.end


@settings(max_examples=60, deadline=None)
@given(buffer_lists(max_buffers=30))
def test_sections_are_the_maximal_cliques(buffers):
    """Two buffers overlap in time exactly when their section ranges intersect."""
    first, stop, count = sections_of([b.start for b in buffers], [b.end for b in buffers])
    for i, x in enumerate(buffers):
        assert 0 <= first[i] < stop[i] <= count
        for j, y in enumerate(buffers):
            shared = first[i] < stop[j] and first[j] < stop[i]
            assert shared == _overlap(x, y), (x, y)
    # No more sections than deaths; each holds a live set that no other section contains.
    assert count <= len(buffers)


def test_sections_of_a_chain_and_a_long_buffer():
    # a [0, 2), b [1, 3), c [2, 4), long [0, 4): cliques {a, b, long}, {b, c, long}.
    first, stop, count = sections_of([0, 1, 2, 0], [2, 3, 4, 4])
    assert count == 2
    assert (first, stop) == ([0, 0, 1, 0], [1, 2, 2, 2])


@settings(max_examples=40, deadline=None)
@given(st.lists(st.tuples(st.integers(0, 4), st.integers(1, 3), st.integers(1, 3)),
                min_size=1, max_size=4))
def test_random_tiny_problems_match_brute_force(ranges):
    """The pruning is sound: no optimum is cut off, no infeasible capacity is solved."""
    _assert_optimum_found_and_proven(
        [Buffer(f"b{i}", s, s + w, z) for i, (s, w, z) in enumerate(ranges)])


def test_minimalloc_instance_c_reaches_the_lower_bound():
    """A real hard instance (MiniMalloc's C, 203 buffers): the lower bound is reachable."""
    path = SHARED_BENCH / "C.1048576.csv"
    if not path.exists():
        pytest.skip(f"{path} not present")
    buffers = read_csv(path)
    p = Problem(buffers)
    status, offsets = solve_capacity(p, p.lower_bound, time.perf_counter() + 60)
    assert status == FOUND and p.height(offsets) == p.lower_bound == 1039360
    validate(buffers, p.offsets_by_id(offsets))


def test_a_wrong_exact_plan_fails_the_validator():
    """The check used on exact plans is not vacuous: a planted overlap is rejected."""
    buffers = [Buffer(f"b{i}", s, e, z) for i, (s, e, z) in enumerate(TIGHT)]
    p = Problem(buffers)
    status, offsets = solve_capacity(p, p.lower_bound, time.perf_counter() + 5)
    assert status == FOUND
    wrong = list(offsets)
    wrong[1] = wrong[0]  # b0 and b1 overlap in time: same offset overlaps in memory
    with pytest.raises(OverlapError, match="b0"):
        validate(buffers, p.offsets_by_id(wrong))


def test_deadline_is_read_on_the_given_clock():
    """A CPU-time budget (benchmarks) stops the search like a wall-clock one."""
    path = SHARED_BENCH / "E.1048576.csv"
    if not path.exists():
        pytest.skip(f"{path} not present")
    p = Problem(read_csv(path))
    reads = []

    def late_clock():
        reads.append(1)
        return 1.0

    assert solve_capacity(p, p.lower_bound, 0.0, clock=late_clock) == (UNKNOWN, None)
    assert reads  # the given clock, not the wall clock, decided


@settings(max_examples=40, deadline=None)
@given(buffer_lists(max_buffers=12, alignments=(1, 1, 2, 4)))
def test_failed_state_memo_changes_no_verdict(buffers):
    """With and without the memo of failed states, the search gives the same verdict at
    the lower bound and one above (a wrong memo hit would turn FOUND into INFEASIBLE)."""
    from relax_memplan.planner import exact

    p = Problem(buffers)
    for capacity in (p.lower_bound, p.lower_bound + 1):
        with_memo = solve_capacity(p, capacity, time.perf_counter() + 30)
        saved = exact.MAX_STATES
        exact.MAX_STATES = 0
        try:
            without = solve_capacity(p, capacity, time.perf_counter() + 30)
        finally:
            exact.MAX_STATES = saved
        assert with_memo[0] == without[0]
        if with_memo[0] == FOUND:
            validate(buffers, p.offsets_by_id(with_memo[1]))
            assert p.height(with_memo[1]) <= capacity


def test_state_key_tells_skylines_apart():
    """Same unplaced buffers on another skyline is another state; an empty section's
    floor does not matter."""
    from relax_memplan.planner.exact import _Search

    # a [0, 2) and b [2, 4) in two sections; c [0, 4) spans both.
    p = Problem([Buffer("a", 0, 2, 2), Buffer("b", 2, 4, 2), Buffer("c", 0, 4, 1)])
    search = _Search(p, capacity=3, deadline=time.perf_counter() + 5)
    search.run("WAT", node_limit=100)  # sets up the state arrays
    unplaced = np.array([0, 1], dtype=np.int64)
    base = search.state_key(0, 2, unplaced)
    search.floor[0] = 1
    assert search.state_key(0, 2, unplaced) != base
    search.floor[0] = 0
    search.total[1] = 0  # nothing left in section 1: its floor is irrelevant
    search.floor[1] = 5
    high = search.state_key(0, 2, unplaced)
    search.floor[1] = 0
    assert high == search.state_key(0, 2, unplaced)
    assert search.state_key(0, 2, unplaced) != search.state_key(0, 2, unplaced[:1])
