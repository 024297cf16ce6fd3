"""check_shape_casts: dim ranges the importer's shape casts reject, refused before any build."""

import pytest

from relax_memplan.cli import EXIT_ERROR, main
from relax_memplan.compile.shape_casts import check_shape_casts
from relax_memplan.errors import ShapeSpecError
from tests.conftest import shared_model

PPOCR = "ppocrv4-det.onnx"
N, H, W = (f"p2o.DynamicDimension.{i}" for i in range(3))


@pytest.fixture(scope="module")
def ppocr_module():
    from relax_memplan.frontend import import_onnx

    mod, _ = import_onnx(shared_model(PPOCR), keep_dynamic=True)
    return mod


def test_ranges_on_the_stride_grid_pass(ppocr_module):
    check_shape_casts(ppocr_module, {N: (1, 8), H: (32, 320, 32), W: (32, 640, 32)})
    check_shape_casts(ppocr_module, {N: (1, 8), H: (64, 64), W: (96, 96)})


def test_a_value_the_casts_reject_is_refused_with_the_step_to_use(ppocr_module):
    """Regression: inspect's old suggestion 1..64 built both versions (85 s), then the VM
    stopped in the FPN's match_cast ((H - 1) // 32 * 2 + 2 vs. (H - 1) // 16 + 1)."""
    with pytest.raises(ShapeSpecError) as err:
        check_shape_casts(ppocr_module, {N: (1, 8), H: (32, 320, 32), W: (1, 64)})
    assert str(err.value) == (
        f"--dim {W}=1..64: the model cannot take {W}=1 (a shape cast of the imported model "
        f"needs 1 where it computes 2); use a step: --dim {W}=32..64:32")
    with pytest.raises(ShapeSpecError, match=f"cannot take {H}=48 .*{H}=64..320:32"):
        check_shape_casts(ppocr_module, {N: (1, 8), H: (48, 320, 16), W: (32, 64, 32)})


def test_cli_refuses_the_range_before_building(capsys):
    status = main(["compile", str(shared_model(PPOCR)), "-q", "--no-measure", "--dim", f"{N}=1..1",
                   "--dim", f"{H}=32..64:32", "--dim", f"{W}=1..64"])
    err = capsys.readouterr().err.strip().splitlines()
    assert status == EXIT_ERROR
    assert err == [f"relax-memplan: error: --dim {W}=1..64: the model cannot take {W}=1 (a shape "
                   f"cast of the imported model needs 1 where it computes 2); use a step: "
                   f"--dim {W}=32..64:32"]


def test_dims_are_taken_in_their_printed_spelling_and_named_in_the_flag_one(capsys):
    """Regression: shapes print p2o_DynamicDimension_1, flags need p2o.DynamicDimension.1."""
    status = main(["compile", str(shared_model(PPOCR)), "-q", "--no-measure",
                   "--dim", "p2o_DynamicDimension_0=1..1", "--dim", f"{H}=32..64:32",
                   "--dim", "p2o_DynamicDimension_2=1..64"])
    err = capsys.readouterr().err.strip().splitlines()
    assert status == EXIT_ERROR
    assert err[-1].startswith(f"relax-memplan: error: --dim {W}=1..64: the model cannot take {W}=1")


def test_flag_spelling_maps_only_unambiguous_printed_names():
    from relax_memplan.compile.shapes import flag_spelling

    assert flag_spelling([N, H, "seq"], ["p2o_DynamicDimension_0", H, "seq", "other"]) == {
        "p2o_DynamicDimension_0": N}
    assert flag_spelling(["a.b", "a_b"], ["a_b"]) == {}  # already a name of the model
    assert flag_spelling(["a.b", "a-b"], ["a_b"]) == {}  # two candidates: not guessed


def test_shape_takes_an_input_in_its_printed_spelling(tmp_path):
    import json

    from onnx import TensorProto, helper

    graph = helper.make_graph(
        [helper.make_node("Relu", ["in.1"], ["y"])], "g",
        [helper.make_tensor_value_info("in.1", TensorProto.FLOAT, ["n", 4])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, ["n", 4])])
    path = tmp_path / "m.onnx"
    path.write_bytes(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
                     .SerializeToString())
    report = tmp_path / "r.json"
    assert main(["compile", str(path), "-q", "--no-measure", "--shape", "in_1=3,4",
                 "--report", str(report)]) == 0
    assert json.loads(report.read_text())["inputs"] == {"in.1": {"shape": [3, 4],
                                                                 "dtype": "float32"}}
