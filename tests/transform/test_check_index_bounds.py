"""Tests of CheckIndexBounds: index values never make a kernel leave its tensor."""

import json
import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
from tvm.script import ir as I
from tvm.script import relax as R

from relax_memplan.frontend import import_onnx
from relax_memplan.transform.annotate_dim_ranges import AnnotateDimRanges
from relax_memplan.transform.check_index_bounds import CheckIndexBounds
from tests.conftest import shared_model

REPO_ROOT = Path(__file__).resolve().parents[2]
OPS = ("Gather", "GatherElements", "GatherND", "ScatterElements", "ScatterND")


def _run(args, timeout=300):
    """A subprocess from the repository root (so this worktree's package is imported)."""
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join([str(REPO_ROOT), env.get("PYTHONPATH", "")])
    return subprocess.run([sys.executable, *args], env=env, cwd=REPO_ROOT, capture_output=True,
                          text=True, timeout=timeout)


@pytest.fixture(scope="module")
def index_results():
    proc = _run(["-m", "tests.transform.isolated_index_checks", *OPS])
    assert proc.returncode == 0, f"exit {proc.returncode}:\n{proc.stderr[-2000:]}"
    line = [x for x in proc.stdout.splitlines() if x.startswith("RESULT ")][-1]
    return json.loads(line[len("RESULT "):])


@pytest.mark.parametrize("op", OPS)
def test_in_range_extremes_equal_onnxruntime(index_results, op):
    """s-1 and -s (and -1) are not refused, and the outputs equal onnxruntime's."""
    for row in index_results[op]["good"]:
        assert row.get("error") is None, row
        assert row["max_abs_error"] == 0.0


@pytest.mark.parametrize("op", OPS)
def test_out_of_range_index_raises_named_error(index_results, op):
    """s and -s-1 (per axis for the ND ops) are caught before the kernel runs."""
    for row in index_results[op]["bad"]:
        assert row["error"] is not None, f"{op}: an out-of-range index was not caught"
        assert f"relax_memplan: index out of range in {op} node 'my_{op.lower()}': valid [-" \
            in row["error"]


def _bert(dim_upper):
    mod, _ = import_onnx(shared_model("bert-tiny-randw.onnx"), keep_dynamic=True)
    return AnnotateDimRanges({"batch": (1, 4), "seq": (1, dim_upper)})(mod)


def test_bert_tiny_position_ids_proved_and_word_ids_checked():
    """Position ids (a slice of a constant 0..127) need no run-time check; input ids do."""
    check = CheckIndexBounds()
    check(_bert(128))
    assert len(check.checked) == 2  # word and token-type embeddings: values from inputs
    assert len(check.proved) == 3  # position embeddings and the two mask gathers
    assert check.refused is None


def test_bert_tiny_declared_range_past_position_table_is_refused():
    check = CheckIndexBounds()
    with pytest.raises(Exception):
        check(_bert(129))
    assert str(check.refused) == (
        "--dim seq=1..129: Slice node '/m/embeddings/Slice' reads element seq - 1 of axis 1 "
        "(size 128); the largest allowed seq is 128")


def test_runtime_checks_off_keeps_compile_time_refusal():
    check = CheckIndexBounds(runtime_checks=False)
    out = check(_bert(128))
    assert "relax_memplan_check_indices" not in [gv.name_hint for gv in out.get_global_vars()]
    with pytest.raises(Exception):
        CheckIndexBounds(runtime_checks=False)(_bert(200))


BERT_SHAPES = ["--shape", "input_ids=1,16", "--shape", "attention_mask=1,16",
               "--shape", "token_type_ids=1,16"]


def test_cli_bert_tiny_huge_input_id_is_one_line_error_not_segfault(tmp_path):
    ids = np.ones((1, 16), dtype=np.int64)
    ids[0, 3] = 999999
    np.save(tmp_path / "ids.npy", ids)
    proc = _run(["-m", "relax_memplan.cli", "compile", str(shared_model("bert-tiny-randw.onnx")),
                 *BERT_SHAPES, "--input", f"input_ids={tmp_path / 'ids.npy'}", "-q"])
    assert proc.returncode == 1, f"exit {proc.returncode}: {proc.stderr[-1000:]}"
    lines = proc.stderr.strip().splitlines()
    assert len(lines) == 1, proc.stderr
    assert lines[0].startswith("relax-memplan: error: running main of relax_memplan's build at "
                               "inputs (1, 16), (1, 16), (1, 16) failed: IndexError: ")
    assert lines[0].endswith("IndexError: relax_memplan: index out of range in Gather node "
                             "'/m/embeddings/word_embeddings/Gather': valid [-1000, 999]")


