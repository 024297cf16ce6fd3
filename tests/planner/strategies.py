"""Hypothesis strategies and small helpers shared by the planner tests."""

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
