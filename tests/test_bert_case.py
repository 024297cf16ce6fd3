"""benchmarks/bert_case.py: rows 1 (static, padded) and 4 (exact arena + specialization) match
onnxruntime on a 1-layer quick-sized encoder, at a bucket seq and a non-bucket seq."""

import importlib.util
from pathlib import Path

import numpy as np
import pytest

pytest.importorskip("onnxruntime")

_PATH = Path(__file__).resolve().parents[1] / "benchmarks" / "bert_case.py"
_spec = importlib.util.spec_from_file_location("bert_case", _PATH)
bert_case = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(bert_case)


def test_static_and_exact_rows_match_onnxruntime():
    import tvm
    from relax_memplan.runtime import run_and_measure

    cfg = dict(hidden=128, layers=1, heads=2, ffn=512, batch=2)
    model = bert_case.build_bert(cfg["hidden"], cfg["layers"], cfg["heads"], cfg["ffn"])
    rows = bert_case.compile_rows(model, cfg, tvm.target.Target("llvm"),
                                  keys=("static_pad128", "exact_spec"))
    assert [r["key"] for r in rows] == ["static_pad128", "exact_spec"]
    assert rows[1]["specialized_kernels"] > 0
    sess = bert_case.ort_session(model)
    for seq in (20, 64):
        feed = bert_case.make_inputs(cfg["batch"], seq, cfg["hidden"], seed=seq)
        ref = sess.run(None, feed)[0]
        for row in rows:
            out = run_and_measure(row["ex"], bert_case.row_inputs(row, feed)).outputs[0]
            np.testing.assert_allclose(out[:, :seq], ref, rtol=1e-3, atol=1e-4,
                                       err_msg=f"{row['label']} at seq {seq}")


def test_check_cost_row_has_no_check_kernels_and_same_output():
    """--embeddings --check-cost: row 4 runs the word and token-type checks, row 4b none."""
    import tvm
    from tvm import relax
    from relax_memplan.runtime import run_and_measure

    cfg = dict(hidden=64, layers=1, heads=1, ffn=256, batch=2)
    model = bert_case.build_bert(cfg["hidden"], cfg["layers"], cfg["heads"], cfg["ffn"],
                                 embeddings=True)
    rows = bert_case.compile_rows(model, cfg, tvm.target.Target("llvm"), keys=("exact_spec",),
                                  check_cost=True)
    assert [r["key"] for r in rows] == ["exact_spec", "exact_nocheck"]
    feed = bert_case.make_inputs(cfg["batch"], 20, cfg["hidden"], seed=0, embeddings=True)
    ref = bert_case.ort_session(model).run(None, feed)[0]
    calls = []
    for row in rows:
        args = bert_case.row_inputs(row, feed)
        out = run_and_measure(row["ex"], args).outputs[0]
        np.testing.assert_allclose(out, ref, rtol=1e-3, atol=1e-4, err_msg=row["label"])
        vm = relax.VirtualMachine(row["ex"], tvm.cpu())
        calls.append(bert_case.check_kernel_time(vm, [tvm.runtime.tensor(a) for a in args], 1)["calls"])
    assert calls == [2, 0]


def test_row5_fused_attention_matches_onnxruntime_and_lowers_the_peak_at_long_seq():
    """Row 5 (row 4 + our fusion) over seq in [1, 256]: numerics at a bucket and a non-bucket
    seq, and its exact plan's lower bound below row 4's where the scores dominate."""
    import tvm
    from relax_memplan.runtime import run_and_measure

    cfg = dict(hidden=64, layers=1, heads=4, ffn=128, batch=1, max_seq=256)
    model = bert_case.build_bert(cfg["hidden"], cfg["layers"], cfg["heads"], cfg["ffn"])
    rows = bert_case.compile_rows(model, cfg, tvm.target.Target("llvm"),
                                  keys=("exact_spec", "exact_spec_fused"))
    assert [r["key"] for r in rows] == ["exact_spec", "exact_spec_fused"]
    sess = bert_case.ort_session(model)
    for seq in (37, 128):
        feed = bert_case.make_inputs(cfg["batch"], seq, cfg["hidden"], seed=seq)
        ref = sess.run(None, feed)[0]
        out = run_and_measure(rows[1]["ex"], bert_case.row_inputs(rows[1], feed)).outputs[0]
        np.testing.assert_allclose(out, ref, rtol=1e-3, atol=1e-4, err_msg=f"seq {seq}")
    dims = {"batch": 1, "seq": 256}
    _, lower4, _ = rows[0]["exact_plan"].bytes_at(dims)
    _, lower5, _ = rows[1]["exact_plan"].bytes_at(dims)
    # 4 heads x 256 x 256 floats of scores (1 MiB) against an FFN of 256 x 128: fusion wins
    assert lower5 < 0.5 * lower4


def test_inplace_rows_report_exact_arena_before_and_after():
    """Row 4n (exact + in-place, no specialization) matches onnxruntime and writes the FFN's
    residual add over its input: a smaller exact arena than row 4 at the same seq; row 4i
    (specialized kernels, which the kernel table refuses) keeps row 4's arena."""
    import tvm
    from relax_memplan.runtime import run_and_measure

    cfg = dict(hidden=64, layers=1, heads=1, ffn=256, batch=2)
    model = bert_case.build_bert(cfg["hidden"], cfg["layers"], cfg["heads"], cfg["ffn"])
    rows = bert_case.compile_rows(model, cfg, tvm.target.Target("llvm"),
                                  keys=("exact_spec", "exact_spec_inplace",
                                        "exact_inplace_nospec"))
    feed = bert_case.make_inputs(cfg["batch"], 20, cfg["hidden"], seed=0)
    ref = bert_case.ort_session(model).run(None, feed)[0]
    for row in rows:
        out = run_and_measure(row["ex"], bert_case.row_inputs(row, feed)).outputs[0]
        np.testing.assert_allclose(out, ref, rtol=1e-3, atol=1e-4, err_msg=row["label"])
    plans = {r["key"]: r["exact_plan"] for r in rows}
    got = bert_case.inplace_bytes(plans, cfg["batch"], [20, 128])
    spec, nospec = got["exact_spec_inplace"], got["exact_inplace_nospec"]
    assert all(spec[s]["inplace_calls"] == 0 and spec[s]["arena_after_over_before"] == 1.0
               for s in (20, 128))
    for s in (20, 128):
        assert nospec[s]["inplace_calls"] == 1
        assert nospec[s]["lower_bound_without_inplace_bytes"] == nospec[s]["lower_bound_before_bytes"]
        assert nospec[s]["arena_after_bytes"] <= nospec[s]["arena_before_bytes"]
    assert any(nospec[s]["arena_after_bytes"] < nospec[s]["arena_before_bytes"] for s in (20, 128))
