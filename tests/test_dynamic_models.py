"""Real models compiled once with symbolic dims and our exact plan, run at >= 3 shapes.

Each run checks numerics against onnxruntime at the declared range ends and a shape between,
and that the VM's arena equals the plan's arena at that shape (never below the lower bound).
"""

import numpy as np
import pytest

from relax_memplan.compile import BuildOptions, CheckOptions, compile_model
from relax_memplan.transform.plan_dynamic_memory import PlanDynamicMemory
from tests.conftest import shared_model

CASES = [
    pytest.param("mobilenetv2-tiny.onnx", {"batch": (1, 5)}, None, id="mobilenetv2-batch"),
    pytest.param("bert-tiny-randw.onnx", {"batch": (1, 2), "seq": (1, 128)}, None, id="bert-batch-seq"),
    pytest.param("gpt2-tiny-randw.onnx", {"s77": (1, 2), "s27": (1, 128)}, None, id="gpt2-batch-seq"),
    pytest.param("silero-vad-op18-ifless.onnx", {"batch": (1, 2), "sequence": (256, 1024)},
                 {"sr": np.array(16000, dtype=np.int64)}, id="silero-if"),
]


@pytest.mark.parametrize("name, dims, values", CASES)
def test_exact_plan_matches_onnxruntime_at_sampled_shapes(name, dims, values):
    dyn = PlanDynamicMemory(strategy="exact")
    report = compile_model(shared_model(name), None, dims,
                           options=BuildOptions(strategies=("exact",), dynamic_pass=dyn,
                                                compare_with_tvm=False),
                           check=CheckOptions(sample_shapes=3, verify=True),
                           input_values=values).report
    assert report.planned_tensors > 0, report.notes
    # every shape of the (small) declared ranges was checked: within 1.02 x the lower bound
    checked = dyn.plans["main"].checked
    assert checked["enumerated"] and checked["max_ratio"] <= 1.02, checked
    assert len(report.shapes) == 3
    lows = {n: max(lo, 1) for n, (lo, _) in dims.items()}
    highs = {n: hi for n, (_, hi) in dims.items()}
    assert report.shapes[0].dims == lows and report.shapes[1].dims == highs
    for row in report.shapes:
        assert row.max_abs_error is not None and row.max_abs_error < 1e-3, row
        assert row.lower_bound_bytes <= row.arena_bytes <= 1.02 * row.lower_bound_bytes
        # one arena per call, plus outputs: never less than the arena
        assert row.runtime_alloc_bytes >= row.arena_bytes


def _image(name, rng, n, h, w):
    return {name: rng.uniform(0, 1, (n, 3, h, w)).astype("float32")}


def _bytes(name, rng, batch):
    return {name: rng.integers(0, 257, (batch, 2048)).astype("int32")}  # file-like bytes, 256 = pad


GIVEN_SHAPES = [
    # magika's LayerNorm amplifies onnxruntime's batch-dependent summation order on {0, 1}
    # inputs (tests/onnx_prepare/test_batch_layernorm.py): feed file-like bytes instead
    pytest.param("magika-1.0.3.onnx", {"unk__214": (1, 4)}, lambda rng, b: _bytes("bytes", rng, b),
                 [(1,), (4,), (2,)], 1e-4, id="magika-batch"),
    pytest.param("yolov8n-nudenet-320n.onnx",
                 {"batch": (1, 1), "height": (160, 320, 32), "width": (160, 320, 32)},
                 lambda rng, h, w: _image("images", rng, 1, h, w),
                 [(160, 160), (320, 320), (256, 192)], 2e-3, id="yolov8n-steps", marks=pytest.mark.slow),
    pytest.param("ppocrv4-det.onnx",
                 {"p2o.DynamicDimension.0": (1, 1), "p2o.DynamicDimension.1": (32, 320, 32),
                  "p2o.DynamicDimension.2": (32, 320, 32)},
                 lambda rng, h, w: _image("x", rng, 1, h, w),
                 [(32, 32), (320, 320), (96, 64)], 1e-4, id="ppocr-steps", marks=pytest.mark.slow),
]


@pytest.mark.parametrize("name, dims, make_feeds, shapes, rtol", GIVEN_SHAPES)
def test_exact_plan_at_given_shapes_matches_onnxruntime(name, dims, make_feeds, shapes, rtol):
    """Models whose inputs need care (byte values, image sides on a stride grid): built once with
    the exact plan, run at the range ends and a shape between."""
    import tvm

    from relax_memplan.frontend import import_onnx, run_onnxruntime
    from relax_memplan.pipeline import get_pipeline
    from relax_memplan.runtime import run_and_measure

    path = shared_model(name)
    mod, _ = import_onnx(path, keep_dynamic=True)
    dyn = PlanDynamicMemory(strategy="exact")
    ex = tvm.compile(mod, "llvm", relax_pipeline=get_pipeline("llvm", dynamic_pass=dyn, dim_ranges=dims))
    fplan = dyn.plans["main"]
    assert fplan.planned, fplan.fallback_reason
    assert fplan.checked["enumerated"] and fplan.checked["max_ratio"] <= 1.02, fplan.checked
    rng = np.random.default_rng(0)
    varying = [n for n, r in dims.items() if r[0] != r[1]]
    for shape in shapes:
        feeds = make_feeds(rng, *shape)
        got = run_and_measure(ex, list(feeds.values()))
        ref = run_onnxruntime(path, feeds)
        for out, expected in zip(got.outputs, ref):
            bound = rtol * float(np.abs(expected).max()) + 1e-5
            assert float(np.abs(out - expected).max()) <= bound, (name, shape)
        at = {n: dims[n][0] for n in dims} | dict(zip(varying, shape))
        arena, lower_bound, _ = fplan.bytes_at({n: at[n] for n in fplan.used_dims})
        assert got.alloc_sizes_bytes[0] == arena <= 1.02 * lower_bound


def test_report_lists_specialized_kernels_and_the_path_each_shape_took():
    """Kernel dispatch on bert-tiny: bucket seq=32 (a range end) runs the specialized kernels,
    other shapes the generic ones; both match onnxruntime and the exact plan holds on both."""
    report = compile_model(shared_model("bert-tiny-randw.onnx"), None,
                           {"batch": (1, 1), "seq": (1, 32)},
                           options=BuildOptions(strategies=("exact",), dispatch={"seq": [32]},
                                                compare_with_tvm=False),
                           check=CheckOptions(sample_shapes=3, verify=True, seed=3)).report
    assert report.specialized and all(v == {"seq": [32]} for v in report.specialized.values())
    assert "kernels specialized" in report.format_text()
    seqs = [row.dims["seq"] for row in report.shapes]
    assert seqs[:2] == [1, 32]
    for row in report.shapes:
        assert row.max_abs_error < 1e-4
        assert row.kernel_paths == (["seq=32"] if row.dims["seq"] == 32 else ["generic"])
        assert row.arena_bytes == row.lower_bound_bytes
