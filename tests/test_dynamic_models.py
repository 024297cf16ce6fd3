"""Real models compiled once with symbolic dims and our exact plan, run at >= 3 shapes.

Each run checks numerics against onnxruntime at the declared range ends and a shape between,
and that the VM's arena equals the plan's arena at that shape (never below the lower bound).
"""

import numpy as np
import pytest

from relax_memplan.dynamic_compile import compile_onnx_dynamic
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
    _, report = compile_onnx_dynamic(shared_model(name), dims, strategy="exact", sample_shapes=3,
                                     verify=True, input_values=values, compare_with_tvm=False,
                                     dynamic_pass=dyn)
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
