"""The ``recurrent`` converter step: ONNX LSTM and GRU against onnxruntime, compiled once
with a symbolic sequence length and run at two lengths."""

import warnings

import numpy as np
import pytest
import tvm
from tvm import relax

from relax_memplan.errors import UnsupportedOperatorError
from relax_memplan.frontend import import_onnx, run_onnxruntime

from .helpers import dims, param_dims
from .recurrent_models import rnn_feeds, rnn_model

SEQ_LENS = (3, 11)
REL_TOL = 1e-4


def assert_close(got, ref, what=""):
    """Max abs error relative to the reference's max magnitude, at most ``REL_TOL``."""
    err = float(np.max(np.abs(got - ref)) / max(float(np.max(np.abs(ref))), 1e-30))
    assert got.shape == ref.shape and err <= REL_TOL, f"{what}: rel. err {err:.2e}"


def compiled(model):
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        mod, _ = import_onnx(model, keep_dynamic=True)
    return relax.VirtualMachine(tvm.compile(mod, "llvm"), tvm.cpu())


def run(vm, feeds):
    out = vm["main"](*[tvm.runtime.tensor(v) for v in feeds.values()])
    return [v.numpy() for v in out]


VARIANTS = {
    "lstm_forward": dict(),
    "lstm_reverse_states": dict(direction="reverse", initial_states=True),
    "lstm_bidirectional": dict(direction="bidirectional"),
    "lstm_bidirectional_states_h6": dict(direction="bidirectional", initial_states=True,
                                         hidden=6),
    "lstm_no_bias_h16": dict(bias=False, hidden=16),
    "gru_forward": dict(op_type="GRU"),
    "gru_reverse_states": dict(op_type="GRU", direction="reverse", initial_states=True),
    "gru_bidirectional_lbr": dict(op_type="GRU", direction="bidirectional",
                                  linear_before_reset=1, initial_states=True),
    "gru_forward_lbr_h5": dict(op_type="GRU", linear_before_reset=1, hidden=5),
    "gru_bidirectional_h12": dict(op_type="GRU", direction="bidirectional", hidden=12),
    # 16 lanes (hidden a multiple of 16), two lane blocks per step
    "gru_bidirectional_states_h32": dict(op_type="GRU", direction="bidirectional", hidden=32,
                                         initial_states=True),
}


@pytest.mark.parametrize("name", list(VARIANTS))
def test_matches_onnxruntime_at_two_sequence_lengths(name):
    model = rnn_model(**VARIANTS[name])
    vm = compiled(model)
    for seq in SEQ_LENS:
        feeds = rnn_feeds(model, seq)
        got, expected = run(vm, feeds), run_onnxruntime(model, feeds)
        assert len(got) == len(expected)
        for index, (out, ref) in enumerate(zip(got, expected)):
            assert_close(out, ref, f"{name} seq={seq} output {index}")


def test_the_tolerance_check_rejects_a_wrong_value():
    ref = np.linspace(-1, 1, 12, dtype="float32")
    wrong = ref.copy()
    wrong[3] += 1e-3
    with pytest.raises(AssertionError, match="rel. err"):
        assert_close(wrong, ref)


@pytest.mark.parametrize("op_type", ["LSTM", "GRU"])
def test_layout_1_is_layout_0_transposed(op_type):
    """onnxruntime has no batch-first kernels: compare with the layout-0 model's outputs."""
    kw = dict(op_type=op_type, direction="bidirectional", initial_states=True)
    batch_first, seq_first = rnn_model(layout=1, **kw), rnn_model(layout=0, **kw)
    vm = compiled(batch_first)
    for seq in SEQ_LENS:
        feeds = rnn_feeds(seq_first, seq)
        expected = run_onnxruntime(seq_first, feeds)
        got = run(vm, {k: np.ascontiguousarray(np.swapaxes(v, 0, 1)) for k, v in feeds.items()})
        assert_close(got[0], expected[0].transpose(2, 0, 1, 3), "Y")
        for out, ref in zip(got[1:], expected[1:]):
            assert_close(out, ref.transpose(1, 0, 2), "state")


def test_full_constant_sequence_lens_is_accepted():
    model = rnn_model(seq=4, sequence_lens=[4, 4])
    feeds = rnn_feeds(model, 4)
    for out, ref in zip(run(compiled(model), feeds), run_onnxruntime(model, feeds)):
        assert_close(out, ref)


@pytest.mark.parametrize("kwargs, message", [
    (dict(seq=4, sequence_lens=[4, 2]), "'lstm0'.*sequence_lens \\[4, 2\\] is not the full"),
    (dict(sequence_lens=[4, 4]), "'lstm0'.*not the full sequence length seq"),
    (dict(extra_attrs=dict(activations=["Relu", "Tanh", "Tanh"])), "'lstm0'.*activations"),
    (dict(extra_attrs=dict(clip=3.0)), "'lstm0'.*clip"),
    (dict(extra_attrs=dict(input_forget=1)), "'lstm0'.*input_forget"),
    (dict(op_type="GRU", extra_attrs=dict(activations=["Sigmoid", "Relu"])),
     "'gru0'.*activations"),
])
def test_unsupported_variants_name_the_node(kwargs, message):
    with pytest.raises(UnsupportedOperatorError, match=message):
        import_onnx(rnn_model(**kwargs), keep_dynamic=True)


def test_default_activations_spelled_out_are_accepted():
    acts = ["Sigmoid", "Tanh", "Tanh"] * 2
    model = rnn_model(direction="bidirectional", extra_attrs=dict(activations=acts))
    feeds = rnn_feeds(model, 5)
    for out, ref in zip(run(compiled(model), feeds), run_onnxruntime(model, feeds)):
        assert_close(out, ref)


def test_without_the_step_tvm_cannot_import_lstm():
    with pytest.raises(UnsupportedOperatorError, match="lstm0"):
        import_onnx(rnn_model(), keep_dynamic=True, disable_steps=["recurrent"])


def output_dims_of(mod, index):
    return dims(mod["main"].ret_ty.fields[index].shape)


def test_one_call_tir_and_no_per_step_relax_ops():
    """The time loop is inside one kernel: the Relax graph does not grow with the length."""
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        mod, _ = import_onnx(rnn_model(direction="bidirectional"), keep_dynamic=True)
    kernels = [gv.name_hint for gv, f in mod.functions.items()
               if isinstance(f, tvm.tirx.PrimFunc)]
    assert sorted(kernels) == ["lstm_recurrence", "recurrence_last_step"]
    assert param_dims(mod) == ["seq", 2, 5]
    assert output_dims_of(mod, 0) == ["seq", 2, 2, 8]


@pytest.mark.parametrize("kwargs, carried, scratch", [
    (dict(op_type="GRU"), 2 * 8 * 4, 2 * 8 * 4),  # linear_before_reset=0: r ⊙ h scratch
    (dict(op_type="GRU", linear_before_reset=1), 2 * 8 * 4, 0),
    (dict(direction="bidirectional"), 2 * (2 * 2 * 8 * 4), 0),  # h and c, both directions
])
def test_loop_facts_for_the_report(kwargs, carried, scratch):
    from relax_memplan.frontend.prepare.loop_facts import loops_of

    mod, _ = import_onnx(rnn_model(**kwargs), keep_dynamic=True)
    [facts] = loops_of(mod)
    assert facts.form == "kernel" and str(facts.iterations) == "seq"
    assert facts.at({"seq": 7}) == {"iterations": 7, "carried_state_bytes": carried,
                                    "body_bytes": scratch}
    assert facts.at({})["iterations"] == -1  # a dim without a value is not guessed
