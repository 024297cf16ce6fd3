"""The candidate index of the skyline: block minima answer as a scan of the whole slice."""

import random
from pathlib import Path
from unittest.mock import patch

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from relax_memplan.planner import Buffer, candidates, read_csv, skyline, validate
from relax_memplan.planner.algorithms import lowest_first_keys
from relax_memplan.planner.candidates import StartIndex
from relax_memplan.planner.placement import Problem
from relax_memplan.planner.skyline import lowest_first_sweep, rank_of

IDEALLOC = Path(__file__).parents[2].parent / "shared" / "bench" / "idealloc"


def _whole_slice(index, ia, ib, b):
    """The query before the block minima: the smallest rank over the whole slice."""
    fits = index.hi_np[ia:ib] <= b
    ranks = np.where(fits, index.rank_np[ia:ib], index.n)
    q = int(ranks.argmin()) if ib > ia else 0
    return ia + q if ib > ia and ranks[q] < index.n else -1


def _brute_force(index, a, b):
    """Position of the smallest-rank unplaced buffer with a <= lo and hi <= b, or -1."""
    inside = [q for q in range(len(index.rank)) if index.rank[q] < index.n
              and index.lo[q] >= a and index.hi[q] <= b]
    return min(inside, key=index.rank.__getitem__, default=-1)


def _dense(count, steps, seed, max_life=12):
    """Many buffers per step, so slices span many blocks."""
    rnd = random.Random(seed)
    out = []
    for i in range(count):
        start = rnd.randrange(steps)
        out.append(Buffer(f"b{i}", start, start + rnd.randint(1, max_life), rnd.randint(1, 999)))
    return out


@settings(max_examples=60, deadline=None)
@given(st.integers(0, 10_000), st.booleans(), st.integers(0, 300))
def test_block_query_equals_brute_force_while_buffers_are_removed(seed, by_start, removed):
    buffers = _dense(400, 30, seed)
    p = Problem(buffers)
    keys = lowest_first_keys["lowest_first_by_start" if by_start else "lowest_first_by_area"](p)
    lo, hi, num_steps = p.step_arrays
    index = StartIndex(lo, hi, rank_of(keys), num_steps, p.n)
    assert index.monotone == by_start
    rnd = random.Random(seed)
    for q in rnd.sample(range(p.n), removed):
        index.remove(q)
    for _ in range(40):
        a = rnd.randrange(num_steps)
        b = rnd.randint(a + 1, num_steps)
        assert index.best_inside(a, b) == _brute_force(index, a, b)


def test_block_minimum_kept_too_high_is_caught():
    # A wrong (too high) block minimum hides fitting buffers: the query then disagrees with
    # the brute force, so the equality above can fail.
    p = Problem(_dense(400, 30, seed=1))
    lo, hi, num_steps = p.step_arrays
    index = StartIndex(lo, hi, rank_of(lowest_first_keys["lowest_first_by_area"](p)),
                       num_steps, p.n)
    a, b = 0, num_steps
    assert index.best_inside(a, b) == _brute_force(index, a, b) >= 0
    index.block_min[:] = [index.gone] * len(index.block_min)
    assert index.best_inside(a, b) == -1 != _brute_force(index, a, b)


def _old_query_plan(p, keys):
    """The sweep answering every query with a scan of the whole slice (the old code): the
    sweep sees block minima that never rule a block out."""
    def views(self):
        return self.first_at, self.hi, self.rank, [-1] * (len(self.hi) // candidates.BLOCK + 1)

    with patch.object(skyline, "INLINE_SCAN_MAX", 0), \
            patch.object(skyline, "INLINE_SCAN_LONG", 0), \
            patch.object(StartIndex, "views", views), \
            patch.object(StartIndex, "best_between",
                         lambda self, ia, ib, b: _whole_slice(self, ia, ib, b)):
        return lowest_first_sweep(p, keys)


@pytest.mark.parametrize("name", ["lowest_first_by_area", "lowest_first_by_start",
                                  "lowest_first_by_peak", "lowest_first_by_size"])
def test_sweep_plans_equal_the_whole_slice_scan(name):
    # Same lowest-first rule and tie-breaks: offsets, height and order all equal.
    for seed in range(3):
        buffers = _dense(3000, 200, seed, max_life=40)
        p = Problem(buffers)
        keys = lowest_first_keys[name](p)
        new = lowest_first_sweep(p, keys)
        assert new == _old_query_plan(p, keys)
        validate(buffers, p.offsets_by_id(new[0]))


@pytest.mark.parametrize("name, area_height", [("pangu_2.6B", 5_572_042_815)])
def test_large_graph_heights_equal_the_old_code(name, area_height):
    # Height of one pass by area on the idealloc graph, from the code before the block
    # minima (whole-slice scans), and the same offsets as that scan today.
    path = IDEALLOC / f"{name}.csv"
    if not path.exists():
        pytest.skip(f"{path} not present")
    buffers = read_csv(path)
    p = Problem(buffers)
    keys = lowest_first_keys["lowest_first_by_area"](p)
    offsets, height, _, exact = lowest_first_sweep(p, keys)
    assert exact and height == area_height
    assert offsets == _old_query_plan(p, keys)[0]
