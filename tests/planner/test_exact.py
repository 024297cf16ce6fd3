"""Exact search: tiny problems whose optimum is known and checked by brute force."""

import time
from itertools import product

import pytest

from relax_memplan.planner import Buffer, validate
from relax_memplan.planner.exact import FOUND, INFEASIBLE, exact_offsets, solve_capacity
from relax_memplan.planner.placement import Problem


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
    buffers = [Buffer(f"b{i}", s, e, z) for i, (s, e, z) in enumerate(ranges)]
    optimum = _brute_force_optimum(buffers)
    p = Problem(buffers)
    status, offsets = solve_capacity(p, optimum, time.perf_counter() + 5)
    assert status == FOUND and p.height(offsets) <= optimum
    validate(buffers, p.offsets_by_id(offsets))
    if optimum > p.lower_bound:
        assert solve_capacity(p, optimum - 1, time.perf_counter() + 5)[0] == INFEASIBLE


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
