"""Tests of the greedy algorithms: validity and bounds on random problems, known orders."""

import pytest
from hypothesis import given, settings

from relax_memplan.planner import ALGORITHMS, DETERMINISTIC, Buffer, peak_live_bytes, validate
from relax_memplan.planner.algorithms import (area_key, breadth_key, lifetime_key, peak_key,
                                              size_key,
                                              start_key)
from relax_memplan.planner.placement import Problem

from .strategies import buffer_lists, height, padded_total_bytes


def test_registry_has_required_algorithms():
    for name in ("greedy_by_size", "greedy_by_breadth", "iterated_greedy"):
        assert name in ALGORITHMS
    assert "iterated_greedy" not in DETERMINISTIC
    assert set(DETERMINISTIC) < set(ALGORITHMS)


@settings(max_examples=60, deadline=None)
@given(buffer_lists())
def test_every_algorithm_gives_valid_offsets_within_bounds(buffers):
    lower_bound = peak_live_bytes(buffers)
    for name, algorithm in ALGORITHMS.items():
        offsets = algorithm(buffers)
        validate(buffers, offsets)
        assert lower_bound <= height(buffers, offsets) <= padded_total_bytes(buffers), name


@pytest.mark.parametrize("name", sorted(ALGORITHMS))
def test_empty_input(name):
    assert ALGORITHMS[name]([]) == {}


@pytest.mark.parametrize("name", sorted(ALGORITHMS))
def test_chain_reuses_one_slot(name):
    buffers = [Buffer("a", 0, 2, 100), Buffer("b", 2, 4, 100), Buffer("c", 4, 6, 100)]
    assert ALGORITHMS[name](buffers) == {"a": 0, "b": 0, "c": 0}


def test_alignment_rounds_offsets_up():
    buffers = [Buffer("a", 0, 4, 10), Buffer("b", 0, 4, 10, alignment_bytes=64)]
    for name, algorithm in ALGORITHMS.items():
        offsets = algorithm(buffers)
        validate(buffers, offsets)
        assert offsets["b"] % 64 == 0, name


def test_breadth_order_visits_widest_step_first():
    buffers = [
        Buffer("early", 0, 2, 10),
        Buffer("wide1", 2, 4, 50),
        Buffer("wide2", 3, 5, 60),
        Buffer("late", 5, 6, 200),
    ]
    p = Problem(buffers)
    keys = breadth_key(p)
    order = [buffers[i].id for i in sorted(range(p.n), key=keys.__getitem__)]
    assert order == ["late", "wide2", "wide1", "early"]


def test_iterated_greedy_is_deterministic_given_seed():
    buffers = [Buffer(f"b{i}", i % 7, i % 7 + 1 + i % 5, 10 + (i * 37) % 90) for i in range(40)]
    first = ALGORITHMS["iterated_greedy"](buffers)
    assert ALGORITHMS["iterated_greedy"](buffers) == first
    validate(buffers, first)


def _tuple_rank(p, key):
    order = sorted(range(p.n), key=lambda i: key(p.size[i], p.end[i] - p.start[i], p.start[i]))
    rank = [0] * p.n
    for r, i in enumerate(order):
        rank[i] = r
    return rank


_TUPLE_KEYS = {  # the orders as documented: a sort key of (size, lifetime, start)
    size_key: lambda s, l, t: (-s, -l, t),
    lifetime_key: lambda s, l, t: (-l, -s, t),
    area_key: lambda s, l, t: (-s * l, -s, t),
    start_key: lambda s, l, t: (t, -(t + l), -s),
}


@settings(max_examples=60, deadline=None)
@given(buffer_lists(max_buffers=40))
def test_numpy_rank_keys_follow_the_documented_orders(buffers):
    p = Problem(buffers)
    for key, as_tuple in _TUPLE_KEYS.items():
        assert key(p).tolist() == _tuple_rank(p, as_tuple), key.__name__


def test_rank_keys_past_int64_sort_exactly():
    # size x lifetime beyond 2**63: the int64 columns would wrap; Python ints do not.
    buffers = [Buffer("a", 0, 8, 1 << 61), Buffer("b", 0, 9, (1 << 61) - 1), Buffer("c", 0, 1, 5)]
    p = Problem(buffers)
    assert area_key(p).tolist() == _tuple_rank(p, _TUPLE_KEYS[area_key]) == [1, 0, 2]


@settings(max_examples=60, deadline=None)
@given(buffer_lists(max_buffers=30))
def test_peak_key_ranks_by_the_fullest_step_of_each_live_range(buffers):
    p = Problem(buffers)

    def live_at(t):
        return sum(b.size_bytes for b in buffers if b.start <= t < b.end)

    def as_tuple(i):
        b = buffers[i]
        peak = max(live_at(t) for t in range(b.start, b.end))
        return (-peak, -b.size_bytes * b.lifetime, b.start)

    order = sorted(range(p.n), key=as_tuple)
    assert peak_key(p).tolist() == [order.index(i) for i in range(p.n)]


def test_peak_key_puts_the_buffers_of_the_peak_step_first():
    buffers = [Buffer("early", 0, 2, 10), Buffer("peak_a", 2, 4, 30), Buffer("peak_b", 3, 6, 21),
               Buffer("late", 5, 8, 25)]
    p = Problem(buffers)
    # Live bytes per step 0..7: 10 10 30 51 21 46 25 25. Both peak buffers cross step 3
    # (51 B); peak_b has the larger area (63 vs 60 byte-steps); late's fullest step is 46.
    ranks = peak_key(p).tolist()
    assert [buffers[i].id for i in sorted(range(4), key=ranks.__getitem__)] == [
        "peak_b", "peak_a", "late", "early"]
