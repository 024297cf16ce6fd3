"""A VAD-shaped recurrent ONNX model built with ``onnx.helper`` (random weights).

Shaped like a voice-activity detector: a conv/linear front end over feature frames, an
``LSTM`` whose state is an input and an output (streaming), an ``If`` on the sample rate
choosing the head, and a sigmoid.  Used by the tests of the ``recurrent`` converter
step, ``benchmarks/latency_bench.py`` and ``relax-memplan compile`` runs; torch is not
needed.
"""

from __future__ import annotations

import numpy as np
import onnx
from onnx import TensorProto, helper, numpy_helper

__all__ = ["vad_lstm_model"]


def _vi(name, elem_type, shape):
    return helper.make_tensor_value_info(name, elem_type, shape)


def _head(name, rng, hidden):
    """One branch of the If: ``y[seq, 1, hidden] @ w[hidden, 1] + b``."""
    w = numpy_helper.from_array((rng.standard_normal((hidden, 1)) * 0.3).astype("float32"),
                                f"{name}_w")
    b = numpy_helper.from_array(rng.standard_normal((1,)).astype("float32"), f"{name}_b")
    nodes = [
        helper.make_node("MatMul", ["y", f"{name}_w"], [f"{name}_mm"]),
        helper.make_node("Add", [f"{name}_mm", f"{name}_b"], [f"{name}_logit"]),
    ]
    return helper.make_graph(nodes, name, [], [_vi(f"{name}_logit", TensorProto.FLOAT,
                                                   ["seq", 1, 1])], initializer=[w, b])


def vad_lstm_model(features: int = 40, channels: int = 64, hidden: int = 64,
                   seed: int = 0) -> onnx.ModelProto:
    """The model: ``feats [1, features, seq]``, ``h0, c0 [1, 1, hidden]``, ``sr`` (int64
    scalar) in; ``prob [seq, 1, 1]``, ``hn, cn [1, 1, hidden]`` out.  ``seq`` is symbolic.

    Parameters
    ----------
    features, channels, hidden : int
        Input feature channels, conv/linear width, LSTM hidden size (elements).
    seed : int
        Seed of the random weights.
    """
    rng = np.random.default_rng(seed)

    def init(name, shape, scale):
        return numpy_helper.from_array((rng.standard_normal(shape) * scale).astype("float32"),
                                       name)

    inits = [
        init("conv_w", (channels, features, 3), 1 / np.sqrt(3 * features)),
        init("conv_b", (channels,), 0.1),
        init("lin_w", (channels, channels), 1 / np.sqrt(channels)),
        init("lin_b", (channels,), 0.1),
        init("lstm_w", (1, 4 * hidden, channels), 1 / np.sqrt(channels)),
        init("lstm_r", (1, 4 * hidden, hidden), 1 / np.sqrt(hidden)),
        init("lstm_b", (1, 8 * hidden), 0.1),
        numpy_helper.from_array(np.array([1], "int64"), "axis1"),
        numpy_helper.from_array(np.array(16000, "int64"), "sr16k"),
    ]
    nodes = [
        helper.make_node("Conv", ["feats", "conv_w", "conv_b"], ["conv"], pads=[1, 1],
                         name="front_conv"),
        helper.make_node("Relu", ["conv"], ["conv_relu"]),
        helper.make_node("Transpose", ["conv_relu"], ["frames"], perm=[2, 0, 1]),
        helper.make_node("MatMul", ["frames", "lin_w"], ["lin"]),
        helper.make_node("Add", ["lin", "lin_b"], ["lin_b_out"]),
        helper.make_node("Tanh", ["lin_b_out"], ["front"]),
        helper.make_node("LSTM", ["front", "lstm_w", "lstm_r", "lstm_b", "", "h0", "c0"],
                         ["lstm_y", "hn", "cn"], hidden_size=hidden, name="lstm"),
        helper.make_node("Squeeze", ["lstm_y", "axis1"], ["y"]),
        helper.make_node("Equal", ["sr", "sr16k"], ["is_16k"]),
        helper.make_node("If", ["is_16k"], ["logit"], name="head_by_rate",
                         then_branch=_head("head16k", rng, hidden),
                         else_branch=_head("head8k", rng, hidden)),
        helper.make_node("Sigmoid", ["logit"], ["prob"]),
    ]
    graph = helper.make_graph(
        nodes, "vad_lstm",
        [_vi("feats", TensorProto.FLOAT, [1, features, "seq"]),
         _vi("h0", TensorProto.FLOAT, [1, 1, hidden]),
         _vi("c0", TensorProto.FLOAT, [1, 1, hidden]),
         _vi("sr", TensorProto.INT64, [])],
        [_vi("prob", TensorProto.FLOAT, ["seq", 1, 1]),
         _vi("hn", TensorProto.FLOAT, [1, 1, hidden]),
         _vi("cn", TensorProto.FLOAT, [1, 1, hidden])],
        initializer=inits,
    )
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    model.ir_version = 8
    onnx.checker.check_model(model, full_check=True)
    return model
