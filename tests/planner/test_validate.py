"""Tests of the validator: each kind of violation is caught and named; valid plans pass."""

import importlib
import random
from unittest.mock import patch
from itertools import combinations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from relax_memplan.planner import (
    Buffer,
    CapacityExceededError,
    InvalidOffsetError,
    MisalignmentError,
    MissingOffsetError,
    NestingError,
    OverlapError,
    PlanError,
    find_violations,
    validate,
)

from relax_memplan.planner.algorithms import size_key
from relax_memplan.planner.placement import Problem
from relax_memplan.planner.validate import no_overlap_on_steps

from .strategies import buffer_lists

# The package exports the function validate under the module's name.
validate_module = importlib.import_module("relax_memplan.planner.validate")


def test_valid_plan_passes():
    buffers = [Buffer("a", 0, 4, 64), Buffer("b", 1, 3, 32, 32), Buffer("c", 3, 6, 64)]
    validate(buffers, {"a": 0, "b": 64, "c": 64})
    assert find_violations(buffers, {"a": 0, "b": 64, "c": 64}, capacity_bytes=128) == []


def test_touching_ranges_may_share_offset():
    buffers = [Buffer("a", 0, 2, 100), Buffer("b", 2, 4, 100)]
    validate(buffers, {"a": 0, "b": 0})


def test_planted_overlap_names_both_ids_ranges_and_bytes():
    buffers = [Buffer("conv_out", 0, 3, 100), Buffer("relu_out", 2, 5, 50)]
    with pytest.raises(OverlapError) as info:
        validate(buffers, {"conv_out": 0, "relu_out": 60})
    message = str(info.value)
    for fragment in ("'conv_out'", "'relu_out'", "[0, 3)", "[2, 5)", "[0, 100)", "[60, 110)"):
        assert fragment in message
    assert {info.value.first.id, info.value.second.id} == {"conv_out", "relu_out"}


def test_all_overlapping_pairs_are_reported():
    buffers = [Buffer(n, 0, 4, 10) for n in "abc"] + [Buffer("d", 10, 12, 10)]
    errors = find_violations(buffers, {"a": 0, "b": 5, "c": 9, "d": 0})
    pairs = {frozenset((e.first.id, e.second.id)) for e in errors}
    assert pairs == {frozenset("ab"), frozenset("ac"), frozenset("bc")}


def test_misalignment_names_id_offset_alignment():
    buffers = [Buffer("w", 0, 2, 16, alignment_bytes=64)]
    with pytest.raises(MisalignmentError, match=r"'w'.*offset 32.*alignment 64"):
        validate(buffers, {"w": 32})


def test_missing_offsets_are_named_together():
    buffers = [Buffer("a", 0, 2, 8), Buffer("b", 0, 2, 8), Buffer("c", 0, 2, 8)]
    errors = find_violations(buffers, {"b": 0})
    assert isinstance(errors[0], MissingOffsetError)
    assert errors[0].ids == ["a", "c"]
    assert "'a'" in str(errors[0]) and "'c'" in str(errors[0])


@pytest.mark.parametrize("offset", [-8, 1.5, "0", True])
def test_negative_or_non_integer_offset_is_rejected(offset):
    with pytest.raises(InvalidOffsetError, match="'a'"):
        validate([Buffer("a", 0, 2, 8)], {"a": offset})
    assert issubclass(InvalidOffsetError, PlanError)


def test_capacity_exceeded_names_buffer_and_capacity():
    buffers = [Buffer("a", 0, 2, 100), Buffer("b", 0, 2, 100)]
    validate(buffers, {"a": 0, "b": 100}, capacity_bytes=200)
    with pytest.raises(CapacityExceededError, match=r"'b'.*\[100, 200\).*150 bytes"):
        validate(buffers, {"a": 0, "b": 100}, capacity_bytes=150)


def test_duplicate_ids_are_rejected():
    with pytest.raises(ValueError, match="'a' occurs more than once"):
        find_violations([Buffer("a", 0, 1, 1), Buffer("a", 0, 1, 1)], {"a": 0})


def _brute_force_pairs(buffers, offsets):
    pairs = set()
    for x, y in combinations(buffers, 2):
        ox, oy = offsets[x.id], offsets[y.id]
        if x.overlaps_in_time(y) and ox < oy + y.size_bytes and oy < ox + x.size_bytes:
            pairs.add(frozenset((x.id, y.id)))
    return pairs


@settings(max_examples=150, deadline=None)
@given(buffer_lists(max_buffers=15, alignments=(1,)), st.randoms(use_true_random=False))
def test_overlaps_match_brute_force(buffers, rnd):
    offsets = {b.id: rnd.randrange(0, 200) for b in buffers}
    errors = [e for e in find_violations(buffers, offsets) if isinstance(e, OverlapError)]
    found = [frozenset((e.first.id, e.second.id)) for e in errors]
    assert len(found) == len(set(found))
    assert set(found) == _brute_force_pairs(buffers, offsets)