def test_cli_gather_out_of_range_is_one_line_error(tmp_path):
    from tests.transform.isolated_index_checks import CASES

    import onnx

    onnx.save(CASES["Gather"][0], tmp_path / "gather.onnx")
    np.save(tmp_path / "idx.npy", np.array([0, 1, 5, 2], dtype=np.int64))
    proc = _run(["-m", "relax_memplan.cli", "compile", str(tmp_path / "gather.onnx"),
                 "--input", f"indices={tmp_path / 'idx.npy'}", "-q"])
    assert proc.returncode == 1, proc.stderr
    assert proc.stderr.strip() == ("relax-memplan: error: running main of relax_memplan's build at "
                                   "inputs (5, 3), (4,) failed: IndexError: "
                                   "relax_memplan: index out of range in Gather node 'my_gather': "
                                   "valid [-5, 4]")


def test_cli_dim_range_past_position_table_refused_and_128_compiles():
    model = str(shared_model("bert-tiny-randw.onnx"))
    proc = _run(["-m", "relax_memplan.cli", "compile", model, "--dim", "batch=1..2",
                 "--dim", "seq=1..129", "--no-measure", "-q"])
    assert proc.returncode == 1, proc.stderr
    assert proc.stderr.strip() == (
        "relax-memplan: error: --dim seq=1..129: Slice node '/m/embeddings/Slice' reads "
        "element seq - 1 of axis 1 (size 128); the largest allowed seq is 128")
    proc = _run(["-m", "relax_memplan.cli", "compile", model, "--dim", "batch=1..2",
                 "--dim", "seq=1..128", "--no-measure", "-q"])
    assert proc.returncode == 0, proc.stderr[-2000:]


def _range_gather_model():
    """``Gather(table[128, 4], Range(0, seq))``: position ids from the dim itself."""
    from onnx import TensorProto, helper, numpy_helper

    const = lambda name, v: numpy_helper.from_array(np.array(v, np.int64), name)  # noqa: E731
    nodes = [helper.make_node("Shape", ["x"], ["shape"]),
             helper.make_node("Gather", ["shape", "one"], ["seq"], axis=0),
             helper.make_node("Range", ["zero", "seq", "one"], ["pos"]),
             helper.make_node("Gather", ["table", "pos"], ["out"], axis=0)]
    graph = helper.make_graph(
        nodes, "pos", [helper.make_tensor_value_info("x", TensorProto.INT64, [1, "seq"])],
        [helper.make_tensor_value_info("out", TensorProto.FLOAT, ["seq", 4])],
        initializer=[numpy_helper.from_array(np.zeros((128, 4), np.float32), "table"),
                     const("one", 1), const("zero", 0)])
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 18)])


def test_range_position_ids_past_table_refused_and_in_range_proved():
    mod, _ = import_onnx(_range_gather_model(), keep_dynamic=True)
    check = CheckIndexBounds()
    check(AnnotateDimRanges({"seq": (1, 128)})(mod))
    assert check.proved == ["main: Gather node with output 'out'"] and check.checked == []
    check = CheckIndexBounds()
    with pytest.raises(Exception):
        check(AnnotateDimRanges({"seq": (1, 129)})(mod))
    assert str(check.refused) == ("--dim seq=1..129: Gather node with output 'out' reads row "
                                  "seq - 1 of a 128-row table; the largest allowed seq is 128")


def test_bert_tiny_checks_name_onnx_nodes():
    check = CheckIndexBounds()
    check(_bert(128))
    assert check.checked == ["main: Gather node '/m/embeddings/word_embeddings/Gather'",
                             "main: Gather node '/m/embeddings/token_type_embeddings/Gather'"]


@I.ir_module
class _PlainTake:
    @R.function
    def main(x: R.Tensor((5, 3), "float32"), i: R.Tensor((4,), "int64")):
        with R.dataflow():
            y = R.take(x, i, axis=0, mode="fast")
            R.output(y)
        return y


def test_module_not_from_onnx_names_relax_op_and_var():
    """No ``relax_memplan.onnx_nodes`` attribute (and a TVMScript span): today's wording."""
    check = CheckIndexBounds()
    out = check(_PlainTake)
    assert check.checked == ["main: Gather (Relax take 'y')"]
    kernel = [f for gv, f in out.functions_items() if gv.name_hint == "relax_memplan_check_indices"]
    assert "index out of range in Gather (Relax take 'y'): valid [0, 4]" in kernel[0].script()


def test_range_below_the_smallest_valid_value_names_it():
    """Silero's frame count is (sequence - 192) // 512 + 1, so a range of 1..128 (what
    ``inspect`` suggests as a placeholder) has no valid value: the refusal says where the
    valid values start (regression: it only said "for every sequence in the range")."""
    mod, _ = import_onnx(shared_model("silero-vad-op18-ifless.onnx"), keep_dynamic=True)
    check = CheckIndexBounds()
    with pytest.raises(Exception):
        check(AnnotateDimRanges({"batch": (1, 8), "sequence": (1, 128)})(mod))
    assert str(check.refused).endswith(
        "for every sequence in the range; the smallest allowed sequence is 192")
    ok = CheckIndexBounds()
    ok(AnnotateDimRanges({"batch": (1, 8), "sequence": (192, 1024)})(mod))
    assert ok.refused is None
