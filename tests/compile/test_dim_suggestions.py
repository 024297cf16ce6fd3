"""Every --dim flag inspect suggests for a shared model passes compile's checks of declared
ranges (up front, shape casts, index bounds) without building."""

import shlex

import onnx
import pytest

from relax_memplan import frontend
from relax_memplan.compile.dim_suggestions import check_dim_ranges
from relax_memplan.compile.shapes import check_dims_up_front
from relax_memplan.compile.specs import parse_dim_spec
from relax_memplan.errors import IndexBoundsError
from relax_memplan.frontend.prepare import STEP_NAMES
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


def test_import_failure_at_defaulted_dims_suggests_the_models_grid():
    """Newcomer trial: yolov8n without --shape failed at a Concat and the hint said only that
    dims were set to 1 (the notes suggested images=1,3,1,1); the hint now gives the grid."""
    from relax_memplan.errors import UnsupportedOperatorError

    with pytest.raises(UnsupportedOperatorError) as info:
        frontend.import_onnx(shared_model("yolov8n-nudenet-320n.onnx"))
    assert info.value.hint == ("dynamic dims batch, height, width were set to 1; try "
                               "--shape images=1,3,32,32 (the model's grid)")


def test_index_refusal_at_defaulted_dims_names_the_smallest_shapes(capsys):
    """Newcomer trial: silero without --dim said "... (size 0), whatever the input shape",
    which is false: sequence >= 192 works."""
    from relax_memplan.cli import EXIT_ERROR, main

    path = shared_model("silero-vad-op18-ifless.onnx")
    assert main(["compile", str(path), "--no-measure", "-q"]) == EXIT_ERROR
    err = capsys.readouterr().err.strip().splitlines()[-1]
    assert err == ("relax-memplan: error: Gather node 'node_select' reads index 0 of axis 2 "
                   "(size 0) at the input shapes compiled (undeclared dims compiled at 1; the "
                   "smallest shapes that work: --shape input=1,192 --shape state=2,1,128)")
