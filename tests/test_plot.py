"""relax_memplan.plot: the picture of an arena plan."""

from types import SimpleNamespace

import pytest
import tvm

pytest.importorskip("matplotlib")

from relax_memplan import PlanStaticMemory, get_pipeline, import_onnx  # noqa: E402
from relax_memplan.examples import example_cnn  # noqa: E402
from relax_memplan.plot import byte_unit, live_bytes_per_step, plot_plan  # noqa: E402

PNG_MAGIC = b"\x89PNG\r\n\x1a\n"


@pytest.fixture(scope="module")
def example_plan():
    mod, _ = import_onnx(example_cnn())
    plan = PlanStaticMemory(time_limit_s=0.2)
    tvm.compile(mod, "llvm", relax_pipeline=get_pipeline("llvm", plan_pass=plan))
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