@settings(max_examples=200, deadline=None)
@given(buffer_lists(max_buffers=40, alignments=(1,)), st.randoms(use_true_random=False),
       st.sampled_from([1, 3, 8, 128]), st.booleans())
def test_chunked_overlap_check_matches_brute_force(buffers, rnd, chunk, from_plan):
    # Chunks of 1, 3, 8 cross chunk borders often; a planned layout with one buffer moved
    # gives near-valid plans (one clash or none), random offsets mostly clashing ones.
    p = Problem(buffers)
    if from_plan and buffers:
        offsets = p.lowest_first(size_key(p))[0]
        offsets[rnd.randrange(len(offsets))] = rnd.randrange(0, 200)
    else:
        offsets = [rnd.randrange(0, 400) for _ in buffers]
    by_id = {b.id: off for b, off in zip(buffers, offsets)}
    with patch.object(validate_module, "CHECK_CHUNK", chunk):
        ok = no_overlap_on_steps(p.step_lo, p.step_hi, offsets, p.size, p.num_steps)
    assert ok == (not _brute_force_pairs(buffers, by_id))


def test_validates_10k_buffers():
    rnd = random.Random(0)
    buffers, offsets = [], {}
    for i in range(10_000):  # disjoint slots per step band: a valid plan
        start = rnd.randrange(10_000)
        buffers.append(Buffer(f"b{i}", start, start + rnd.randint(1, 100), 64))
        offsets[f"b{i}"] = i * 64
    validate(buffers, offsets)
    offsets["b7"] = offsets["b8"]  # plant one overlap among 10k
    assert find_violations(buffers, offsets)


# ---- placements inside a parent (concatenation written in place) ---------------------------

def _concat_buffers():
    """out (192 B) holds x at delta 0 and y at delta 64; z is unrelated, live with them."""
    return [Buffer("x", 0, 3, 64), Buffer("y", 1, 3, 128), Buffer("out", 2, 5, 192),
            Buffer("z", 0, 5, 64)]


def test_nested_accepts_the_declared_deltas():
    nested = {"x": ("out", 0), "y": ("out", 64)}
    validate(_concat_buffers(), {"x": 0, "y": 64, "out": 0, "z": 192}, nested=nested)


def test_nested_rejects_a_wrong_delta():
    nested = {"x": ("out", 0), "y": ("out", 64)}
    errors = find_violations(_concat_buffers(), {"x": 0, "y": 0, "out": 0, "z": 192},
                             nested=nested)
    assert any(isinstance(e, NestingError) and e.member_id == "y" for e in errors)
    # y at delta 0 also overlaps its sibling x: still an overlap, siblings never share bytes
    assert any(isinstance(e, OverlapError) and {e.first.id, e.second.id} == {"x", "y"}
               for e in errors)
    with pytest.raises(NestingError, match="'y' declared inside 'out': offset 0 != parent"):
        validate(_concat_buffers(), {"x": 0, "y": 0, "out": 0, "z": 192}, nested=nested)


def test_nested_rejects_siblings_declared_overlapping_and_members_outside_the_parent():
    # both deltas hold, but x and y are declared over the same bytes: the sibling overlap stays
    errors = find_violations(_concat_buffers(), {"x": 0, "y": 0, "out": 0, "z": 192},
                             nested={"x": ("out", 0), "y": ("out", 0)})
    assert [type(e) for e in errors] == [OverlapError]
    with pytest.raises(NestingError, match="exceed"):
        validate(_concat_buffers(), {"x": 0, "y": 128, "out": 0, "z": 256},
                 nested={"x": ("out", 0), "y": ("out", 128)})


def test_nested_still_rejects_every_undeclared_overlap():
    nested = {"x": ("out", 0), "y": ("out", 64)}
    with pytest.raises(OverlapError, match="'z'"):  # z over y's bytes, not declared
        validate(_concat_buffers(), {"x": 0, "y": 64, "out": 0, "z": 64}, nested=nested)
    with pytest.raises(OverlapError):  # nothing declared
        validate(_concat_buffers(), {"x": 0, "y": 64, "out": 0, "z": 192})


def test_nested_chain_inplace_member_inside_a_concat_input():
    # t dies where x is written over it (in-place, delta 0), x sits at delta 64 in out
    bufs = [Buffer("t", 0, 2, 64), Buffer("x", 1, 4, 64), Buffer("out", 3, 5, 128)]
    nested = {"x": ("t", 0), "t": ("out", 64)}
    validate(bufs, {"t": 64, "x": 64, "out": 0}, nested=nested)
    with pytest.raises(NestingError, match="cycle"):
        validate(bufs, {"t": 64, "x": 64, "out": 0}, nested={"x": ("t", 0), "t": ("x", 0)})
