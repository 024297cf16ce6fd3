"""relax_memplan.report.plot: the picture of an arena plan."""

from types import SimpleNamespace

import pytest

pytest.importorskip("matplotlib")

from relax_memplan import PlanStaticMemory, get_pipeline, import_onnx  # noqa: E402
from relax_memplan.frontend.examples import example_cnn  # noqa: E402
from relax_memplan.report.plot import byte_unit, live_bytes_per_step, plot_plan  # noqa: E402

PNG_MAGIC = b"\x89PNG\r\n\x1a\n"


@pytest.fixture(scope="module")
def example_plan():
    mod, _ = import_onnx(example_cnn())
    plan = PlanStaticMemory(time_limit_s=0.2)
    # the Relax phases make the plan; no code generation needed for a picture (suite time)
    get_pipeline("llvm", plan_pass=plan)(mod)
    return plan.plans["main"]


def test_plot_of_the_example_is_a_nonempty_png(example_plan, tmp_path):
    out = plot_plan(example_plan, tmp_path / "sub" / "plan.png", title="example_cnn")
    data = out.read_bytes()
    assert data[:8] == PNG_MAGIC
    assert len(data) > 10_000  # a real picture, not an empty canvas


def test_plot_of_a_function_left_to_tvm_says_so(tmp_path):
    fallback = SimpleNamespace(name="main", arenas=[], fallback_reason="ours is larger",
                               liveness=SimpleNamespace(tensors=[], num_steps=0))
    assert plot_plan(fallback, tmp_path / "plan.png").read_bytes()[:8] == PNG_MAGIC


def test_live_bytes_follow_half_open_ranges():
    t = lambda start, end, size: SimpleNamespace(start=start, end=end, size_bytes=size)  # noqa: E731
    assert live_bytes_per_step([t(0, 2, 10), t(1, 3, 5), t(3, 4, 7)], 4) == [10, 15, 5, 7]


def test_live_bytes_peak_is_the_unaligned_lower_bound(example_plan):
    (arena,) = example_plan.arenas
    tensors = {t.uid: t for t in example_plan.liveness.tensors}
    placed = [tensors[uid] for uid in arena.offsets]
    live = live_bytes_per_step(placed, max(t.end for t in placed))
    assert max(live) == arena.unaligned_lower_bound_bytes


def test_byte_unit_is_one_unit_for_the_whole_picture():
    assert byte_unit(737_280) == ("KiB", 1024)
    assert byte_unit(64 << 20) == ("MiB", 1 << 20)


def _row(dims, lb, arena, ours=None, tvm_run=None):
    from relax_memplan.report import ShapeMeasurement

    return ShapeMeasurement(dims=dims, runtime_alloc_bytes=ours, arena_bytes=arena,
                            lower_bound_bytes=lb, tvm_default_runtime_alloc_bytes=tvm_run)


def test_shape_series_follow_the_rows_in_increasing_shape_order():
    from relax_memplan.report.plot import shape_series
    from relax_memplan.report import CompileReport

    exact = CompileReport(model="m", strategy="exact", dims={"seq": (1, 64)}, shapes=[
        _row({"seq": 1}, 64, 64, 200, 300), _row({"seq": 64}, 4096, 4160, 5000, 9000),
        _row({"seq": 9}, 576, 640, 900, 1500)])
    upper = CompileReport(model="m", strategy="upper_bound", dims={"seq": (1, 64)}, shapes=[
        _row({"seq": 1}, 64, 4160, 4300, 300), _row({"seq": 64}, 4096, 4160, 5000, 9000),
        _row({"seq": 9}, 576, 4160, 4300, 1500)])
    dims, series = shape_series({"exact": exact, "upper_bound": upper})
    assert dims == [{"seq": 1}, {"seq": 9}, {"seq": 64}]
    assert series == {"lower bound": [64, 576, 4096], "arena (exact)": [64, 640, 4160],
                      "arena (upper_bound)": [4160, 4160, 4160],
                      "our build, run (exact)": [200, 900, 5000],
                      "our build, run (upper_bound)": [4300, 4300, 5000],
                      "TVM default build, run": [300, 1500, 9000]}


def test_shape_chart_without_a_run_has_no_run_series(tmp_path):
    from relax_memplan.report.plot import plot_shapes, shape_series
    from relax_memplan.report import CompileReport

    report = CompileReport(model="m", strategy="exact", dims={"b": (1, 4)},
                           shapes=[_row({"b": 4}, 512, 576), _row({"b": 1}, 128, 128)])
    assert shape_series({"exact": report})[1] == {"lower bound": [128, 512],
                                                  "arena (exact)": [128, 576]}
    out = plot_shapes({"exact": report}, tmp_path / "s.png", title="m")
    assert out.read_bytes()[:8] == PNG_MAGIC


