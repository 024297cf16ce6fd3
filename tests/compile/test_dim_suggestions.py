"""Every --dim flag inspect suggests for a shared model passes compile's checks of declared
ranges (up front, shape casts, index bounds) without building."""

import shlex

import onnx
import pytest

from relax_memplan import frontend
from relax_memplan.compile.dim_suggestions import check_dim_ranges
from relax_memplan.compile.shapes import check_dims_up_front, parse_dim_spec
from relax_memplan.errors import IndexBoundsError
from relax_memplan.onnx_prepare import STEP_NAMES
from relax_memplan.tools.inspect import inspect_onnx
from tests.conftest import shared_model

MODELS = ["silero-vad-op18-ifless.onnx", "ppocrv4-det.onnx", "yolov8n-nudenet-320n.onnx",
          "gpt2-tiny-randw.onnx", "bert-tiny-randw.onnx", "magika-1.0.3.onnx",
          "ultraface-rfb-320-opset9.onnx", "mobilenetv2-tiny.onnx", "squeezenet1.0-randw.onnx"]


def _accepted(model, ranges):
    """compile's checks of ``--dim`` ranges (ONNX names), at the ranges and their lower ends."""
    renames = check_dims_up_front(model, {}, ranges)
    mod, _ = frontend.import_onnx(model, {}, keep_dynamic=True, prepare_steps=STEP_NAMES)
    ranges = {renames.get(n, n): r for n, r in ranges.items()}
    check_dim_ranges(mod, ranges)
    check_dim_ranges(mod, {n: (r[0], r[0]) for n, r in ranges.items()})


@pytest.mark.parametrize("name", MODELS)
def test_every_suggested_dim_flag_passes_compiles_checks(name):
    path = shared_model(name)
    words = shlex.split(inspect_onnx(path).dim_flags())
    assert words[::2] == ["--dim"] * (len(words) // 2)
    ranges = dict(parse_dim_spec(w) for w in words[1::2])
    if ranges:
        _accepted(onnx.load(path), ranges)


def test_silero_suggestion_starts_at_the_smallest_sequence_that_works():
    """Newcomer trial: inspect suggested sequence=1..128, which compile refused (192 is the
    smallest sequence: the frame count is (sequence - 192) // 512 + 1)."""
    path = shared_model("silero-vad-op18-ifless.onnx")
    assert inspect_onnx(path).suggested_dims["sequence"].startswith("192..")
    with pytest.raises(IndexBoundsError, match="smallest allowed sequence is 192"):
        _accepted(onnx.load(path), {"batch": (1, 8), "sequence": (1, 128)})
