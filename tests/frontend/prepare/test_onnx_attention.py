"""The ``onnx_attention`` converter step: the standard ONNX Attention (opset 23) against
onnxruntime, fused by FuseAttention where its form allows, com.microsoft's left to TVM."""

import warnings

import numpy as np
import pytest
import tvm
from tvm import relax

from relax_memplan.errors import UnsupportedOperatorError
from relax_memplan.frontend import import_onnx, run_onnxruntime
from relax_memplan.pipeline import get_pipeline
from relax_memplan.transform.fuse_attention import FuseAttention

from .attention_models import attention_feeds, attention_model

REL_TOL = 1e-4


def _import(model, **kwargs):
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        return import_onnx(model, **kwargs)


def _build(mod, fusion=True, dims=None):
    """(VM, FuseAttention pass or None) of ``mod`` built with our pipeline."""
    passes = {"fusion_pass_list": [FuseAttention()]} if fusion else {}
    pipeline = get_pipeline("llvm", fusion=fusion, dim_ranges=dims, **passes)
    ex = tvm.compile(mod, "llvm", relax_pipeline=pipeline)
    return relax.VirtualMachine(ex, tvm.cpu()), (passes["fusion_pass_list"][0] if fusion else None)


def _assert_matches_onnxruntime(vm, model, feeds):
    got = vm["main"](*[tvm.runtime.tensor(v) for v in feeds.values()])
    got = [got] if hasattr(got, "numpy") else list(got)
    expected = run_onnxruntime(model, feeds)
    assert len(got) == len(expected)
    for index, (out, ref) in enumerate(zip(got, expected)):
        out = out.numpy()
        assert out.shape == ref.shape, f"output {index}"
        err = np.max(np.abs(out - ref)) / max(float(np.max(np.abs(ref))), 1e-30)
        assert err <= REL_TOL, f"output {index}: rel. err {err:.2e}"


# name -> (input shapes, attributes, outputs, blocks fused)
FORMS = {
    "mha_4d": ({"q": [2, 4, 5, 8], "k": [2, 4, 6, 8], "v": [2, 4, 6, 8]}, {}, ("y",), 1),
    "gqa_4d_causal": ({"q": [2, 4, 5, 8], "k": [2, 2, 5, 8], "v": [2, 2, 5, 8]},
                      {"is_causal": 1}, ("y",), 1),
    "mqa_3d": ({"q": [2, 5, 32], "k": [2, 6, 8], "v": [2, 6, 8]},
               {"q_num_heads": 4, "kv_num_heads": 1}, ("y",), 1),
    "bool_mask_3d_value_head_dim": (
        {"q": [2, 5, 32], "k": [2, 6, 32], "v": [2, 6, 16], "attn_mask": [2, 1, 5, 6]},
        {"q_num_heads": 4, "kv_num_heads": 4}, ("y",), 1),
    "causal_cross_fewer_queries": ({"q": [1, 2, 3, 8], "k": [1, 2, 7, 8], "v": [1, 2, 7, 8]},
                                   {"is_causal": 1}, ("y",), 1),
    "scale_and_softmax_precision": ({"q": [1, 2, 5, 8], "k": [1, 2, 6, 8], "v": [1, 2, 6, 8]},
                                    {"scale": 0.3, "softmax_precision": 1}, ("y",), 1),
    "past_causal_present": (
        {"q": [1, 2, 3, 8], "k": [1, 2, 3, 8], "v": [1, 2, 3, 8], "past_key": [1, 2, 4, 8],
         "past_value": [1, 2, 4, 8]},
        {"is_causal": 1}, ("y", "present_key", "present_value"), 1),
    "past_3d_gqa_bool_mask_causal": (
        {"q": [1, 3, 32], "k": [1, 3, 16], "v": [1, 3, 16], "attn_mask": [3, 7],
         "past_key": [1, 2, 4, 8], "past_value": [1, 2, 4, 8]},
        {"q_num_heads": 4, "kv_num_heads": 2, "is_causal": 1},
        ("y", "present_key", "present_value"), 1),
    "softcap_bool_mask": ({"q": [1, 2, 5, 8], "k": [1, 2, 6, 8], "v": [1, 2, 6, 8],
                           "attn_mask": [5, 6]}, {"softcap": 2.0}, ("y",), 1),
    # refused: the scores are a function output

    "qk_matmul_output_mode_0": ({"q": [1, 2, 5, 8], "k": [1, 2, 6, 8], "v": [1, 2, 6, 8]},
                                {}, ("y", "qk_matmul_output"), 0),
}


