"""Real ONNX models from ../shared/models compiled with our pipeline, against onnxruntime and TVM.

For each model: numerics within ``1e-4 * max|ref| + 1e-5`` of onnxruntime, our arena and our
whole build (per call) no larger than TVM's default build and within 2 % of the lower bound (peak live bytes), and the bytes the VM
allocates at run time equal to what the static plan says.
"""

import numpy as np
import pytest

from relax_memplan.compile import CheckOptions, compile_model
from tests.conftest import shared_model

CASES = [
    pytest.param("mnist-8/model.onnx", None, None, id="mnist-8"),
    pytest.param("squeezenet1.0-randw.onnx", None, None, id="squeezenet1.0"),
    pytest.param("mobilenetv2-tiny.onnx", {"x": (1, 3, 96, 96)}, None, id="mobilenetv2-b1"),
    # batch 5: the same checks as b1 at another batch; batch 5 itself is verified against
    # onnxruntime by test_dynamic_models.py[mobilenetv2-batch] (range 1..5, the ends first),
    # batch 1..4 by test_cli.py's test_dynamic_dims_measured_at_range_ends: slow (suite time)
    pytest.param("mobilenetv2-tiny.onnx", {"x": (5, 3, 96, 96)}, None, id="mobilenetv2-b5",
                 marks=pytest.mark.slow),
    pytest.param(
        "silero-vad-op18-ifless.onnx",
        {"input": (1, 512), "state": (2, 1, 128)},
        {"sr": np.array(16000, dtype=np.int64)},
        id="silero-vad-if",
    ),
    pytest.param("ultraface-rfb-320-opset9.onnx", None, None, id="ultraface-opset9"),
    # TVM's importer alone fails on these; our ONNX preparation steps make them import
    pytest.param("bert-tiny-randw.onnx",
                 {"input_ids": (2, 16), "attention_mask": (2, 16), "token_type_ids": (2, 16)},
                 None, id="bert-tiny-prepared"),
    pytest.param("magika-1.0.3.onnx", {"bytes": (1, 2048)}, None, id="magika-prepared"),
    # Batch 5 with file-like bytes (0..255, 256 = padding).  Random bytes in {0, 1} (the
    # default random inputs) make magika's LayerNorm variances ~1e-5, where its
    # E[x^2] - E[x]^2 turns the float32 summation order into ~4e-3 output differences, and
    # onnxruntime's ReduceSum order changes with the batch size: see
    # tests/onnx_prepare/test_batch_layernorm.py.
    pytest.param(
        "magika-1.0.3.onnx",
        {"bytes": (5, 2048)},
        {"bytes": np.random.default_rng(0).integers(0, 257, (5, 2048)).astype(np.int32)},
        id="magika-b5-prepared",
        marks=pytest.mark.slow,  # ~14 s on 2 cores (two builds, untuned conv at batch 5);
        # tests/onnx_prepare/test_real_models.py checks magika at batch 1, 2, 5 by default
    ),
]


@pytest.mark.parametrize("name, shapes, values", CASES)
def test_model_matches_onnxruntime_and_beats_tvm(name, shapes, values):
    result = compile_model(shared_model(name), shapes, check=CheckOptions(verify=True),
                           input_values=values)
    main = result.report.main
    assert main.verified, f"max abs error {main.max_abs_error} > {main.error_tolerance}"
    assert main.num_planned > 0
    assert main.arena_bytes <= main.tvm_default_bytes
    assert main.planned_bytes <= main.tvm_default_bytes
    assert main.expected_runtime_alloc_bytes <= main.tvm_default_bytes
    assert main.arena_bytes <= 1.02 * main.lower_bound_bytes
    assert main.runtime_alloc_bytes == main.expected_runtime_alloc_bytes
    assert main.runtime_alloc_bytes <= main.tvm_default_runtime_alloc_bytes
    assert main.max_abs_diff_vs_tvm_default == 0.0


def test_mnist_matches_shipped_reference_output():
    """The model zoo ships mnist-8's expected output: check against it, not only onnxruntime."""
    import onnx
    from onnx import numpy_helper

    folder = shared_model("mnist-8/test_data_set_0")
    x = numpy_helper.to_array(onnx.load_tensor(str(folder / "input_0.pb")))
    expected = numpy_helper.to_array(onnx.load_tensor(str(folder / "output_0.pb")))
    result = compile_model(shared_model("mnist-8/model.onnx"), input_values={"Input3": x})
    np.testing.assert_allclose(result.outputs[0], expected, rtol=1e-4, atol=1e-3)


def test_ultraface_reports_the_opset_upgrade():
    """The note comes from the import (the report copies the import's notes); the build of
    ultraface is checked by test_model_matches_onnxruntime_and_beats_tvm[ultraface-opset9],
    so this one imports only (suite time: was a whole compile)."""
    from relax_memplan.frontend import import_onnx
    from relax_memplan.frontend.prepare import STEP_NAMES

    _mod, info = import_onnx(str(shared_model("ultraface-rfb-320-opset9.onnx")), {},
                             prepare_steps=STEP_NAMES)
    assert any(note.startswith("ONNX opset upgraded 9 -> 13 for import") for note in info.notes)
