"""Stacking keeps a plan valid when every buffer's size changes."""

from hypothesis import given, settings
from hypothesis import strategies as st

from relax_memplan.planner import Buffer, plan, stacked_offsets, stacking_order, validate


def test_reference_sizes_never_higher_than_the_plan():
    buffers = [Buffer("a", 0, 3, 100), Buffer("b", 1, 4, 50), Buffer("c", 3, 6, 120)]
    p = plan(buffers, time_limit_s=0.05)
    order = stacking_order(buffers, p.offsets)
    offsets, height = stacked_offsets(order, {b.id: b.size_bytes for b in buffers})
    validate(buffers, offsets)
    assert height <= p.height_bytes


def test_order_puts_lower_buffers_first():
    buffers = [Buffer("a", 0, 2, 10), Buffer("b", 0, 2, 10), Buffer("c", 5, 6, 10)]
    order = stacking_order(buffers, {"a": 10, "b": 0, "c": 0})
    ids = [bid for bid, _ in order]
    assert ids.index("b") < ids.index("a")
    assert dict(order)["a"] == ("b",)
    assert dict(order)["c"] == ()


@settings(max_examples=60, deadline=None)
@given(
    st.lists(
        st.tuples(st.integers(0, 30), st.integers(1, 10), st.integers(1, 500), st.integers(1, 500)),
        min_size=1,
        max_size=25,
    ),
    st.sampled_from([1, 64]),
)
def test_stacked_plan_valid_at_other_sizes(specs, alignment):
    ref = [Buffer(f"b{i}", s, s + d, r, alignment) for i, (s, d, r, _) in enumerate(specs)]
    other = [Buffer(f"b{i}", s, s + d, o, alignment) for i, (s, d, _, o) in enumerate(specs)]
    p = plan(ref, time_limit_s=0.01)
    order = stacking_order(ref, p.offsets)
    offsets, height = stacked_offsets(order, {b.id: b.size_bytes for b in other}, alignment)
    validate(other, offsets)
    assert height == max(offsets[b.id] + b.size_bytes for b in other)