def test_shape_series_draw_no_arena_for_a_plan_that_placed_nothing():
    """Regression: an unplanned dynamic build (all left to TVM) drew its 0 B arena and lower bound."""
    from relax_memplan.report.plot import shape_series
    from relax_memplan.report import CompileReport

    rows = [_row({"b": 1}, 0, 0, 700, 700), _row({"b": 4}, 0, 0, 900, 900)]
    for row in rows:
        row.planned = False
    unplanned = CompileReport(model="m", strategy="exact", dims={"b": (1, 4)}, shapes=rows,
                              not_planned_reason="offset expression too long")
    assert shape_series({"exact": unplanned})[1] == {"our build, run (exact)": [700, 900],
                                                     "TVM default build, run": [700, 900]}
    planned = CompileReport(model="m", strategy="upper_bound", dims={"b": (1, 4)},
                            shapes=[_row({"b": 1}, 128, 512), _row({"b": 4}, 512, 512)])
    series = shape_series({"exact": unplanned, "upper_bound": planned})[1]
    assert series["lower bound"] == [128, 512] and "arena (exact)" not in series


def test_long_model_path_titles_fit_the_figure():
    """Regression: a model given by a long path made the plan title run off the figure;
    the title names the file and wraps at 70 characters."""
    from relax_memplan.report.plot import _fit_title, _short_name

    path = "/home/someone/projects/deploy/models/ultraface-rfb-320-opset9.onnx"
    assert _short_name(path) == "ultraface-rfb-320-opset9.onnx"
    assert _short_name("built-in example") == "built-in example"
    text = _fit_title(f"{_short_name(path)} main: device 0, 123 tensors in one arena "
                      f"(lowest_first_by_area)")
    assert all(len(line) <= 70 for line in text.splitlines()) and "\n" in text


def test_live_bytes_count_tensors_placed_inside_one_another_once():
    """Regression: yolov8n's plot showed live bytes 2,400 KiB above its 2,000 KiB arena
    (a concat output and its three inputs placed inside it, summed). With offsets the live
    bytes are the bytes covered; the report's peak rows the same."""
    from types import SimpleNamespace

    from relax_memplan.report.tensor_rows import live_storage_bytes, peak_of
    from relax_memplan.planner.buffer import union_bytes

    def t(start, end, size):
        return SimpleNamespace(start=start, end=end, size_bytes=size)

    # out [0, 300) holds a [0, 100) and b [100, 300); c elsewhere
    tensors = [t(0, 3, 100), t(1, 3, 200), t(2, 4, 300), t(0, 4, 50)]
    offsets = [0, 100, 0, 300]
    assert live_bytes_per_step(tensors, 4) == [150, 350, 650, 350]
    assert live_bytes_per_step(tensors, 4, offsets) == [150, 350, 350, 350]
    assert union_bytes([(0, 100), (100, 200), (0, 300), (300, 50)]) == 350
    assert union_bytes([(0, 10), (5, 10), (30, 1), (0, 0)]) == 16
    rows = [{"name": n, "size_bytes": x.size_bytes, "live_range": [x.start, x.end],
             "offset_bytes": o, "arena": 0} for n, x, o in zip("abcd", tensors, offsets)]
    step, names = peak_of(rows)
    assert live_storage_bytes([r for r in rows if r["name"] in names]) == 350
    # two arenas never merge their ranges
    assert live_storage_bytes([dict(rows[0], arena=0), dict(rows[0], arena=1)]) == 200
    assert live_storage_bytes([{"size_bytes": 7}, {"size_bytes": 5}]) == 12


def test_peak_counts_a_group_root_over_its_reserved_span():
    """A concat output's storage is reserved from its first input's definition (the planner's
    merged buffer, the lower bound): with that span the peak rows cover the output's bytes
    at a step where only an input has been written."""
    from relax_memplan.report.tensor_rows import live_storage_bytes, peak_of

    rows = [{"name": "out", "size_bytes": 300, "live_range": [3, 5], "offset_bytes": 0},
            {"name": "a", "size_bytes": 100, "live_range": [1, 4], "offset_bytes": 0},
            {"name": "x", "size_bytes": 250, "live_range": [0, 2], "offset_bytes": 300}]
    step, names = peak_of(rows)
    assert (step, live_storage_bytes([r for r in rows if r["name"] in names])) == (1, 350)
    rows[0].update(group_live_range=[1, 5], group_size_bytes=300)
    rows[1].update(inside={"tensor": "out", "delta_bytes": 0, "kind": "concat input"})
    step, names = peak_of(rows)
    assert step == 1 and sorted(names) == ["out", "x"]  # a is inside out: named under it
    assert live_storage_bytes([dict(r, size_bytes=r.get("group_size_bytes", r["size_bytes"]))
                               for r in rows if r["name"] in names]) == 550