@pytest.mark.parametrize("name", list(FORMS))
def test_form_matches_onnxruntime_and_fuses(name):
    shapes, attrs, outputs, fused = FORMS[name]
    model = attention_model(shapes, outputs, **attrs)
    mod, info = _import(model)
    assert "onnx_attention: corrected Attention at 1 node(s)" in info.notes
    vm, fusion = _build(mod)
    assert (fusion.fused, fusion.records[0].candidates) == (fused, 1), fusion.records[0].refused
    _assert_matches_onnxruntime(vm, model, attention_feeds(model))


def test_float_mask_is_added_to_the_scores():
    model = attention_model({"q": [1, 2, 5, 8], "k": [1, 2, 6, 8], "v": [1, 2, 6, 8],
                             "attn_mask": [5, 6]}, mask_dtype="float32")
    vm, fusion = _build(_import(model)[0])
    assert fusion.fused == 1
    _assert_matches_onnxruntime(vm, model, attention_feeds(model))


@pytest.mark.parametrize("fusion", [True, False])
def test_a_query_row_with_no_key_gives_zeros(fusion):
    model = attention_model({"q": [1, 2, 5, 8], "k": [1, 2, 6, 8], "v": [1, 2, 6, 8],
                             "attn_mask": [1, 1, 5, 6]})
    feeds = attention_feeds(model, masked_row=True)
    vm, _ = _build(_import(model)[0], fusion=fusion)
    _assert_matches_onnxruntime(vm, model, feeds)
    got = vm["main"](*[tvm.runtime.tensor(v) for v in feeds.values()]).numpy()
    assert not np.isnan(got).any() and not got[:, :, 0].any()


def test_symbolic_sequence_compiled_once_fused_and_run_at_two_lengths():
    model = attention_model({"q": [1, "seq", 32], "k": [1, "seq", 16], "v": [1, "seq", 16],
                             "attn_mask": [1, 1, "seq", "seq"]},
                            q_num_heads=4, kv_num_heads=2, is_causal=1)
    mod, _ = _import(model, keep_dynamic=True)
    vm, fusion = _build(mod, dims={"seq": (1, 16)})
    assert fusion.fused == 1, fusion.records[0].refused
    for seq in (3, 11):
        _assert_matches_onnxruntime(vm, model, attention_feeds(model, {"seq": seq}, seed=seq))


def test_symbolic_past_and_a_mask_length_checked_at_run_time():
    """The mask's key dim ``t`` is not provably ``past + seq``: cast to it, checked per call."""
    model = attention_model(
        {"q": [1, "s", 32], "k": [1, "s", 16], "v": [1, "s", 16], "attn_mask": [1, 1, "s", "t"],
         "past_key": [1, 2, "p", 8], "past_value": [1, 2, "p", 8]},
        ("y", "present_key", "present_value"), q_num_heads=4, kv_num_heads=2, is_causal=1)
    mod, _ = _import(model, keep_dynamic=True)
    vm, fusion = _build(mod, dims={"s": (1, 16), "p": (0, 16), "t": (1, 32)})
    assert fusion.fused == 1, fusion.records[0].refused
    for seq, past in ((1, 5), (4, 0), (7, 9)):
        feeds = attention_feeds(model, {"s": seq, "p": past, "t": seq + past}, seed=seq)
        _assert_matches_onnxruntime(vm, model, feeds)
    feeds = attention_feeds(model, {"s": 2, "p": 3, "t": 4})
    with pytest.raises(Exception, match="match_cast"):
        vm["main"](*[tvm.runtime.tensor(v) for v in feeds.values()])


def test_cli_reports_two_attention_nodes_fused(tmp_path, capsys):
    import onnx
    from onnx import TensorProto, helper

    from relax_memplan.cli import main

    f32 = TensorProto.FLOAT
    nodes = [helper.make_node("Attention", ["x", "x", "x"], ["a"], name="self_3d",
                              q_num_heads=4, kv_num_heads=4, is_causal=1),
             helper.make_node("Reshape", ["a", "heads"], ["a4"]),
             helper.make_node("Transpose", ["a4"], ["q4"], perm=[0, 2, 1, 3]),
             helper.make_node("Attention", ["q4", "k", "v", "m"], ["y"], name="cross_4d")]
    graph = helper.make_graph(
        nodes, "two", [helper.make_tensor_value_info("x", f32, [1, "seq", 32]),
                       helper.make_tensor_value_info("k", f32, [1, 4, 6, 8]),
                       helper.make_tensor_value_info("v", f32, [1, 4, 6, 8]),
                       helper.make_tensor_value_info("m", TensorProto.BOOL, [1, 1, "seq", 6])],
        [helper.make_tensor_value_info("y", f32, [1, 4, "seq", 8])],
        [helper.make_tensor("heads", TensorProto.INT64, [4], [1, -1, 4, 8])])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 23)])
    model.ir_version = 10
    path = tmp_path / "two.onnx"
    onnx.save(model, path)
    status = main(["compile", str(path), "-q", "--verify", "--no-compare", "--time-limit",
                   "0.2", "--shape", "x=1,7,32", "--shape", "m=1,1,7,6"])
    text = capsys.readouterr().out
    assert status == 0
    assert "attention: 2 of 2 fused" in text


