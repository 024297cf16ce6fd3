"""Small ONNX graphs holding one layer norm or RMS norm in the forms exporters write, for the
FuseNormalization tests.

:func:`norm_model` returns ``(model, feeds)``: inputs ``a`` and ``b`` of shape ``(2, 5, H)``
(the residual add ``a + b`` when ``residual``, else the norm reads ``a``), random gamma and
beta initializers, output ``y`` (and the residual sum ``s`` when ``sum_output``).
"""

from __future__ import annotations

import numpy as np
from onnx import TensorProto

from tests.transform.attention_models import Graph

H = 16
SHAPE = (2, 5, H)

#: form -> (kind, opset, what the exporter writes)
FORMS = {
    "op": ("layer_norm", 17, "LayerNormalization"),
    "pow_div": ("layer_norm", 13, "TorchScript exporter below opset 17"),
    "pow_div_opset18": ("layer_norm", 18, "ReduceMean with its axes as an input"),
    "mul_reciprocal": ("layer_norm", 13, "tf2onnx: d * d, Sqrt, Reciprocal, Mul"),
    "tf_folded": ("layer_norm", 13, "tf2onnx (Keras): x * inv + (beta - mean * inv)"),
    "rms_reciprocal": ("rms_norm", 18, "Llama/T5: Pow 2, Sqrt, Reciprocal, Mul, Mul weight"),
    "rms_div": ("rms_norm", 13, "x / Sqrt(mean(x * x) + eps) * w"),
    "rms_cast": ("rms_norm", 13, "Casts to float32 around the Llama form"),
}


def _mean(g, x, opset, axis=-1):
    if opset >= 18:
        return g.op("ReduceMean", x, g.const([axis], "int64"), keepdims=1)
    return g.op("ReduceMean", x, axes=[axis], keepdims=1)


def _plus_eps(g, v, eps_first):
    eps = g.const(1e-5)
    return g.op("Add", eps, v) if eps_first else g.op("Add", v, eps)


def _norm(g, form, x, gamma, beta, eps_first, axis=-1):
    """The norm of ``x`` written as ``form`` (:data:`FORMS`)."""
    kind, opset, _ = FORMS[form]
    if form == "op":
        args = [x, gamma or g.const(np.ones(H)), beta] if beta else \
            [x, gamma or g.const(np.ones(H))]
        return g.op("LayerNormalization", *args, axis=-1, epsilon=1e-5)
    if form == "rms_cast":
        x = g.op("Cast", x, to=TensorProto.FLOAT)
    if form == "tf_folded":
        return _folded(g, x, gamma, beta, eps_first)
    if kind == "layer_norm":
        centred = g.op("Sub", x, _mean(g, x, opset, axis))
        square = g.op("Mul", centred, centred) if form == "mul_reciprocal" else \
            g.op("Pow", centred, g.const(2.0))
    else:
        centred = x
        square = g.op("Mul", x, x) if form == "rms_div" else g.op("Pow", x, g.const(2.0))
    ve = _plus_eps(g, _mean(g, square, opset, axis), eps_first)
    if form in ("pow_div", "pow_div_opset18", "rms_div"):
        y = g.op("Div", centred, g.op("Sqrt", ve))
    else:
        y = g.op("Mul", centred, g.op("Reciprocal", g.op("Sqrt", ve)))
    if form == "rms_cast":
        y = g.op("Cast", y, to=TensorProto.FLOAT)
    if gamma:
        y = g.op("Mul", gamma, y) if kind == "rms_norm" else g.op("Mul", y, gamma)
    if beta and kind == "layer_norm":
        y = g.op("Add", y, beta)
    return y


def _folded(g, x, gamma, beta, eps_first):
    """TensorFlow's batch-norm formula of a layer norm, as tf2onnx writes Keras's."""
    m = _mean(g, x, 13)
    d = g.op("Sub", x, m)
    ve = _plus_eps(g, _mean(g, g.op("Mul", d, d), 13), eps_first)
    inv = g.op("Reciprocal", g.op("Sqrt", ve))
    if gamma:
        inv = g.op("Mul", inv, gamma)
    scaled_mean = g.op("Mul", m, inv)
    shift = g.op("Sub", beta, scaled_mean) if beta else g.op("Neg", scaled_mean)
    return g.op("Add", g.op("Mul", x, inv), shift)


def norm_model(form, residual=True, swap=False, gamma=True, beta=True, sum_output=False,
               eps_first=False, seed=0):
    """``(model, feeds)`` of one norm in ``form`` (module docstring); ``swap``: the residual
    add as ``b + a``."""
    g = Graph(seed)
    a, b = g.input("a", SHAPE), g.input("b", SHAPE)
    x = (g.op("Add", b, a) if swap else g.op("Add", a, b)) if residual else a
    gamma_name = g.const(g.rng.standard_normal(H) + 1.0) if gamma else None
    beta_name = g.const(g.rng.standard_normal(H)) if beta else None
    y = _norm(g, form, x, gamma_name, beta_name, eps_first)
    outputs = [g.op("Identity", y)] + ([g.op("Identity", x)] if sum_output and residual else [])
    model = g.model(outputs, opset=FORMS[form][1])
    rng = np.random.default_rng(seed + 1)
    feeds = {n: (rng.standard_normal(SHAPE) * 2 + 0.5).astype("float32") for n in ("a", "b")}
    return model, feeds
