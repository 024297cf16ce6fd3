"""The plan's part of the report: the per-tensor table and the tensors live at the peak."""

from types import SimpleNamespace

from relax_memplan.compile.options import library_path_for
from relax_memplan.report.summary import planned_tensors


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


def test_dynamic_tensors_are_listed_with_expressions_and_bytes_per_shape():
    """A symbolic plan: shapes and sizes as expressions, bytes and offsets at each shape,
    and the peak set per shape (here it moves from step 1 to step 2 as seq grows)."""
    from tvm import tirx

    from relax_memplan.report.summary import dynamic_tensors, tensors_at
    from relax_memplan.report.tensor_rows import concrete_tensors
    from relax_memplan.report import CompileReport, ShapeMeasurement

    seq = tirx.Var("seq", "int64")
    i64 = lambda v: tirx.const(v, "int64")  # noqa: E731
    tensors = [  # a: 4 * seq bytes [0, 2); b: 256 B [1, 3); c: 4 * seq * seq bytes [2, 3)
        SimpleNamespace(uid="a", producer="ka", shape=(seq,), dtype="float32",
                        size_expr=i64(4) * seq, start=0, end=2),
        SimpleNamespace(uid="b", producer="kb", shape=(i64(64),), dtype="float32",
                        size_expr=i64(256), start=1, end=3),
        SimpleNamespace(uid="c", producer="kc", shape=(seq, seq), dtype="float32",
                        size_expr=i64(4) * seq * seq, start=2, end=3)]
    offsets = {"a": 0, "b": 4096, "c": 0}
    fplan = SimpleNamespace(placed=["a", "b", "c"], shared={},
                            liveness=SimpleNamespace(tensors=tensors),
                            layout_at=lambda dims: (offsets, 0))
    report = CompileReport(model="m", strategy="exact", dims={"seq": (1, 32)})
    report.tensors = dynamic_tensors(fplan)
    assert report.tensors[2] == {"name": "c", "producer": "kc", "shape": ["seq", "seq"],
                                 "dtype": "float32", "size_bytes_expr": "seq * seq * 4",
                                 "live_range": [2, 3], "shares_storage_with": None,
                                 "size_bytes_at_shapes": [],
                                 "offset_bytes_at_shapes": []}
    assert report.tensors[1]["shape"] == [64]
    dyn = SimpleNamespace(plans={"main": fplan})
    for value, lower_bound in ((2, 272), (32, 4352)):
        row = ShapeMeasurement(dims={"seq": value}, runtime_alloc_bytes=None, arena_bytes=0,
                               lower_bound_bytes=lower_bound)
        report.shapes.append(row)
        tensors_at(report, dyn, {"seq": value}, row)
    assert [t["size_bytes_at_shapes"] for t in report.tensors] == [[8, 128], [256, 256],
                                                                   [16, 4096]]
    # seq=2: a + b = 264 B at step 1, b + c = 272 B at step 2: the peak is step 2
    assert (report.shapes[0].peak_step, report.shapes[0].live_at_peak) == (2, ["b", "c"])
    # seq=32: c alone is 4096 B: step 2 again, c first (largest)
    assert (report.shapes[1].peak_step, report.shapes[1].live_at_peak) == (2, ["c", "b"])
    assert concrete_tensors(report.tensors, 1)[2]["size_bytes"] == 4096
    text = report.format_text()  # the top at the shape with the largest lower bound
    assert "live at the peak at seq=32 (step 2): 2 tensors, 4,352 B:" in text
    assert text.splitlines()[-2].split() == ["b", "kb", "64", "float32", "256", "4,096",
                                             "[1,", "3)"]


def test_peak_rows_reserve_a_group_root_over_the_planners_merged_buffer():
    """The report's peak uses the planner's merged_buffers (one rule, not a copy): a concat
    output ``out`` holding ``a`` (an in-place chain a -> a2 before it) is reserved from a's
    definition to out's end; at step 1 only a is written, yet out's bytes count (as in the
    lower bound); a tensor outside every group keeps its own range."""
    from relax_memplan.planner import Buffer
    from relax_memplan.transform._inplace_plan import merged_buffers

    tensors = [_tensor("a", 128, 1, 3), _tensor("a2", 128, 2, 4), _tensor("out", 384, 4, 6),
               _tensor("x", 256, 0, 2)]
    nested = {"a2": ("a", 0), "a": ("out", 256)}
    plan = SimpleNamespace(liveness=SimpleNamespace(tensors=tensors),
                           arenas=[SimpleNamespace(offsets={"a": 256, "a2": 256, "out": 0,
                                                            "x": 384}, nested=nested)])
    merged = merged_buffers([Buffer(t.uid, t.start, t.end, t.size_bytes) for t in tensors],
                            nested)
    assert {(b.id, b.start, b.end) for b in merged} == {("out", 1, 6), ("x", 0, 2)}
    rows, peak, live = planned_tensors(plan)
    out = next(r for r in rows if r["name"] == "out")
    assert (out["group_live_range"], out["group_size_bytes"]) == ([1, 6], 384)
    # step 1: x (256 B at 384) + out's reserved 384 B at 0 (a inside it: named under out)
    assert (peak, live) == (1, ["out", "x"])
    # without the reservation (per-tensor ranges) step 1 holds x + a only (384 B)
    plan.arenas[0].nested = {}
    assert planned_tensors(plan)[1:] == (1, ["x", "a"])
