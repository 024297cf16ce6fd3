"""PatternRecord / RefusalLog: candidates = fused + refused, reasons counted, ONNX nodes named."""

from relax_memplan.transform.fusion_record import (PatternRecord, RefusalLog, onnx_nodes_of,
                                                   pattern_records)


def test_summary_counts_candidates_and_groups_reasons():
    record = PatternRecord("attention")
    assert record.summary() == "none found"
    record.accept(2)
    for _ in range(3):
        record.refuse("mask widens the scores", ["lv1"])
    record.refuse("scores have another reader (lv7)", ["lv7"])
    assert (record.candidates, record.fused) == (6, 2)
    assert record.summary() == ("2 of 6 fused: 3 x mask widens the scores; "
                                "1 x scores have another reader (lv7)")
    assert record.to_dict()["refused"][0] == {"reason": "mask widens the scores",
                                              "bindings": ["lv1"], "function": "",
                                              "onnx_nodes": []}


def test_refusal_log_turns_reason_codes_into_words():
    log = RefusalLog()
    log.refuse("peak", ["lv3"], function="main")
    log.refuse("small", n=2)
    record = log.record("feed_forward", 1, {"peak": "the peak would rise"}, verb="chunked")
    assert record.summary() == "1 of 4 chunked: 2 x small; 1 x the peak would rise"
    assert record.refused[0].bindings == ("lv3",) and record.refused[0].function == "main"


def test_onnx_nodes_are_read_from_the_import_record_only_for_recorded_bindings():
    from tvm import relax

    x = relax.Var("x", relax.TensorType((2,), "float32"))
    bb = relax.BlockBuilder()
    with bb.function("main", [x]):
        y = bb.emit(relax.op.nn.softmax(x))
        bb.emit_func_output(y)
    func = bb.get()["main"]
    assert onnx_nodes_of(func, [y.name]) == ()
    func = func.with_attr("relax_memplan.onnx_nodes", {y.name: {
        "op": "relax.nn.softmax", "onnx_op": "Softmax", "name": "attn/Softmax", "output": "p"}})
    assert onnx_nodes_of(func, [y.name, "other"]) == ("Softmax node 'attn/Softmax'",)


def test_pattern_records_collects_every_pass_that_keeps_one():
    from relax_memplan.pipeline import fusion_passes
    import tvm

    passes = fusion_passes(tvm.target.Target("llvm"))
    names = list(pattern_records(passes))
    assert names == ["matmul_reshape", "dropout", "attention", "layer_norm", "rms_norm",
                     "add_layer_norm", "add_rms_norm", "feed_forward", "conv_chain"]
    assert pattern_records(None) == {} and pattern_records([object()]) == {}
