"""Hypothesis strategies and small helpers shared by the planner tests."""

from itertools import combinations

from hypothesis import strategies as st

from relax_memplan.planner import Buffer


@st.composite
def buffer_lists(draw, max_buffers=25, alignments=(1, 1, 1, 2, 3, 4, 8, 16)):
    """Random planning problems: short live ranges on a small horizon, some alignment."""
    n = draw(st.integers(0, max_buffers))
    buffers = []
    for i in range(n):
        start = draw(st.integers(0, 30))
        buffers.append(
            Buffer(
                id=f"b{i}",
                start=start,
                end=start + draw(st.integers(1, 12)),
                size_bytes=draw(st.integers(1, 100)),
                alignment_bytes=draw(st.sampled_from(alignments)),
            )
        )
    return buffers


def padded_total_bytes(buffers):
    """Sum of sizes plus worst-case alignment padding: an upper bound on any greedy height."""
    return sum(b.size_bytes + b.alignment_bytes - 1 for b in buffers)


def height(buffers, offsets):
    return max((offsets[b.id] + b.size_bytes for b in buffers), default=0)


def assert_no_overlap_brute_force(buffers, offsets):
    """Every pair of time-overlapping buffers is disjoint in bytes; offsets aligned, >= 0.

    ``offsets`` is a list by buffer index. A pairwise check, independent of the planner's
    validator and of its skyline replay.
    """
    for i, j in combinations(range(len(buffers)), 2):
        x, y = buffers[i], buffers[j]
        if x.overlaps_in_time(y):
            assert offsets[i] + x.size_bytes <= offsets[j] or offsets[j] + y.size_bytes <= offsets[i]
    for b, off in zip(buffers, offsets):
        assert off >= 0 and off % b.alignment_bytes == 0
