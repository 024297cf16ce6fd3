"""Built-in example ONNX models, so the CLI and the benchmarks run with no file at hand.

:func:`example_cnn` builds a small MobileNetV2-style classifier with
``onnx.helper``: a strided stem convolution, inverted-residual blocks
(1x1 expand, 3x3 depthwise, 1x1 project, with skip connections where the
shapes allow), global average pooling and a Gemm classifier. The skip
connections keep tensors live across several operators, which is what makes
arena planning non-trivial. Weights are random with a fixed seed.

:func:`example_tiny_matmuls` is a graph of tiny tensors where 64-byte-aligned
offsets cost more than sharing saves: our planner keeps TVM's plan for it.
"""

from __future__ import annotations

from typing import List, Tuple

import numpy as np
import onnx
from onnx import TensorProto, helper, numpy_helper

__all__ = ["example_cnn", "example_tiny_matmuls", "EXAMPLE_INPUT_NAME", "EXAMPLE_INPUT_SHAPE"]

EXAMPLE_INPUT_NAME = "image"
EXAMPLE_INPUT_SHAPE = (1, 3, 96, 96)

# (expansion, output channels, stride) per inverted-residual block
_BLOCKS: Tuple[Tuple[int, int, int], ...] = (
    (1, 16, 1),
    (4, 24, 2),
    (4, 24, 1),
    (4, 32, 2),
    (4, 32, 1),
    (4, 32, 1),
    (4, 64, 2),
    (4, 64, 1),
)


class _Builder:
    def __init__(self, seed: int):
        self.rng = np.random.default_rng(seed)
        self.nodes: List[onnx.NodeProto] = []
        self.inits: List[onnx.TensorProto] = []
        self.count = 0

    def _name(self, kind: str) -> str:
        self.count += 1
        return f"{kind}_{self.count}"

    def weight(self, shape, fan_in: int) -> str:
        name = self._name("w")
        w = self.rng.standard_normal(shape).astype(np.float32) * np.float32(np.sqrt(2.0 / fan_in))
        self.inits.append(numpy_helper.from_array(w, name))
        return name

    def node(self, op: str, inputs, **attrs) -> str:
        out = self._name(op.lower())
        self.nodes.append(helper.make_node(op, list(inputs), [out], name=out, **attrs))
        return out

    def conv(self, x: str, cin: int, cout: int, k: int, stride: int, group: int, relu: bool) -> str:
        w = self.weight((cout, cin // group, k, k), fan_in=cin // group * k * k)
        b = self.weight((cout,), fan_in=cout)
        pad = k // 2
        y = self.node(
            "Conv", [x, w, b], kernel_shape=[k, k], strides=[stride, stride],
            pads=[pad, pad, pad, pad], group=group,
        )
        return self.node("Relu", [y]) if relu else y


def example_cnn(seed: int = 0) -> onnx.ModelProto:
    """A small MobileNetV2-style CNN as a checked ONNX model (opset 17).

    Parameters
    ----------
    seed : int
        Seed of the random weights.

    Returns
    -------
    onnx.ModelProto
        Input ``image`` float32 ``[1, 3, 96, 96]``; output ``probs`` float32
        ``[1, 10]`` (softmax over 10 classes).
    """
    b = _Builder(seed)
    x = b.conv(EXAMPLE_INPUT_NAME, 3, 16, 3, 2, 1, relu=True)
    cin = 16
    for expand, cout, stride in _BLOCKS:
        hidden = cin * expand
        y = b.conv(x, cin, hidden, 1, 1, 1, relu=True) if expand != 1 else x
        y = b.conv(y, hidden, hidden, 3, stride, hidden, relu=True)
        y = b.conv(y, hidden, cout, 1, 1, 1, relu=False)
        x = b.node("Add", [x, y]) if stride == 1 and cin == cout else y
        cin = cout
    x = b.conv(x, cin, 128, 1, 1, 1, relu=True)
    x = b.node("GlobalAveragePool", [x])
    x = b.node("Flatten", [x], axis=1)
    w = b.weight((10, 128), fan_in=128)
    bias = b.weight((10,), fan_in=10)
    x = b.node("Gemm", [x, w, bias], transB=1)
    b.nodes.append(helper.make_node("Softmax", [x], ["probs"], name="softmax_out", axis=1))
    graph = helper.make_graph(
        b.nodes,
        "relax_memplan_example_cnn",
        [helper.make_tensor_value_info(EXAMPLE_INPUT_NAME, TensorProto.FLOAT, EXAMPLE_INPUT_SHAPE)],
        [helper.make_tensor_value_info("probs", TensorProto.FLOAT, (1, 10))],
        initializer=b.inits,
    )
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    model.ir_version = 8
    onnx.checker.check_model(model)
    return model


def example_tiny_matmuls(size: int = 6) -> onnx.ModelProto:
    """``x[size, size]`` -> MatMul -> MatMul -> MatMul (each squaring its input).

    Two intermediates are live together; at ``size=6`` each is 144 bytes, 192
    at a 64-byte-aligned arena offset, so an arena (384 B) is larger than
    TVM's two exact-size storage tokens (288 B).

    Parameters
    ----------
    size : int
        Rows and columns of the float32 input.

    Returns
    -------
    onnx.ModelProto
        Opset 17, input ``x``, output ``y``, both ``[size, size]``.
    """
    nodes = [helper.make_node("MatMul", [src, src], [dst])
             for src, dst in (("x", "a"), ("a", "b"), ("b", "y"))]
    graph = helper.make_graph(
        nodes, f"tiny_matmuls_{size}x{size}",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, [size, size])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [size, size])])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    model.ir_version = 8
    return model
