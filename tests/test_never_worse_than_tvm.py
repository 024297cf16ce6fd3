"""Issue 8, section 5: a build with our planner never allocates more than TVM's default build.

Per function, ``PlanStaticMemory`` keeps TVM's plan where our 64-byte-aligned arena would
allocate more (graphs of tiny tensors), and the report's "TVM default" counts everything TVM's
build allocates per call (outputs and tensors TVM does not plan, ``R.If`` branches included), so
the saving it shows compares like with like.
"""

import re

import numpy as np
import pytest

from relax_memplan.compile import CheckOptions, compile_model
from relax_memplan.frontend.examples import example_tiny_matmuls
from tests.conftest import shared_model


def _shown_saving(text: str):
    """(bytes, percent) on the report's "saved vs TVM default" line."""
    match = re.search(r"saved vs TVM default\s+([\d,]+) B.*?\s([\d.]+) %", text)
    assert match, text
    return int(match.group(1).replace(",", "")), float(match.group(2))


def test_tiny_model_keeps_tvms_plan_and_allocates_no_more():
    result = compile_model(example_tiny_matmuls(), check=CheckOptions(verify=True))
    main = result.report.main
    # our arena would be 2 x 192 B (aligned) against TVM's 2 x 144 B tokens
    assert main.fallback == "TVM's plan is smaller (432 B vs our 528 B per call)"
    assert any("keeps TVM's memory plan" in note for note in result.report.notes)
    assert "our arena not used" in result.report.format_text()
    assert (main.arena_bytes, main.num_planned) == (0, 0)
    assert main.runtime_alloc_bytes <= main.tvm_default_runtime_alloc_bytes
    assert main.expected_runtime_alloc_bytes == main.tvm_default_bytes == 432
    assert main.runtime_matches_plan and main.verified


def test_silero_if_model_counts_what_tvms_build_allocates():
    """Regression for "saved -200 %" on an If model: TVM's default now counts the tensors it
    leaves unplanned around the If, as its build really allocates them."""
    result = compile_model(shared_model("silero-vad-op18-ifless.onnx"),
                           {"input": (1, 512), "state": (2, 1, 128)},
                           input_values={"sr": np.array(16000, dtype=np.int64)})
    main = result.report.main
    assert main.fallback is None
    assert main.tvm_default_bytes == main.tvm_default_runtime_alloc_bytes
    assert main.expected_runtime_alloc_bytes == main.runtime_alloc_bytes
    assert main.expected_runtime_alloc_bytes <= main.tvm_default_bytes
    assert main.saved_percent >= 0
    shown_bytes, shown_percent = _shown_saving(result.report.format_text())
    assert shown_bytes == main.tvm_default_bytes - main.expected_runtime_alloc_bytes
    assert shown_percent == pytest.approx(100 * shown_bytes / main.tvm_default_bytes, abs=0.05)
