"""FuseAttention refuses what it cannot fuse, says why, and leaves the function as it was."""

import numpy as np
import pytest
import tvm
from tvm import relax, tirx

from relax_memplan.transform.fuse_attention import FuseAttention

T32 = "float32"


def _const(value, dtype=T32):
    return relax.const(np.asarray(value, dtype=dtype), dtype)


def _module(shapes, build, dtype=T32):
    """``main(q, k, v)`` (shapes given; ``k`` as the scores matmul's second operand) whose
    body ``build(bb, q, k, v)`` emits and returns the output expr (a var or a tuple)."""
    bb = relax.BlockBuilder()
    params = [relax.Var(n, relax.TensorType(s, dtype)) for n, s in zip("qkv", shapes)]
    with bb.function("main", params):
        with bb.dataflow():
            out = bb.emit_output(build(bb, *params))
        bb.emit_func_output(out)
    return bb.get()


def _attention(scores=lambda bb, s: s, probs=lambda bb, p: p, axis=-1, extra=None):
    """matmul -> ``scores`` -> softmax -> ``probs`` -> matmul, ``extra(bb, vars)`` adding
    outputs."""
    def build(bb, q, k, v):
        seen = {}
        seen["s"] = bb.emit(relax.op.matmul(q, k))
        seen["x"] = scores(bb, seen["s"])
        seen["p"] = bb.emit(relax.op.nn.softmax(seen["x"], axis=axis))
        seen["y"] = probs(bb, seen["p"])
        seen["o"] = bb.emit(relax.op.matmul(seen["y"], v))
        return relax.Tuple([seen["o"]] + extra(seen)) if extra else seen["o"]
    return build


STATIC = [(1, 2, 8, 16), (1, 2, 16, 8), (1, 2, 8, 16)]


def _refusal(mod):
    pass_ = FuseAttention()
    after = pass_(mod)
    record = pass_.records[0]
    assert pass_.fused == 0 and record.candidates == 1, record
    assert after.same_as(mod)  # left exactly as it was
    (refusal,) = record.refused
    assert refusal.bindings and refusal.function == "main"
    return refusal.reason


def _emit(op):
    return lambda bb, x: bb.emit(op(x))


N = tirx.Var("n", "int64")
CASES = {
    "scores have another reader": (STATIC, _attention(extra=lambda s: [s["s"]])),
    "probabilities have another reader": (STATIC, _attention(
        probs=lambda bb, p: bb.emit(relax.op.astype(p, T32)), extra=lambda s: [s["p"]])),
    "softmax over axis 2, not the last (keys)": (
        [(1, 2, 8, 16), (1, 2, 16, 8), (1, 2, 8, 16)], _attention(axis=2)),
    "relax.exp between the scores and the softmax": (STATIC, _attention(scores=_emit(relax.op.exp))),
    "relax.multiply between the softmax and the matmul": (STATIC, _attention(
        probs=_emit(lambda p: relax.op.multiply(p, _const(2.0))))),
    "more than 3 bindings between the softmax and the matmul": (STATIC, _attention(
        probs=lambda bb, p: [p := bb.emit(relax.op.astype(p, T32)) for _ in range(4)][-1])),
    "more than 24 bindings between the scores and the softmax": (STATIC, _attention(
        scores=lambda bb, s: [s := bb.emit(relax.op.add(s, _const(0.5))) for _ in range(26)][-1])),
    "bias (2, 2, 8, 8) widens the scores (1, 2, 8, 8)": (STATIC, _attention(
        scores=_emit(lambda s: relax.op.add(s, _const(np.zeros((2, 2, 8, 8))))))),
    "relax.reshape between the softmax and the matmul": (STATIC, _attention(
        probs=_emit(lambda p: relax.op.reshape(p, (1, 2, 8, 8))))),
    "a reshape of the scores moves the key axis": (STATIC, _attention(
        scores=lambda bb, s: bb.emit(relax.op.reshape(bb.emit(relax.op.add(bb.emit(
            relax.op.reshape(s, (1, 2, 4, 16))), _const(1.0))), (1, 2, 8, 8))))),
    "head dim n is symbolic": ([(1, 2, 8, N), (1, 2, N, 8), (1, 2, 8, 16)], _attention()),
    "values (3, 2, 8, 16) widen the scores' batch dims (1, 2)": (
        [(1, 2, 8, 16), (1, 2, 16, 8), (3, 2, 8, 16)], _attention()),
    "scale 0.0 is not a finite non-zero number": (STATIC, _attention(
        scores=_emit(lambda s: relax.op.multiply(s, _const(0.0))))),
    "kernel declined: head dim 512 above 256": (
        [(1, 2, 8, 512), (1, 2, 512, 8), (1, 2, 8, 16)], _attention()),
}


@pytest.mark.parametrize("reason", list(CASES))
def test_each_refusal_reason(reason):
    shapes, build = CASES[reason]
    got = _refusal(_module(shapes, build))
    assert got.startswith(reason), got


def test_float64_operands_are_refused():
    assert _refusal(_module(STATIC, _attention(), dtype="float64")) == \
        "float64 operands (float32/float16 only)"


