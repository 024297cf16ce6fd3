"""ChunkFeedForward: the BERT case's feed-forward block over row chunks, numerics vs
onnxruntime, the peak and size rules, and GPT-2's tanh GELU form."""

import importlib.util
from pathlib import Path

import numpy as np
import pytest
import tvm

from relax_memplan.analysis.lowered_peak import lowered_peak_live_bytes
from relax_memplan.frontend import import_onnx
from relax_memplan.pipeline import fusion_counts, fusion_passes, get_pipeline
from relax_memplan.runtime import run_and_measure
from relax_memplan.transform.annotate_dim_ranges import AnnotateDimRanges
from relax_memplan.transform.chunk_feed_forward import ChunkFeedForward

ort = pytest.importorskip("onnxruntime")

_ROOT = Path(__file__).resolve().parents[2]
_spec = importlib.util.spec_from_file_location("bert_case", _ROOT / "benchmarks" / "bert_case.py")
bert_case = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(bert_case)
_MODELS = _ROOT.parent / "shared" / "models"
_LLVM = tvm.target.Target("llvm")


def _passes(**chunk_args):
    """Our fusion passes with a configured ChunkFeedForward (test-sized thresholds: chunks of
    any row count unless ``min_chunk_rows`` is given)."""
    chunk_args.setdefault("min_chunk_rows", 1)
    return [p for p in fusion_passes(_LLVM) if p.info.name != "ChunkFeedForward"] + \
        [ChunkFeedForward(target=_LLVM, **chunk_args)]


def _chunk(mod, **chunk_args):
    """``mod`` after our fusion passes; the ChunkFeedForward instance."""
    passes = _passes(**chunk_args)
    return tvm.transform.Sequential(passes)(mod), passes[-1]


def _ops(mod, name):
    return mod["main"].script().count(name)


@pytest.mark.parametrize("dynamic, batch", [(True, 4), (True, 5), (False, 6)])
def test_chunked_bert_block_matches_onnxruntime_and_lowers_the_peak(dynamic, batch):
    """Dynamic: batch symbolic with bounds [4, 4] (split in 4 sections of 1 row) and [5, 5]
    (sections of 2, 2, 1, 0 rows: an empty chunk); static batch 6: strided slices of 1, 2, 1,
    2 rows."""
    model = bert_case.build_bert(64, 1, 2, 256)
    if dynamic:
        mod, _ = import_onnx(model, keep_dynamic=True)
        kwargs = dict(dim_ranges={"batch": (batch, batch), "seq": (1, 64)})
    else:
        mod, _ = import_onnx(model, {"hidden_states": (batch, 32, 64),
                                     "attention_mask": (batch, 1, 1, 32)})
        kwargs = {}
    ranged = AnnotateDimRanges(kwargs["dim_ranges"])(mod) if dynamic else mod
    chunked, chunker = _chunk(ranged, min_hidden_bytes=0)
    assert chunker.chunked == 1, chunker.skipped
    assert _ops(chunked, "R.split" if dynamic else "R.strided_slice") == (1 if dynamic else 4)
    assert _ops(chunked, "R.concat") == 1
    plain, _ = _chunk(ranged, min_hidden_bytes=1 << 40)
    assert lowered_peak_live_bytes(chunked, "main") < lowered_peak_live_bytes(plain, "main")

    passes = _passes(min_hidden_bytes=0)
    ex = tvm.compile(mod, _LLVM, relax_pipeline=get_pipeline(
        _LLVM, fusion=True, fusion_pass_list=passes, **kwargs))
    assert fusion_counts(passes)["feed_forward_chunked"] == 1
    sess = bert_case.ort_session(model)
    for seq in ((20, 64) if dynamic else (32,)):
        feed = bert_case.make_inputs(batch, seq, 64, seed=seq)
        ref = sess.run(None, feed)[0]
        out = run_and_measure(ex, [feed["hidden_states"], feed["attention_mask"]]).outputs[0]
        np.testing.assert_allclose(out, ref, rtol=1e-3, atol=1e-4, err_msg=f"seq {seq}")


