"""ShareTransposedWeights: a tied embedding read transposed by the output projection stays one
tensor (GPT-2's wte), with the same outputs; a weight only transposed, or a constant that is
not exactly the transpose, is left alone."""

import numpy as np
import tvm
from tvm import relax

from relax_memplan.analysis.resident import constant_tensors
from relax_memplan.pipeline import get_pipeline
from relax_memplan.transform.share_transposed_weights import ShareTransposedWeights

VOCAB, HIDDEN = 96, 16


def _tied(w: np.ndarray, projection: np.ndarray, gemm_form: bool = False) -> tvm.IRModule:
    """main(ids) = tanh(take(w, ids)) @ P, P = ``projection`` as a constant, or with
    ``gemm_form`` permute_dims(w) (a Gemm with transB)."""
    bb = relax.BlockBuilder()
    ids = relax.Var("ids", relax.TensorType((2, 8), "int64"))
    table = relax.const(w)
    with bb.function("main", [ids]):
        with bb.dataflow():
            h = bb.emit(relax.op.tanh(relax.op.take(table, ids, axis=0)))
            b = bb.emit(relax.op.permute_dims(table)) if gemm_form else relax.const(projection)
            out = bb.emit_output(bb.emit(relax.op.matmul(h, b)))
        bb.emit_func_output(out)
    return bb.get()


def _weights():
    rng = np.random.default_rng(0)
    return rng.standard_normal((VOCAB, HIDDEN)).astype("float32"), rng.integers(0, VOCAB, (2, 8))


def _run(mod, ids):
    ex = tvm.compile(mod, "llvm", relax_pipeline=get_pipeline("llvm"))
    return relax.VirtualMachine(ex, tvm.cpu())["main"](tvm.runtime.tensor(ids)).numpy()


def test_folded_transpose_of_a_gathered_weight_is_read_from_the_weight():
    w, ids = _weights()
    mod = _tied(w, np.ascontiguousarray(w.T))
    assert constant_tensors(mod)[0] == 2
    shared = ShareTransposedWeights()
    after = shared(mod)
    assert shared.shared == 1
    assert constant_tensors(after) == (1, w.nbytes)
    assert "matmul_nt" in [gv.name_hint for gv in after.get_global_vars()]
    np.testing.assert_allclose(_run(mod, ids), np.tanh(w[ids]) @ w.T, rtol=1e-5, atol=1e-5)
    np.testing.assert_allclose(_run(after, ids), np.tanh(w[ids]) @ w.T, rtol=1e-5, atol=1e-5)


def test_gemm_with_trans_b_on_a_gathered_weight_is_read_from_the_weight():
    w, ids = _weights()
    shared = ShareTransposedWeights()
    after = shared(_tied(w, None, gemm_form=True))
    assert shared.shared == 1 and constant_tensors(after) == (1, w.nbytes)
    np.testing.assert_allclose(_run(after, ids), np.tanh(w[ids]) @ w.T, rtol=1e-5, atol=1e-5)


def test_a_constant_that_is_not_exactly_the_transpose_is_left_alone():
    w, _ = _weights()
    projection = np.ascontiguousarray(w.T)
    projection[HIDDEN - 1, VOCAB - 1] += 1e-3  # one element differs
    shared = ShareTransposedWeights()
    after = shared(_tied(w, projection))
    assert shared.shared == 0 and constant_tensors(after)[0] == 2


def test_the_pipeline_stores_a_tied_embedding_once():
    """Through the whole pipeline (FoldConstant included): one tensor, not the weight twice."""
    w, ids = _weights()
    from relax_memplan.transform.record_resident_bytes import RecordResidentBytes

    resident = RecordResidentBytes()
    tvm.compile(_tied(w, None, gemm_form=True), "llvm",
                relax_pipeline=tvm.transform.Sequential([get_pipeline("llvm"), resident]))
    assert resident.resident.constants_bytes == w.nbytes


def test_a_weight_only_read_transposed_is_left_to_folding():
    w, _ = _weights()
    bb = relax.BlockBuilder()
    x = relax.Var("x", relax.TensorType((2, HIDDEN), "float32"))
    with bb.function("main", [x]):
        with bb.dataflow():
            out = bb.emit_output(bb.emit(relax.op.matmul(x, relax.op.permute_dims(
                relax.const(w)))))
        bb.emit_func_output(out)
    shared = ShareTransposedWeights()
    shared(bb.get())
    assert shared.shared == 0
