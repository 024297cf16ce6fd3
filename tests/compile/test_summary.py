"""The plan's part of the report: the per-tensor table and the tensors live at the peak."""

from types import SimpleNamespace

from relax_memplan.compile.options import library_path_for
from relax_memplan.compile.summary import planned_tensors


def _tensor(uid, size, start, end, producer=None):
    return SimpleNamespace(uid=uid, producer=producer or f"k_{uid}", shape=(size // 4,),
                           dtype="float32", size_bytes=size, start=start, end=end)


def _plan(tensors, offsets):
    return SimpleNamespace(liveness=SimpleNamespace(tensors=tensors),
                           arenas=[SimpleNamespace(offsets=offsets)])


def test_live_at_peak_is_the_set_at_the_step_of_most_live_bytes_largest_first():
    tensors = [_tensor("a", 64, 0, 2), _tensor("b", 128, 1, 3), _tensor("c", 256, 2, 4),
               _tensor("left", 1024, 0, 4)]  # not placed: not in the table
    rows, peak, live = planned_tensors(_plan(tensors, {"a": 0, "b": 64, "c": 192}))
    assert [r["name"] for r in rows] == ["a", "b", "c"]
    assert rows[2] == {"name": "c", "producer": "k_c", "shape": [64], "dtype": "float32",
                       "size_bytes": 256, "live_range": [2, 4], "arena": 0, "offset_bytes": 192}
    # half-open ranges: at step 2, a is dead, b and c are live (384 B > 192 B at step 1)
    assert (peak, live) == (2, ["c", "b"])


def test_nothing_placed_has_no_peak():
    assert planned_tensors(_plan([_tensor("a", 64, 0, 1)], {})) == ([], None, [])


def test_several_strategies_get_one_library_each():
    assert library_path_for("out/m.so", "exact", several=False) == "out/m.so"
    assert library_path_for("out/m.so", "exact", several=True) == "out/m.exact.so"