def test_not_applied_when_the_peak_would_not_drop():
    """A narrow FFN (F = H / 2): the peak is in attention, chunking only adds tensors. The
    same site is chunked with the check off, so the check is what refuses it."""
    mod, _ = import_onnx(bert_case.build_bert(64, 1, 2, 32), {
        "hidden_states": (4, 32, 64), "attention_mask": (4, 1, 1, 32)})
    out, chunker = _chunk(mod, min_hidden_bytes=0)
    assert chunker.chunked == 0 and chunker.skipped == {"peak": 1}
    assert _ops(out, "R.concat") == 0
    _, unchecked = _chunk(mod, min_hidden_bytes=0, memory_check=False)
    assert unchecked.chunked == 1


def test_small_hidden_tensor_is_left_alone_by_default():
    """4 x 32 x 256 float32 = 128 KiB < 1 MiB: skipped as small, one count per block."""
    mod, _ = import_onnx(bert_case.build_bert(64, 1, 2, 256), {
        "hidden_states": (4, 32, 64), "attention_mask": (4, 1, 1, 32)})
    out, chunker = _chunk(mod)
    assert chunker.chunked == 0 and chunker.skipped == {"small": 1}
    # 4 x 256 x 256 x 4 B = 1 MiB: at the threshold, chunked
    mod, _ = import_onnx(bert_case.build_bert(64, 1, 2, 256), {
        "hidden_states": (4, 256, 64), "attention_mask": (4, 1, 1, 256)})
    _, chunker = _chunk(mod)
    assert chunker.chunked == 1, chunker.skipped


def test_a_symbolic_axis_without_a_lower_bound_of_two_is_not_cut():
    mod, _ = import_onnx(bert_case.build_bert(64, 1, 2, 256), keep_dynamic=True)
    mod = AnnotateDimRanges({"batch": (1, 4), "seq": (1, 64)})(mod)
    _, chunker = _chunk(mod, min_hidden_bytes=0)
    assert chunker.chunked == 0 and chunker.skipped == {"axis": 1}


def test_gpt2_tanh_gelu_blocks_are_chunked_with_the_same_values():
    """gpt2-tiny's FFN is the importer's tanh GELU (pow, tanh, multiply chain) after a 2-d
    reshape; at 2 x 16 tokens (at its 1-token import shape there is no axis to cut), chunk
    every block (check off) and compare with the unchunked build."""
    from relax_memplan.frontend.prepare import STEP_NAMES

    path = _MODELS / "gpt2-tiny-randw.onnx"
    if not path.exists():
        pytest.skip(f"{path} missing")
    mod, _ = import_onnx(str(path), {"input_ids": (2, 16)}, prepare_steps=STEP_NAMES)
    chunked, chunker = _chunk(mod, min_hidden_bytes=0, memory_check=False)
    assert chunker.chunked == 2 and _ops(chunked, "R.tanh") == 2 * 4, chunker.skipped  # seq 16 cut in 4
    passes = _passes(min_hidden_bytes=0, memory_check=False)
    ex = tvm.compile(mod, _LLVM, relax_pipeline=get_pipeline(_LLVM, fusion=True,
                                                              fusion_pass_list=passes))
    ref_ex = tvm.compile(mod, _LLVM, relax_pipeline=get_pipeline(_LLVM, fusion=False))
    rng = np.random.default_rng(0)
    args = []
    for p in mod["main"].params[:int(mod["main"].attrs["num_input"])]:
        shape = [int(d) for d in p.ty.shape.values]
        dtype = str(p.ty.dtype)
        args.append(rng.integers(0, 10, shape).astype(dtype) if "int" in dtype
                    else rng.standard_normal(shape).astype(dtype))
    out = run_and_measure(ex, args).outputs[0]
    ref = run_and_measure(ref_ex, args).outputs[0]
    np.testing.assert_allclose(out, ref, rtol=1e-4, atol=1e-5)


def test_negative_threshold_is_refused():
    with pytest.raises(ValueError, match="min_hidden_bytes"):
        ChunkFeedForward(min_hidden_bytes=-1)
    with pytest.raises(ValueError, match="min_chunk_rows"):
        ChunkFeedForward(min_chunk_rows=0)


