"""Shared ONNX models built with our CPU schedules for the host CPU (``schedule=True``): the
outputs stay within ``1e-4 * max|ref| + 1e-5`` of onnxruntime. Covers the 1x1 convolutions as
matmul tiles (mobilenetv2, squeezenet, yolov8n), direct convolutions with SiLU /
tanh-GELU epilogues (yolov8n, magika, ppocrv4-det), the weights packed at compile time (bert,
gpt2), and every other shared model (mnist, ultraface, silero: conv1d, the fallback's pooling
and element-wise kernels)."""

import numpy as np
import pytest

from relax_memplan.compile import BuildOptions, CheckOptions, compile_model
from relax_memplan.schedules import host_target
from tests.conftest import shared_model

CASES = [
    # ~10-15 s of CPU each (build for the host CPU): slow, except bert-tiny
    pytest.param("mobilenetv2-tiny.onnx", {"x": (1, 3, 96, 96)}, id="mobilenetv2",
                 marks=pytest.mark.slow),
    pytest.param("bert-tiny-randw.onnx", {"input_ids": (1, 32), "attention_mask": (1, 32),
                                          "token_type_ids": (1, 32)}, id="bert-tiny"),
    pytest.param("gpt2-tiny-randw.onnx", {"input_ids": (1, 16)}, id="gpt2-tiny",
                 marks=pytest.mark.slow),
    pytest.param("squeezenet1.0-randw.onnx", None, id="squeezenet1.0", marks=pytest.mark.slow),
    pytest.param("yolov8n-nudenet-320n.onnx", {"images": (1, 3, 320, 320)}, id="yolov8n",
                 marks=pytest.mark.slow),
    pytest.param("mnist-8/model.onnx", None, id="mnist-8"),  # ~2 s
    pytest.param("ultraface-rfb-320-opset9.onnx", None, id="ultraface", marks=pytest.mark.slow),
    pytest.param("silero-vad-op18-ifless.onnx", {"input": (1, 512), "state": (2, 1, 128)},
                 {"sr": np.array(16000, dtype=np.int64)}, id="silero-vad",
                 marks=pytest.mark.slow),
    # tanh-GELU after a conv1d (FastBoundedMath), a large conv1d-as-conv2d (DirectConv)
    pytest.param("magika-1.0.3.onnx", {"bytes": (1, 2048)}, id="magika", marks=pytest.mark.slow),
    pytest.param("ppocrv4-det.onnx", {"x": (1, 3, 320, 320)}, id="ppocrv4-det",
                 marks=pytest.mark.slow),
]


@pytest.mark.parametrize("name, shapes, values",
                         [pytest.param(*c.values, *([None] * (3 - len(c.values))), id=c.id,
                                       marks=c.marks) for c in CASES])
def test_scheduled_model_matches_onnxruntime(name, shapes, values):
    result = compile_model(shared_model(name), shapes,
                           options=BuildOptions(target=host_target(), schedule=True),
                           check=CheckOptions(verify=True, measure=False), input_values=values)
    main = result.report.main
    assert main.verified, f"max abs error {main.max_abs_error} > {main.error_tolerance}"
