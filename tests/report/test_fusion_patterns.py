"""The fusion report's lines per pattern and the --explain-fusion listing."""

from relax_memplan.report.fusion_patterns import explain_lines, pattern_lines

PATTERNS = {
    "attention": {"verb": "fused", "candidates": 12, "fused": 0, "refused": [
        {"reason": "bias (1, 12, 1, 128) widens the scores (1, 1, 128, 128)",
         "bindings": ["lv40", "lv41"], "function": "main",
         "onnx_nodes": ["Softmax node 'l0/Softmax'"]}] * 12},
    "dropout": {"verb": "removed", "candidates": 0, "fused": 0, "refused": []},
}


def test_pattern_lines_say_what_was_there_and_why_it_did_not_fuse():
    assert pattern_lines(PATTERNS, off=["conv_chain"]) == [
        "    attention: 0 of 12 fused: 12 x bias (1, 12, 1, 128) widens the scores "
        "(1, 1, 128, 128)",
        "    dropout: none found",
        "    conv chains: off"]


def test_explain_lines_name_bindings_and_onnx_nodes():
    lines = explain_lines(PATTERNS)
    assert len(lines) == 12
    assert lines[0] == ("  attention refused in main: bias (1, 12, 1, 128) widens the scores "
                        "(1, 1, 128, 128) (bindings lv40, lv41; ONNX Softmax node 'l0/Softmax')")
    assert explain_lines({"dropout": PATTERNS["dropout"]}) == ["  no candidate was refused"]