@pytest.mark.parametrize("batch, seq, chunks", [(1, 128, 0), (1, 256, 2), (1, 512, 4),
                                                (2, 128, 2)])
def test_a_chunk_keeps_at_least_min_chunk_rows_rows_by_default(batch, seq, chunks):
    """BERT-base's FFN (768 -> 3072) at 1 x 128: four 32-row chunks made it slower than one
    matmul pair, so it is left whole (``rows``); 256 rows: 2 chunks of 128; 512 rows: the
    4 chunks F / H asks for; 2 x 128, cut along batch: 2 chunks of one sequence each."""
    mod, _ = import_onnx(bert_case.build_bert(768, 1, 12, 3072), {
        "hidden_states": (batch, seq, 768), "attention_mask": (batch, 1, 1, seq)})
    out, chunker = _chunk(mod, memory_check=False, min_chunk_rows=128)
    if chunks == 0:
        assert chunker.chunked == 0 and chunker.skipped == {"rows": 1}
        assert _ops(out, "R.concat") == 0
        assert "fewer than min_chunk_rows" in chunker.records[0].summary()
    else:
        assert chunker.chunked == 1, chunker.skipped
        assert _ops(out, "R.strided_slice") == chunks


def test_a_symbolic_axis_is_cut_only_when_its_shortest_length_fills_the_chunks():
    """seq in [256, 512]: at its lower bound 256 rows make 2 chunks of 128; seq in [64, 512]:
    a 64-row call would run 16-row chunks, so the block is left whole."""
    for lo, chunked in ((256, 1), (64, 0)):
        mod, _ = import_onnx(bert_case.build_bert(768, 1, 12, 3072), keep_dynamic=True)
        mod = AnnotateDimRanges({"batch": (1, 1), "seq": (lo, 512)})(mod)
        _, chunker = _chunk(mod, memory_check=False, min_chunk_rows=128)
        assert chunker.chunked == chunked, (lo, chunker.skipped)


def test_split_sections_are_lowered_until_none_can_be_empty():
    from relax_memplan.transform.chunk_feed_forward import _sections_never_empty

    assert _sections_never_empty(4, 8, 8) == 4          # 2, 2, 2, 2
    assert _sections_never_empty(4, 5, 5) == 3          # 4 would give 2, 2, 1, 0
    assert _sections_never_empty(4, 4, 9) == 2          # 4 fails at n = 5, 3 at n = 4 (2, 2, 0)
    assert _sections_never_empty(4, 2, None) == 1       # no upper bound: not checked


def _mlp(bias_shape):
    """x (8, 16) @ W1 (16, 64) + b1 ``bias_shape`` -> relu -> @ W2 (64, 16) + b2, + x."""
    from tvm import relax

    rng = np.random.default_rng(0)
    const = lambda *s: relax.const(rng.standard_normal(s).astype("float32"))  # noqa: E731
    x = relax.Var("x", relax.TensorType((8, 16), "float32"))
    bb = relax.BlockBuilder()
    with bb.function("main", [x]):
        with bb.dataflow():
            h = bb.emit(relax.op.add(bb.emit(relax.op.matmul(x, const(16, 64))),
                                     const(*bias_shape)))
            y = bb.emit(relax.op.matmul(bb.emit(relax.op.nn.relu(h)), const(64, 16)))
            z = bb.emit(relax.op.add(y, const(16)))
            out = bb.emit_output(relax.op.add(z, x))  # the residual
        bb.emit_func_output(out)
    return bb.get()


def test_a_bias_that_differs_between_rows_is_not_chunked():
    """b1 of shape (8, 64) gives each row its own bias: a chunk of x would meet all 8 rows."""
    _, chunker = _chunk(_mlp((64,)), min_hidden_bytes=0, memory_check=False)
    assert chunker.chunked == 1  # the 1-d bias: chunked (so the refusal below is the shape's)
    out, chunker = _chunk(_mlp((8, 64)), min_hidden_bytes=0, memory_check=False)
    assert chunker.chunked == 0 and _ops(out, "R.concat") == 0
