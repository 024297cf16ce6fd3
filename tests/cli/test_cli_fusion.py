"""relax-memplan compile --fusion: both builds get our fusion, the report counts what fused."""

import json

from relax_memplan.cli import main
from tests.conftest import shared_model


def _compile_fused_and_verify(model, tmp_path, capsys):
    """(JSON report, text) of ``compile --fusion --verify`` at input_ids 1x16; asserts it passed."""
    report_path = tmp_path / "r.json"
    status = main(["compile", str(shared_model(model)), "-q", "--fusion",
                   "--verify", "--shape", "input_ids=1,16", "--time-limit", "0.2",
                   "--report", str(report_path)])
    text = capsys.readouterr().out
    assert status == 0
    report = json.loads(report_path.read_text())
    assert report["verified"] is True
    return report, text


def test_fusion_on_bert_tiny_verifies_and_reports_attention_fused(tmp_path, capsys):
    report, text = _compile_fused_and_verify("bert-tiny-randw.onnx", tmp_path, capsys)
    # bert-tiny: 2 layers, one attention block each
    # bert-tiny's residual adds sit in matmul epilogues (FuseOps): no add+layer norm rewrite
    fusion = report["fusion"]
    assert fusion["enabled"] is True
    assert fusion["fused"] == {"attention": 2, "dropout": 0, "layer_norm": 0, "rms_norm": 0,
                               "add_layer_norm": 0, "add_rms_norm": 0,
                               "matmul_reshape": 0, "feed_forward_chunked": 0,
                               "conv_chain": 0, "conv_chain_refused": 0,
                               "conv_chain_candidates": 0}
    # per attention block 7 kernels (3 of them transposes) become 1
    assert fusion["kernels_tvm"] - fusion["kernels_ours"] == 2 * 6
    assert fusion["intermediate_bytes_removed"] > 0
    assert fusion["lower_bound_bytes_ours"] <= fusion["lower_bound_bytes_tvm"]
    assert fusion["ort_nodes"] > 0
    assert f"kernels per call: {fusion['kernels_ours']} (TVM FuseOps alone " in text
    assert "    attention: 2 of 2 fused\n" in text
    assert fusion["patterns"]["attention"] == {"verb": "fused", "candidates": 2, "fused": 2,
                                               "refused": []}
    # bert-tiny's residual adds (post-LN) sit in their matmul's epilogue: 5 refused, each named
    norm = fusion["patterns"]["add_layer_norm"]
    assert (norm["candidates"], norm["fused"]) == (5, 0)
    assert {r["reason"] for r in norm["refused"]} == {
        "left to FuseOps: the add fuses into the kernel producing an operand"}
    assert all(r["bindings"] and r["function"] == "main" for r in norm["refused"])
    assert "    add+layer norm: 0 of 5 fused: 5 x left to FuseOps" in text
    assert report["arena_bytes"] <= report["tvm_default_bytes"]


def test_fusion_on_the_example_fuses_its_conv_chains_and_says_so(tmp_path, capsys):
    # the example's three expand 1x1 conv + ReLU -> 3x3 stride-2 depthwise pairs become one
    # kernel each (FuseConvChain): 3 kernels fewer, lower bound 737,280 -> 497,664 B
    report_path = tmp_path / "r.json"
    assert main(["compile", "-q", "--fusion", "--time-limit", "0.2",
                 "--report", str(report_path)]) == 0
    text = capsys.readouterr().out
    fusion = json.loads(report_path.read_text())["fusion"]
    assert fusion["fused"] == {"attention": 0, "dropout": 0, "layer_norm": 0, "rms_norm": 0,
                               "add_layer_norm": 0, "add_rms_norm": 0,
                               "matmul_reshape": 0, "feed_forward_chunked": 0,
                               "conv_chain": 3, "conv_chain_refused": 0,
                               "conv_chain_candidates": 4}
    assert fusion["kernels_ours"] == fusion["kernels_tvm"] - 3 and fusion["ort_nodes"] > 0
    assert (fusion["lower_bound_bytes_tvm"], fusion["lower_bound_bytes_ours"]) == \
        (737280, 497664)
    # both bounds with the build's planner settings: the fused one is the report's bound
    report = json.loads(report_path.read_text())
    assert fusion["lower_bound_bytes_ours"] == report["lower_bound_bytes"]
    assert fusion["planner_settings"] == "in-place, concat in place, reordering"
    assert fusion["skipped"] == {"skipped: input not made by a conv": 1}  # the stem
    assert fusion["conv_chain_scratch_bytes"] > 0
    assert "    attention: none found\n" in text
    assert "    conv chains: 3 of 4 fused: 1 x input not made by a conv\n" in text
    chain = fusion["patterns"]["conv_chain"]
    assert (chain["candidates"], chain["fused"], len(chain["refused"])) == (4, 3, 1)
    assert "per running thread (TVM workspace, not in the lower bound)" in text