@pytest.mark.parametrize("shapes, attrs, outputs, message", [
    ({"q": [1, 2, 5, 8], "k": [1, 2, 6, 8], "v": [1, 2, 6, 8]}, {"qk_matmul_output_mode": 1},
     ("y", "qk_matmul_output"), "qk_matmul_output_mode 1 is not supported"),
    ({"q": [1, 3, 5, 8], "k": [1, 2, 6, 8], "v": [1, 2, 6, 8]}, {}, ("y",),
     "3 query heads are not a multiple of 2 key/value heads"),
    ({"q": [1, 2, 5, 8], "k": [1, 2, 6, 8], "v": [1, 2, 6, 8], "attn_mask": [1, 1, 5, 4]}, {},
     ("y",), r"attn_mask \(1, 1, 5, 4\) does not fit"),
    ({"q": [1, 2, 5, 8], "k": [1, 2, 6, 8], "v": [1, 2, 6, 8]}, {"scale": -0.5}, ("y",),
     "scale -0.5 is not positive"),
])
def test_unsupported_attention_names_the_node(shapes, attrs, outputs, message):
    model = attention_model(shapes, outputs, name="attn_0", **attrs)
    with pytest.raises(UnsupportedOperatorError, match=message) as error:
        _import(model)
    assert (error.value.node_name, error.value.op_type) == ("attn_0", "Attention")


def test_nonpad_kv_seqlen_of_opset_24_is_refused():
    model = attention_model({"q": [1, 2, 5, 8], "k": [1, 2, 6, 8], "v": [1, 2, 6, 8],
                             "nonpad_kv_seqlen": [1]}, opset=24)
    with pytest.raises(UnsupportedOperatorError, match="nonpad_kv_seqlen is not supported"):
        _import(model)


def test_without_the_step_tvm_reads_it_as_com_microsoft_attention():
    model = attention_model({"q": [1, 2, 5, 8], "k": [1, 2, 6, 8], "v": [1, 2, 6, 8]})
    with pytest.raises(UnsupportedOperatorError, match="'att'"):
        _import(model, disable_steps=["onnx_attention"])


def test_attention_in_an_if_branch_is_told_apart_by_its_attributes():
    """TVM converts a branch without passing its nodes through ``_parse_value_proto``: no
    tracked node, the attributes say it is not com.microsoft's."""
    from onnx import TensorProto, helper

    f32 = TensorProto.FLOAT
    shape = [1, 2, 3, 8]
    then = helper.make_graph([helper.make_node("Attention", ["q", "k", "v"], ["yt"])], "then",
                             [], [helper.make_tensor_value_info("yt", f32, shape)])
    other = helper.make_graph([helper.make_node("Neg", ["q"], ["ye"])], "else", [],
                              [helper.make_tensor_value_info("ye", f32, shape)])
    graph = helper.make_graph(
        [helper.make_node("If", ["c"], ["y"], then_branch=then, else_branch=other)], "branch",
        [helper.make_tensor_value_info("c", TensorProto.BOOL, []),
         *(helper.make_tensor_value_info(n, f32, s) for n, s in
           (("q", shape), ("k", [1, 2, 4, 8]), ("v", [1, 2, 4, 8])))],
        [helper.make_tensor_value_info("y", f32, shape)])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 23)])
    model.ir_version = 10
    vm, _ = _build(_import(model)[0], fusion=False)
    feeds = attention_feeds(model)
    for cond in (True, False):
        _assert_matches_onnxruntime(vm, model, {**feeds, "c": np.array(cond)})


def test_com_microsoft_attention_keeps_tvms_converter_at_opset_23():
    from tests.transform.attention_models import contrib_attention

    model, feeds = contrib_attention(1, 6)
    model.opset_import[0].version = 23
    mod, info = _import(model)
    assert not any(note.startswith("onnx_attention") for note in info.notes)
    assert "R.nn.attention" in mod.script()
    vm, fusion = _build(mod)
    assert fusion.fused == 1
    _assert_matches_onnxruntime(vm, model, feeds)
