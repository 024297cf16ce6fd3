"""Suggested --dim/--shape flags: shell-quoted, and every spelling the tool prints accepted."""

import shlex

import pytest
from onnx import TensorProto, helper

from relax_memplan.cli import EXIT_ERROR, main
from relax_memplan.compile.shapes import check_dims_up_front
from relax_memplan.compile.specs import parse_dim_spec
from relax_memplan.errors import ShapeSpecError
from relax_memplan.frontend.flags import dim_flag, shape_flag
from relax_memplan.tools.inspect import inspect_onnx


def _model(dim: str):
    """y = relu(x), x: float32 [dim, 16] with a symbolic dim of an odd name; input 'in put'."""
    graph = helper.make_graph(
        [helper.make_node("Relu", ["in put"], ["y"])], "g",
        [helper.make_tensor_value_info("in put", TensorProto.FLOAT, [dim, 16])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [dim, 16])])
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])


def test_flags_are_shell_quoted():
    assert dim_flag("seq len", "1..128") == "--dim 'seq len=1..128'"
    assert shape_flag("in put", (1, 16)) == "--shape 'in put=1,16'"
    assert dim_flag("seq", "1..128") == "--dim seq=1..128"


def test_dim_spec_splits_on_the_last_equals():
    assert parse_dim_spec("a=b=1..64") == ("a=b", (1, 64))
    with pytest.raises(ShapeSpecError, match="expected NAME=LO..HI"):
        parse_dim_spec("a=1..6=4")


@pytest.mark.parametrize("dim, spellings, module_name", [
    ("seq len", ["seq len", "seqlen", "seq_len"], "seqlen"),
    ("a=b", ["a=b"], "a=b"),
])
def test_every_spelling_of_an_odd_dim_name_is_accepted(dim, spellings, module_name):
    model = _model(dim)
    words = shlex.split(inspect_onnx(model).dim_flags())
    name, rng = parse_dim_spec(words[1])
    assert name == dim
    for given in spellings:
        renames = check_dims_up_front(model, {}, {given: rng})
        assert renames.get(given, given) == module_name
    with pytest.raises(ShapeSpecError, match="not a symbolic dim"):
        check_dims_up_front(model, {}, {"nope": rng})


def test_compile_takes_the_quoted_suggestion_of_a_dim_with_a_space(tmp_path, capsys):
    path = tmp_path / "space.onnx"
    path.write_bytes(_model("seq len").SerializeToString())
    assert main(["compile", str(path), "--no-measure"]) == EXIT_ERROR  # no size guessed
    err = capsys.readouterr().err
    assert "--dim 'seq len=1..128'" in err and "--shape 'in put=1,16'" in err
    assert main(["compile", str(path), "--no-measure", "--shape", "in put=1,16"]) == 0
    capsys.readouterr()
    assert main(["compile", str(path), "--no-measure", "--dim", "seq len=1..8"]) == 0
    assert "seqlen in [1, 8]" in capsys.readouterr().out


@pytest.mark.parametrize("text, advice", [
    ("s27=1..64:100", "(e.g. 1..101:100)"),
    ("h=160..650:32", "(e.g. 160..640:32 or 160..672:32)"),
])
def test_a_step_off_the_range_suggests_ranges_that_hold_more_than_one_value(text, advice):
    """Regression: --dim s27=1..64:100 suggested "e.g. 1..1:100"."""
    with pytest.raises(ShapeSpecError) as info:
        parse_dim_spec(text)
    assert str(info.value).endswith(advice)
    for spec in advice.strip("(e.g. )").split(" or "):
        parse_dim_spec(f"s={spec}")  # the advice is accepted


def test_a_dim_bound_past_int32_is_refused_in_one_line(tmp_path, capsys):
    """A bound of 10**20 overflowed numpy in the shape sampler (a traceback)."""
    import onnx

    x = helper.make_tensor_value_info("x", TensorProto.FLOAT, ["n", 4])
    y = helper.make_tensor_value_info("y", TensorProto.FLOAT, ["n", 4])
    graph = helper.make_graph([helper.make_node("Relu", ["x"], ["y"])], "relu", [x], [y])
    model = tmp_path / "relu.onnx"
    onnx.save(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)]), model)
    with pytest.raises(ShapeSpecError, match=r"at most 2,147,483,647"):
        parse_dim_spec("n=1..99999999999999999999")
    assert parse_dim_spec("n=1..2147483647") == ("n", (1, 2147483647))
    assert main(["compile", str(model), "--dim", "n=1..99999999999999999999", "-q",
                 "--no-compare", "--no-measure"]) == 1
    err = capsys.readouterr().err
    assert "at most 2,147,483,647" in err and "Traceback" not in err
