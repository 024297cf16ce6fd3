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
    """Regression: inspect suggested sequence=1..128, which compile refused (192 is the
    smallest sequence: the frame count is (sequence - 192) // 512 + 1)."""
    path = shared_model("silero-vad-op18-ifless.onnx")
    assert inspect_onnx(path).suggested_dims["sequence"].startswith("192..")
    with pytest.raises(IndexBoundsError, match="smallest allowed sequence is 192"):
        _accepted(onnx.load(path), {"batch": (1, 8), "sequence": (1, 128)})


def test_import_failure_at_defaulted_dims_suggests_the_models_grid():
    """Regression: yolov8n without --shape failed at a Concat and the hint said only that
    dims were set to 1 (the notes suggested images=1,3,1,1); the hint now gives the grid."""
    from relax_memplan.errors import UnsupportedOperatorError

    with pytest.raises(UnsupportedOperatorError) as info:
        frontend.import_onnx(shared_model("yolov8n-nudenet-320n.onnx"))
    assert info.value.hint == ("dynamic dims batch, height, width were set to 1; try "
                               "--shape images=1,3,32,32 (the model's grid)")


def _refusal(capsys, path):
    """compile with no --shape/--dim: exit 1 before any import, one line; its flags."""
    from relax_memplan.cli import EXIT_ERROR, main

    assert main(["compile", str(path), "--no-measure", "-q"]) == EXIT_ERROR
    lines = capsys.readouterr().err.strip().splitlines()
    assert len(lines) == 1 and "not declared and compile does not guess a size" in lines[0]
    dim_text = lines[0].partition(": add ")[2].partition(" to compile once ")[0]
    shape_text = lines[0].rpartition("or fix them with ")[2].partition(" (placeholders")[0]
    dim_words, shape_words = shlex.split(dim_text), shlex.split(shape_text)
    assert dim_words[::2] == ["--dim"] * (len(dim_words) // 2)
    assert shape_words[::2] == ["--shape"] * (len(shape_words) // 2)
    return (dict(parse_dim_spec(w) for w in dim_words[1::2]),
            dict(frontend.parse_shape_spec(w) for w in shape_words[1::2]))


SYMBOLIC = ["silero-vad-op18-ifless.onnx", "ppocrv4-det.onnx", "yolov8n-nudenet-320n.onnx",
            "gpt2-tiny-randw.onnx", "bert-tiny-randw.onnx", "magika-1.0.3.onnx",
            "mobilenetv2-tiny.onnx"]


@pytest.mark.parametrize("name", SYMBOLIC)
def test_undeclared_dims_are_refused_with_flags_that_pass_compiles_checks(capsys, monkeypatch,
                                                                          name):
    """No silent size 1: ppocrv4-det compiled at 1x3x1x1 (261 s, a meaningless report), bert
    and gpt2 at seq 1. Both suggestions pass: the --dim ranges compile's range checks, the
    --shape values the import and the index checks at those shapes."""
    import relax_memplan.frontend as frontend_module

    path = shared_model(name)
    model = onnx.load(path)
    imports = []
    real_import = frontend_module.import_onnx
    monkeypatch.setattr(frontend_module, "import_onnx",
                        lambda *a, **k: imports.append(k.get("keep_dynamic")) or
                        real_import(*a, **k))
    ranges, shapes = _refusal(capsys, path)
    assert all(imports), "imported at a guessed shape before refusing"
    monkeypatch.undo()
    _accepted(model, ranges)
    check_dims_up_front(model, shapes, {})  # every symbolic dim fixed
    mod, info = frontend.import_onnx(model, shapes, prepare_steps=STEP_NAMES)
    assert info.defaulted_dims == {}
    check_dim_ranges(mod, {})


def test_silero_refusal_gives_the_smallest_sequence_that_works(capsys):
    """Regression: silero without --dim said "... (size 0), whatever the input shape",
    which is false: sequence >= 192 works; the refusal's --shape starts there."""
    ranges, shapes = _refusal(capsys, shared_model("silero-vad-op18-ifless.onnx"))
    assert shapes == {"input": (1, 192), "state": (2, 1, 128)}
    assert ranges["sequence"][0] == 192


def test_suggested_range_starts_where_no_tensor_is_empty():
    """openwakeword's melspectrogram: inspect suggested samples=1..64, which passed the range
    checks and then failed at run (a conv over fewer samples than its kernel); onnxruntime
    refuses such a length too. The suggestion now starts at the kernel's length."""
    import numpy as np
    from onnx import TensorProto, helper, numpy_helper

    from relax_memplan.frontend import run_onnxruntime

    graph = helper.make_graph(
        [helper.make_node("Conv", ["x", "w"], ["y"], kernel_shape=[8])], "conv",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 1, "samples"])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, None)],
        [numpy_helper.from_array(np.ones((1, 1, 8), np.float32), "w")])
    model = onnx.helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    assert inspect_onnx(model).suggested_dims["samples"].startswith("8..")
    with pytest.raises(Exception):
        run_onnxruntime(model, {"x": np.ones((1, 1, 7), np.float32)})
    assert run_onnxruntime(model, {"x": np.ones((1, 1, 8), np.float32)})[0].shape == (1, 1, 1)
