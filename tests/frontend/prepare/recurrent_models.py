"""Small LSTM/GRU ONNX models built with onnx.helper (random weights, fixed seed)."""

import numpy as np
from onnx import TensorProto, helper, numpy_helper

from .helpers import tensor, tiny_model


def rnn_model(op_type="LSTM", hidden=8, input_size=5, direction="forward", batch=2,
              initial_states=False, layout=0, bias=True, linear_before_reset=0,
              sequence_lens=None, seq="seq", seed=0, extra_attrs=None, opset=17):
    """An ``LSTM``/``GRU`` node with every output a graph output; ``seq`` symbolic."""
    rng = np.random.default_rng(seed)
    dirs = 2 if direction == "bidirectional" else 1
    gates = 4 if op_type == "LSTM" else 3
    w = (rng.standard_normal((dirs, gates * hidden, input_size)) * 0.4).astype("float32")
    r = (rng.standard_normal((dirs, gates * hidden, hidden)) * 0.4).astype("float32")
    b = (rng.standard_normal((dirs, 2 * gates * hidden)) * 0.3).astype("float32")
    inits = [numpy_helper.from_array(w, "W"), numpy_helper.from_array(r, "R")]
    names = ["X", "W", "R", "B" if bias else ""]
    if bias:
        inits.append(numpy_helper.from_array(b, "B"))
    if sequence_lens is not None:
        inits.append(numpy_helper.from_array(np.asarray(sequence_lens, "int32"), "L"))
    names.append("L" if sequence_lens is not None else "")
    x_shape = [seq, batch, input_size] if layout == 0 else [batch, seq, input_size]
    state_shape = [dirs, batch, hidden] if layout == 0 else [batch, dirs, hidden]
    inputs = [tensor("X", TensorProto.FLOAT, x_shape)]
    states = ["h0", "c0"] if op_type == "LSTM" else ["h0"]
    if initial_states:
        inputs += [tensor(s, TensorProto.FLOAT, state_shape) for s in states]
        names += states
    outs = ["Y", "Y_h", "Y_c"] if op_type == "LSTM" else ["Y", "Y_h"]
    y_shape = [seq, dirs, batch, hidden] if layout == 0 else [batch, seq, dirs, hidden]
    attrs = dict(hidden_size=hidden, direction=direction, **(extra_attrs or {}))
    if layout:
        attrs["layout"] = layout
    if op_type == "GRU":
        attrs["linear_before_reset"] = linear_before_reset
    while names and names[-1] == "":
        names.pop()
    node = helper.make_node(op_type, names, outs, name=f"{op_type.lower()}0", **attrs)
    outputs = [tensor("Y", TensorProto.FLOAT, y_shape)]
    outputs += [tensor(o, TensorProto.FLOAT, state_shape) for o in outs[1:]]
    return tiny_model([node], inputs, outputs, inits, opset=opset)


def rnn_feeds(model, seq_len, seed=1):
    """Random inputs for ``model`` with the symbolic sequence length set to ``seq_len``."""
    rng = np.random.default_rng(seed + seq_len)
    feeds = {}
    for value in model.graph.input:
        dims = [d.dim_value if d.dim_value else seq_len for d in value.type.tensor_type.shape.dim]
        feeds[value.name] = rng.standard_normal(dims).astype("float32")
    return feeds