def test_scores_from_a_parameter_are_refused():
    def build(bb, q, k, v):
        return bb.emit(relax.op.matmul(bb.emit(relax.op.nn.softmax(q)), v))
    assert _refusal(_module([(1, 2, 8, 8), (1, 2, 16, 8), (1, 2, 8, 16)], build)) == \
        "scores are not computed in this function"


def test_refused_block_builds_to_the_same_numbers_as_without_fusion():
    # the fallback is the unfused graph itself: bit-identical outputs
    from relax_memplan.pipeline import get_pipeline

    mod = _module(STATIC, _attention(extra=lambda s: [s["s"]]))
    rng = np.random.default_rng(0)
    args = [tvm.runtime.tensor(rng.standard_normal(s).astype(T32)) for s in STATIC]
    outs = []
    for fusion in (False, True):
        ex = tvm.compile(mod, "llvm", relax_pipeline=get_pipeline("llvm", fusion=fusion))
        got = relax.VirtualMachine(ex, tvm.cpu())["main"](*args)
        outs.append([x.numpy() for x in got])
    for a, b in zip(*outs):
        np.testing.assert_array_equal(a, b)


def test_a_softmax_that_feeds_no_matmul_is_no_candidate():
    def build(bb, q, k, v):
        return bb.emit(relax.op.nn.softmax(bb.emit(relax.op.matmul(q, k))))
    pass_ = FuseAttention()
    pass_(_module(STATIC, build))
    assert pass_.records[0].candidates == 0
    assert pass_.records[0].summary() == "none found"


def _unknown(dtype=T32, ndim=4):
    return relax.TensorType(dtype=dtype, ndim=ndim)


def _params_module(params, build):
    bb = relax.BlockBuilder()
    with bb.function("main", params):
        with bb.dataflow():
            out = bb.emit_output(build(bb, *params))
        bb.emit_func_output(out)
    return bb.get()


def test_probabilities_returned_by_the_function_are_refused():
    # outside a dataflow block the softmax's result may be the function's own output
    bb = relax.BlockBuilder()
    q, k, v = (relax.Var(n, relax.TensorType(s, T32)) for n, s in zip("qkv", STATIC))
    with bb.function("main", [q, k, v]):
        p = bb.emit(relax.op.nn.softmax(bb.emit(relax.op.matmul(q, k))))
        o = bb.emit(relax.op.matmul(p, v))
        bb.emit_func_output(relax.Tuple([o, p]))
    assert _refusal(bb.get()) == "probabilities are also a function output"


def test_scores_of_unknown_shape_are_refused():
    params = [relax.Var(n, _unknown()) for n in "qkv"]
    assert _refusal(_params_module(params, _attention())) == "scores of unknown shape"


def test_rank_one_values_are_refused():
    assert _refusal(_module([(8, 16), (16, 8), (8,)], _attention())).startswith(
        "q, k or v of rank below 2")


def test_keys_whose_head_dim_is_not_the_queries_are_refused():
    shapes = [(1, 2, 8, 16), (1, 2, N, 8), (1, 2, 8, 16)]
    assert _refusal(_module(shapes, _attention())) == "key and value lengths or head dims differ"


def test_scores_made_of_constants_are_refused():
    def build(bb, q, k, v):
        c = bb.emit(relax.op.where(_const(np.ones((1, 2, 8, 8), bool), "bool"),
                                   _const(np.zeros((1, 2, 8, 8))), _const(np.ones((1, 2, 8, 8)))))
        return bb.emit(relax.op.matmul(bb.emit(relax.op.nn.softmax(c)), v))
    assert _refusal(_module(STATIC, build)) == "scores are not a matmul"


def test_a_bias_the_kernel_cannot_read_is_refused():
    def scores(bb, s):
        wide = bb.emit(relax.op.astype(s, "float64"))
        biased = bb.emit(relax.op.add(wide, _const(np.zeros((1, 1, 1, 8)), "float64")))
        return bb.emit(relax.op.astype(biased, T32))
    assert _refusal(_module(STATIC, _attention(scores=scores))) == (
        "bias (1, 1, 1, 8) float64 is not a float or bool tensor broadcast over the scores "
        "(1, 2, 8, 8)")


def _nn_attention(shapes, causal=None, bias=None):
    params = [relax.Var(n, s if isinstance(s, relax.TensorType) else relax.TensorType(s, T32))
              for n, s in zip("qkv", shapes)]
    if bias is not None:
        params.append(relax.Var("bias", bias))

    def build(bb, q, k, v, *b):
        op = relax.op.nn.attention(q, k, v, b[0] if b else None, causal_mask=causal)
        return bb.emit(op)
    return _params_module(params, build)


BSNH = [(1, 8, 2, 16)] * 3


@pytest.mark.parametrize("case, reason", [
    ("causal", "nn.attention with a causal mask or window"),
    ("symbolic", "head dim n is symbolic"),
])
def test_nn_attention_refusals(case, reason):
    mod = {"causal": lambda: _nn_attention(BSNH, causal="TopLeft"),
           "symbolic": lambda: _nn_attention([(1, 8, 2, N)] * 3)}[case]()
    assert _refusal(mod) == reason
