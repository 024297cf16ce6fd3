"""FuseAttention on each form exporters write: every block fused, outputs as onnxruntime's."""

import numpy as np
import pytest
import tvm
from tvm import relax

from relax_memplan.frontend import import_onnx, run_onnxruntime
from relax_memplan.pipeline import get_pipeline
from relax_memplan.transform.fuse_attention import FuseAttention
from tests.transform import attention_models as forms


def _run(model, feeds, dims=None, expect=1, schedule=False):
    """(ours, onnxruntime's) output of ``model`` built with FuseAttention alone; asserts that
    ``expect`` blocks were fused."""
    shapes = None if dims else {n: v.shape for n, v in feeds.items()}
    mod, _ = import_onnx(model, shapes, keep_dynamic=bool(dims))
    fusion = [FuseAttention()]
    target = "llvm"
    if schedule:
        from relax_memplan.schedules import host_target
        target = host_target()
    ex = tvm.compile(mod, target, relax_pipeline=get_pipeline(
        target, fusion=True, fusion_pass_list=fusion, dim_ranges=dims, schedule=schedule))
    record = fusion[0].records[0]
    assert fusion[0].fused == expect, record.refused
    assert record.candidates == expect
    vm = relax.VirtualMachine(ex, tvm.cpu())
    got = vm["main"](*[tvm.runtime.tensor(v) for v in feeds.values()])
    got = (got[0] if isinstance(got, tvm.ir.Array) else got).numpy()
    return got, run_onnxruntime(model, feeds)[0]


def _close(got, expected, rel=2e-5):
    assert got.shape == expected.shape
    np.testing.assert_array_equal(np.isnan(got), np.isnan(expected))
    finite = ~np.isnan(expected)
    err = np.abs(got[finite] - expected[finite]).max() / max(np.abs(expected[finite]).max(), 1e-6)
    assert err <= rel, err


@pytest.mark.parametrize("batch, seq", [(1, 1), (2, 7), (1, 45)])
def test_sdpa_decomposition_with_a_padding_mask_and_the_isnan_guard(batch, seq):
    _close(*_run(*forms.bert_sdpa(batch, seq)))


def test_sdpa_decomposition_at_symbolic_batch_and_seq():
    model, _ = forms.bert_sdpa(1, 1, dynamic=True)
    for batch, seq in [(1, 1), (2, 9), (1, 40)]:
        _, feeds = forms.bert_sdpa(batch, seq)
        _close(*_run(model, feeds, dims={"batch": (1, 2), "seq": (1, 64)}))


def test_fused_qkv_split_with_a_causal_where_mask():
    _close(*_run(*forms.gpt2_causal(2, 37)))


def test_sequence_first_in_projection_gathered_into_q_k_v():
    _close(*_run(*forms.vit_in_proj(2, 17)))


@pytest.mark.parametrize("seq", [1, 5, 33])
def test_grouped_query_heads_repeated_by_expand(seq):
    _close(*_run(*forms.llama_gqa(1, seq)))


def test_grouped_query_at_symbolic_seq():
    model, _ = forms.llama_gqa(1, 1, dynamic=True)
    for seq in (1, 20):
        _, feeds = forms.llama_gqa(1, seq)
        _close(*_run(model, feeds, dims={"batch": (1, 1), "seq": (1, 64)}))


@pytest.mark.parametrize("seq", [1, 6])
def test_cross_attention_with_more_keys_than_queries(seq):
    _close(*_run(*forms.cross_attention(2, seq)))


def test_relative_position_bias_plus_padding_mask():
    _close(*_run(*forms.t5_relative_bias(2, 12)))


def test_window_attention_with_bias_and_shifted_mask_between_reshapes():
    _close(*_run(*forms.swin_windows(2)))


@pytest.mark.parametrize("guard", [True, False])
def test_boolean_mask_with_a_query_that_sees_no_key(guard):
    got, expected = _run(*forms.boolean_mask(2, 10, guard=guard))
    assert np.isnan(expected).any() != guard  # the row of NaN, or of 0 with the guard
    _close(got, expected)


@pytest.mark.parametrize("dim", [32, 80, 128])
def test_head_dims_with_our_cpu_schedules(dim):
    _close(*_run(*forms.bert_sdpa(1, 21, heads=2, dim=dim), schedule=True))


def test_stacked_blocks_read_each_others_output_through_views():
    # the second block's q is the first block's output: read from the first kernel's result,
    # never through the views the first kernel replaces
    g = forms.Graph(9)
    x = g.input("x", [1, 12, 32])
    h = x
    for _ in range(2):
        q, k, v = (g.op("Transpose", g.reshape(g.op("MatMul", h, g.weight(32, 32)),
                                               [1, 12, 2, 16]), perm=[0, 2, 1, 3])
                   for _ in range(3))
        s = g.op("MatMul", q, g.op("Transpose", k, perm=[0, 1, 3, 2]))
        o = g.op("MatMul", g.op("Softmax", s, axis=-1), v)
        h = g.reshape(g.op("Transpose", o, perm=[0, 2, 1, 3]), [1, 12, 32])
    feeds = {"x": np.random.default_rng(0).standard_normal((1, 12, 32)).astype("float32")}
    _close(*_run(g.model([h]), feeds, expect=2))


@pytest.mark.parametrize("seq", [5, 40])
def test_softcapped_scores_tanh_between_scale_and_mask(seq):
    """Gemma's softcap ``tanh(s / c) * c`` before an additive causal mask."""
    g = forms.Graph(10)
    x = g.input("x", [1, seq, 32])
    q, k, v = (g.op("Transpose", g.reshape(g.op("MatMul", x, g.weight(32, 32)), [1, seq, 2, 16]),
                    perm=[0, 2, 1, 3]) for _ in range(3))
    s = g.op("Mul", g.op("MatMul", q, g.op("Transpose", k, perm=[0, 1, 3, 2])), g.const(0.25))
    cap = g.const(5.0)
    s = g.op("Mul", g.op("Tanh", g.op("Div", s, cap)), cap)
    s = g.op("Add", s, g.const(np.triu(np.full((seq, seq), -1e9), 1)))
    o = g.op("MatMul", g.op("Softmax", s, axis=-1), v)
    out = g.reshape(g.op("Transpose", o, perm=[0, 2, 1, 3]), [1, seq, 32])
    feeds = {"x": np.random.default_rng(seq).standard_normal((1, seq, 32)).astype("float32")}
    _close(*_run(g.model([out]), feeds))


def test_contrib_attention_imported_as_nn_attention():
    model, feeds = forms.contrib_attention(2, 11)
    _close(*_run(model, feeds))
