"""Tests of the placement core: best fit vs first fit, lowest-first replay, conflicts."""

from hypothesis import given, settings

from relax_memplan.planner import Buffer
from relax_memplan.planner.placement import BEST_FIT, FIRST_FIT, Problem

from .strategies import buffer_lists


def _two_gaps():
    # p and q are pre-placed at [40, 80) and [110, 140): gaps of 40 bytes at 0, 30 at 80.
    p = Problem([Buffer("p", 0, 4, 40), Buffer("q", 0, 4, 30), Buffer("w", 1, 3, 25)])
    return p, [40, 110, -1], [80, 140, 0]


def test_best_fit_takes_smallest_gap_that_fits():
    p, offsets, tops = _two_gaps()
    p.place_into([2], offsets, tops, best_fit=True)
    assert offsets[2] == 80


def test_first_fit_takes_lowest_gap_that_fits():
    p, offsets, tops = _two_gaps()
    p.place_into([2], offsets, tops, best_fit=False)
    assert offsets[2] == 0


def test_place_goes_above_when_no_gap_fits():
    p = Problem([Buffer("a", 0, 2, 10), Buffer("b", 1, 3, 10, alignment_bytes=16)])
    assert p.place([0, 1], BEST_FIT) == ([0, 16], 26)


def test_conflicts_are_exactly_time_overlaps():
    buffers = [Buffer("a", 0, 2, 1), Buffer("b", 2, 4, 1), Buffer("c", 1, 3, 1), Buffer("d", 5, 6, 1)]
    p = Problem(buffers)
    assert [sorted(c) for c in p.conflicts] == [[2], [2], [0, 1], []]


@settings(max_examples=40, deadline=None)
@given(buffer_lists())
def test_lowest_first_order_replays_with_first_fit(buffers):
    p = Problem(buffers)
    offsets, top, order = p.place_lowest_first([-s for s in p.size])
    assert p.place(order, FIRST_FIT) == (offsets, top)
    assert sorted(offsets[i] for i in order) == [offsets[i] for i in order]