def _small_model(tmp_path) -> str:
    """y = tanh(x @ w), x [2, 4]: for tests where the model is incidental (the fusion flag is
    checked, not what fused); seconds to build, where the example CNN takes tens."""
    import numpy as np
    import onnx
    from onnx import TensorProto, helper

    w = helper.make_tensor("w", TensorProto.FLOAT, [4, 3],
                           np.random.default_rng(0).standard_normal(12).tolist())
    graph = helper.make_graph(
        [helper.make_node("MatMul", ["x", "w"], ["h"]), helper.make_node("Tanh", ["h"], ["y"])],
        "mm", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [2, 4])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [2, 3])], [w])
    path = tmp_path / "mm.onnx"
    onnx.save(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 13)]), path)
    return str(path)


def test_config_fusion_is_honoured_and_no_fusion_overrides_it(tmp_path, capsys):
    config = tmp_path / "c.yaml"
    config.write_text("fusion: true\n")
    model = _small_model(tmp_path)
    for extra, enabled in (([], True), (["--no-fusion"], False)):
        report_path = tmp_path / "r.json"
        assert main(["compile", model, "-q", "--no-measure", "--config", str(config),
                     "--time-limit", "0.2", "--report", str(report_path)] + extra) == 0
        assert json.loads(report_path.read_text())["fusion"]["enabled"] is enabled
    assert "fusion: off" in capsys.readouterr().out


def test_fusion_is_on_by_default_in_config_options_and_cli(tmp_path):
    from relax_memplan.compile import BuildOptions
    from relax_memplan.config import load_config

    assert load_config(None).fusion is True and BuildOptions().fusion is True
    from relax_memplan.pipeline import PipelineOptions

    assert PipelineOptions().fusion is True
    report_path = tmp_path / "r.json"
    assert main(["compile", _small_model(tmp_path), "-q", "--no-measure", "--time-limit", "0.2",
                 "--report", str(report_path)]) == 0
    assert json.loads(report_path.read_text())["fusion"]["enabled"] is True

def test_fusion_on_gpt2_tiny_fuses_add_layer_norm_and_verifies(tmp_path, capsys):
    # gpt2-tiny (pre-LN): the residual add follows a reshape of the matmul, which FuseOps does not
    # fuse through; the sum is also the next residual, so the kernel writes it as a 2nd output.
    # FoldMatmulReshape takes the 6 matmuls out of their reshape sandwiches first, so 2 residual
    # adds join their matmul's epilogue (FuseOps) and 1 pair would raise the peak live bytes
    # (4 tensors live at the fused step): 2 of the 5 pairs fused
    report, text = _compile_fused_and_verify("gpt2-tiny-randw.onnx", tmp_path, capsys)
    assert report["fusion"]["fused"] == {"attention": 2, "dropout": 0, "layer_norm": 0, "rms_norm": 0,
                                         "add_layer_norm": 2, "add_rms_norm": 0,
                                        "matmul_reshape": 6, "feed_forward_chunked": 0,
                                        "conv_chain": 0, "conv_chain_refused": 0,
                                        "conv_chain_candidates": 0}
    assert "    add+layer norm: 2 of 5 fused: 2 x left to FuseOps" in text
    assert "1 x the function's peak live bytes would rise" in text
    assert report["lower_bound_bytes"] <= report["tvm_default_bytes"]


def test_fusion_on_gpt2_tiny_with_symbolic_dims_and_buckets_verifies(tmp_path):
    # gpt2-tiny's dims (s27: batch, s77: seq) symbolic; a bucket at the top of the seq range;
    # checked against onnxruntime at the ends and in the middle of the ranges
    report_path = tmp_path / "r.json"
    assert main(["compile", str(shared_model("gpt2-tiny-randw.onnx")), "-q", "--fusion",
                 "--verify", "--dim", "s27=1..2", "--dim", "s77=1..32", "--dispatch", "s77=32",
                 "--time-limit", "0.2", "--report", str(report_path)]) == 0
    report = json.loads(report_path.read_text())
    assert report["verified"] is True
    assert report["fusion"]["fused"]["attention"] == 2
    # with the attention scores gone, the symbolic plan's peak sits where 2 of the residual
    # pairs would raise it: each of the 5 pairs fused or refused with its reason
    norm = report["fusion"]["patterns"]["add_layer_norm"]
    assert norm["candidates"] == 5 and norm["fused"] + len(norm["refused"]) == 5
    assert "the function's peak live bytes would rise" in {r["reason"] for r in norm["refused"]}
    assert {(s["dims"]["s27"], s["dims"]["s77"]) for s in report["shapes"]} >= {(1, 1), (2, 32)}


def test_explain_fusion_lists_each_refused_candidate(tmp_path, capsys):
    # bert-tiny: the 5 residual add + layer norm pairs are left to FuseOps, each listed with
    # its bindings; its 2 attention blocks fuse and are not listed
    assert main(["compile", str(shared_model("bert-tiny-randw.onnx")), "-q", "--no-measure",
                 "--no-compare", "--shape", "input_ids=1,16", "--time-limit", "0.2",
                 "--explain-fusion"]) == 0
    out = capsys.readouterr().out
    listing = out[out.index("fusion candidates refused:"):].splitlines()[1:]
    refused = [line for line in listing if " refused in main: " in line]
    assert len(refused) == 5 and all(line.startswith("  add+layer norm refused in main: left "
                                                     "to FuseOps") for line in refused)
    assert all("(bindings lv" in line for line in refused)
    assert "attention refused" not in out
