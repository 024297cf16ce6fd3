"""Tests of the greedy algorithms: validity and bounds on random problems, known orders."""

import pytest
from hypothesis import given, settings

from relax_memplan.planner import ALGORITHMS, DETERMINISTIC, Buffer, peak_live_bytes, validate
from relax_memplan.planner.algorithms import breadth_key
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
