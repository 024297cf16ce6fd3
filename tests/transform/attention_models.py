"""Small ONNX attention blocks in the forms exporters write, for the FuseAttention tests.

Each builder returns ``(model, feeds)``: an ``onnx.ModelProto`` whose graph holds one or two
attention blocks between real projections (random weights, fixed seed) and random inputs of
the given batch and sequence length. The ``dynamic`` ones declare ``batch`` and ``seq`` as
symbolic dims and build their reshape targets from ``Shape`` nodes, as the exporters do.
"""

from __future__ import annotations

import numpy as np
from onnx import TensorProto, helper, numpy_helper

F32 = TensorProto.FLOAT


class Graph:
    """An ONNX graph under construction: ``g.op("MatMul", a, b)`` returns the output name."""

    def __init__(self, seed: int = 0):
        self.nodes, self.inits, self.inputs = [], [], []
        self.rng = np.random.default_rng(seed)
        self.count = 0

    def op(self, op_type, *inputs, n_out=1, **attrs):
        self.count += 1
        outs = [f"{op_type.lower()}{self.count}_{k}" for k in range(n_out)]
        self.nodes.append(helper.make_node(op_type, list(inputs), outs,
                                           name=f"{op_type}_{self.count}", **attrs))
        return outs[0] if n_out == 1 else outs

    def const(self, value, dtype="float32"):
        self.count += 1
        name = f"c{self.count}"
        self.inits.append(numpy_helper.from_array(np.asarray(value, dtype=dtype), name))
        return name

    def weight(self, *shape):
        return self.const(self.rng.standard_normal(shape) / np.sqrt(shape[0]))

    def input(self, name, shape, elem=F32):
        self.inputs.append(helper.make_tensor_value_info(name, elem, list(shape)))
        return name

    def reshape(self, x, dims, like=None, keep=0):
        """Reshape ``x`` to the first ``keep`` dims of ``like`` (from its Shape) + ``dims``."""
        if like is None or keep == 0:
            return self.op("Reshape", x, self.const(dims, "int64"))
        head = self.op("Slice", self.op("Shape", like), self.const([0], "int64"),
                       self.const([keep], "int64"))
        return self.op("Reshape", x, self.op("Concat", head, self.const(dims, "int64"), axis=0))

    def model(self, outputs, opset=17, domains=()):
        graph = helper.make_graph(self.nodes, "attention", self.inputs,
                                  [helper.make_tensor_value_info(o, F32, None) for o in outputs],
                                  self.inits)
        opsets = [helper.make_opsetid("", opset)] + [helper.make_opsetid(d, 1) for d in domains]
        return helper.make_model(graph, opset_imports=opsets)


def _feeds(rng, **shapes):
    return {n: rng.standard_normal(s).astype("float32") for n, s in shapes.items()}


def bert_sdpa(batch, seq, heads=2, dim=16, dynamic=False, guard=True):
    """torch's SDPA decomposition (BERT, DistilBERT, dynamo exporter): sqrt of the scale on q
    and on k, k transposed through a ``(batch * heads, seq, dim)`` reshape, an additive mask
    ``where(bool mask, 0, min)`` of shape (batch, 1, 1, seq), the isnan guard."""
    g = Graph()
    hidden = heads * dim
    b, s = ("batch", "seq") if dynamic else (batch, seq)
    x = g.input("x", [b, s, hidden])
    m = g.input("mask", [b, s], TensorProto.BOOL)
    q, k, v = (g.reshape(g.op("MatMul", x, g.weight(hidden, hidden)), [heads, dim], x, 2)
               for _ in range(3))
    half = float(dim ** -0.25)
    qt = g.op("Mul", g.op("Transpose", q, perm=[0, 2, 1, 3]), g.const(half))
    kt = g.op("Transpose", k, perm=[0, 2, 1, 3])
    kt = g.op("Reshape", kt, g.op("Concat", g.const([-1], "int64"),
                                  g.op("Slice", g.op("Shape", kt), g.const([2], "int64"),
                                       g.const([4], "int64")), axis=0))
    kt = g.op("Transpose", kt, perm=[0, 2, 1])
    kt = g.op("Mul", g.reshape(kt, [heads, dim, -1], x, 1), g.const(half))
    scores = g.op("MatMul", qt, kt)
    m4 = g.op("Unsqueeze", m, g.const([1, 2], "int64"))
    bias = g.op("Where", m4, g.const(0.0), g.const(np.finfo(np.float32).min))
    p = g.op("Softmax", g.op("Add", scores, bias), axis=-1)
    if guard:
        p = g.op("Where", g.op("IsNaN", p), g.const(0.0), p)
    o = g.op("MatMul", p, g.op("Transpose", v, perm=[0, 2, 1, 3]))
    out = g.reshape(g.op("Transpose", o, perm=[0, 2, 1, 3]), [hidden], x, 2)
    rng = np.random.default_rng(seq)
    feeds = _feeds(rng, x=(batch, seq, hidden))
    mask = np.ones((batch, seq), bool)
    mask[-1, seq // 2 + 1:] = False  # the last row padded
    feeds["mask"] = mask
    return g.model([out]), feeds


def gpt2_causal(batch, seq, heads=2, dim=16):
    """GPT-2: one fused QKV projection cut by ``Split``, the scale on the scores (``Div``),
    a causal mask as ``Where(triangle, scores, min)``, static shapes."""
    g = Graph(1)
    hidden = heads * dim
    x = g.input("x", [batch, seq, hidden])
    qkv = g.op("MatMul", x, g.weight(hidden, 3 * hidden))
    q, k, v = g.op("Split", qkv, g.const([hidden] * 3, "int64"), axis=2, n_out=3)
    q, k, v = (g.op("Transpose", g.reshape(t, [batch, seq, heads, dim]), perm=[0, 2, 1, 3])
               for t in (q, k, v))
    scores = g.op("Div", g.op("MatMul", q, g.op("Transpose", k, perm=[0, 1, 3, 2])),
                  g.const(np.sqrt(dim)))
    causal = g.const(np.tril(np.ones((seq, seq), bool))[None, None], "bool")
    scores = g.op("Where", causal, scores, g.const(np.finfo(np.float32).min))
    o = g.op("MatMul", g.op("Softmax", scores, axis=-1), v)
    out = g.reshape(g.op("Transpose", o, perm=[0, 2, 1, 3]), [batch, seq, hidden])
    return g.model([out]), _feeds(np.random.default_rng(seq), x=(batch, seq, hidden))


def vit_in_proj(batch, seq, heads=2, dim=16):
    """torchvision's nn.MultiheadAttention: sequence first, one in-projection gathered into
    q, k, v, the sqrt of the scale on q and k, the output transposed (2, 0, 1, 3)."""
    g = Graph(2)
    hidden = heads * dim
    x = g.input("x", [seq, batch, hidden])
    qkv = g.reshape(g.op("MatMul", x, g.weight(hidden, 3 * hidden)), [seq, batch, 3, hidden])
    qkv = g.op("Transpose", g.op("Unsqueeze", qkv, g.const([0], "int64")), perm=[3, 1, 2, 0, 4])
    qkv = g.op("Squeeze", qkv, g.const([-2], "int64"))
    q, k, v = (g.op("Transpose", g.reshape(g.op("Gather", qkv, g.const(i, "int64"), axis=0),
                                           [seq, batch * heads, dim]), perm=[1, 0, 2])
               for i in range(3))
    half = g.const(np.full((1,), dim ** -0.25))
    q = g.op("Mul", g.reshape(q, [batch, heads, seq, dim]), half)
    k = g.op("Mul", g.reshape(g.op("Transpose", k, perm=[0, 2, 1]), [batch, heads, dim, seq]),
             half)
    o = g.op("MatMul", g.op("Softmax", g.op("MatMul", q, k), axis=-1),
             g.reshape(v, [batch, heads, seq, dim]))
    out = g.reshape(g.op("Transpose", o, perm=[2, 0, 1, 3]), [seq * batch, hidden])
    return g.model([out]), _feeds(np.random.default_rng(seq), x=(seq, batch, hidden))


def llama_gqa(batch, seq, heads=4, kv_heads=2, dim=16, dynamic=False):
    """Llama: grouped-query attention (k, v heads repeated by Unsqueeze/Expand/Reshape), the
    scale on q (``Mul`` of the projection before the reshape, as Whisper writes it), an
    additive causal mask constant of the largest length, sliced to ``seq``."""
    g = Graph(3)
    hidden = heads * dim
    b, s = ("batch", "seq") if dynamic else (batch, seq)
    x = g.input("x", [b, s, hidden])
    q = g.op("Mul", g.op("MatMul", x, g.weight(hidden, hidden)), g.const(dim ** -0.5))
    q = g.op("Transpose", g.reshape(q, [heads, dim], x, 2), perm=[0, 2, 1, 3])
    rep = heads // kv_heads
    kv = []
    for _ in range(2):
        t = g.op("Transpose", g.reshape(g.op("MatMul", x, g.weight(hidden, kv_heads * dim)),
                                        [kv_heads, dim], x, 2), perm=[0, 2, 1, 3])
        t = g.op("Unsqueeze", t, g.const([2], "int64"))
        shape = g.op("Shape", t)
        target = g.op("Concat", g.op("Slice", shape, g.const([0], "int64"), g.const([2], "int64")),
                      g.const([rep], "int64"), g.op("Slice", shape, g.const([3], "int64"),
                                                    g.const([5], "int64")), axis=0)
        t = g.op("Expand", t, target)
        kv.append(g.op("Reshape", t, g.op("Concat", g.op("Slice", shape, g.const([0], "int64"),
                                                          g.const([1], "int64")),
                                          g.const([heads, -1, dim], "int64"), axis=0)))
    k, v = kv
    scores = g.op("MatMul", q, g.op("Transpose", k, perm=[0, 1, 3, 2]))
    longest = 64
    causal = np.triu(np.full((longest, longest), np.finfo(np.float32).min, "float32"), 1)
    n = g.op("Slice", g.op("Shape", x), g.const([1], "int64"), g.const([2], "int64"))
    mask = g.op("Slice", g.const(causal[None, None]), g.const([0, 0], "int64"),
                g.op("Concat", n, n, axis=0), g.const([2, 3], "int64"))
    p = g.op("Softmax", g.op("Add", scores, mask), axis=-1)
    o = g.op("MatMul", g.op("Where", g.op("IsNaN", p), g.const(0.0), p), v)
    out = g.reshape(g.op("Transpose", o, perm=[0, 2, 1, 3]), [hidden], x, 2)
    return g.model([out]), _feeds(np.random.default_rng(seq), x=(batch, seq, hidden))


def cross_attention(batch, seq, kv_seq=24, heads=2, dim=16):
    """Whisper/BART decoder cross-attention: queries from the decoder, keys and values from
    the encoder states (different lengths), no mask."""
    g = Graph(4)
    hidden = heads * dim
    x = g.input("x", [batch, seq, hidden])
    enc = g.input("enc", [batch, kv_seq, hidden])
    q = g.op("Transpose", g.reshape(g.op("MatMul", x, g.weight(hidden, hidden)),
                                    [batch, seq, heads, dim]), perm=[0, 2, 1, 3])
    k, v = (g.op("Transpose", g.reshape(g.op("MatMul", enc, g.weight(hidden, hidden)),
                                        [batch, kv_seq, heads, dim]), perm=[0, 2, 1, 3])
            for _ in range(2))
    scores = g.op("Mul", g.op("MatMul", q, g.op("Transpose", k, perm=[0, 1, 3, 2])),
                  g.const(dim ** -0.5))
    o = g.op("MatMul", g.op("Softmax", scores, axis=-1), v)
    out = g.reshape(g.op("Transpose", o, perm=[0, 2, 1, 3]), [batch, seq, hidden])
    return g.model([out]), _feeds(np.random.default_rng(seq), x=(batch, seq, hidden),
                                  enc=(batch, kv_seq, hidden))


def t5_relative_bias(batch, seq, heads=2, dim=16):
    """T5: no scale, a relative-position bias (1, heads, seq, seq) plus a padding mask made
    as ``(1 - m) * min`` from an integer attention mask, summed before the scores."""
    g = Graph(5)
    hidden = heads * dim
    x = g.input("x", [batch, seq, hidden])
    m = g.input("mask", [batch, seq], TensorProto.INT64)
    q, k, v = (g.op("Transpose", g.reshape(g.op("MatMul", x, g.weight(hidden, hidden)),
                                           [batch, seq, heads, dim]), perm=[0, 2, 1, 3])
               for _ in range(3))
    position = g.const(g.rng.standard_normal((1, heads, seq, seq)))
    pad = g.op("Mul", g.op("Sub", g.const(1.0), g.op("Cast", g.reshape(m, [batch, 1, 1, seq]),
                                                     to=F32)),
               g.const(np.finfo(np.float32).min))
    bias = g.op("Add", position, pad)
    scores = g.op("Add", g.op("MatMul", q, g.op("Transpose", k, perm=[0, 1, 3, 2])), bias)
    o = g.op("MatMul", g.op("Softmax", scores, axis=-1), v)
    out = g.reshape(g.op("Transpose", o, perm=[0, 2, 1, 3]), [batch, seq, hidden])
    feeds = _feeds(np.random.default_rng(seq), x=(batch, seq, hidden))
    mask = np.ones((batch, seq), "int64")
    mask[0, -2:] = 0
    feeds["mask"] = mask
    return g.model([out]), feeds


def swin_windows(batch, windows=4, tokens=9, heads=2, dim=16):
    """Swin: attention over a batch of windows, a relative-position bias (heads, N, N) added
    to the scores, then the shifted-window mask (1, windows, 1, N, N) added after reshaping
    the scores to (batch, windows, heads, N, N) and back."""
    g = Graph(6)
    hidden = heads * dim
    bw = batch * windows
    x = g.input("x", [bw, tokens, hidden])
    q, k, v = (g.op("Transpose", g.reshape(g.op("MatMul", x, g.weight(hidden, hidden)),
                                           [bw, tokens, heads, dim]), perm=[0, 2, 1, 3])
               for _ in range(3))
    scores = g.op("MatMul", g.op("Mul", q, g.const(dim ** -0.5)),
                  g.op("Transpose", k, perm=[0, 1, 3, 2]))
    scores = g.op("Add", scores, g.const(g.rng.standard_normal((heads, tokens, tokens))))
    shifted = np.where(g.rng.random((1, windows, 1, tokens, tokens)) < 0.3, -100.0, 0.0)
    scores = g.reshape(g.op("Add", g.reshape(scores, [batch, windows, heads, tokens, tokens]),
                            g.const(shifted)), [bw, heads, tokens, tokens])
    o = g.op("MatMul", g.op("Softmax", scores, axis=-1), v)
    out = g.reshape(g.op("Transpose", o, perm=[0, 2, 1, 3]), [bw, tokens, hidden])
    return g.model([out]), _feeds(np.random.default_rng(tokens), x=(bw, tokens, hidden))


def boolean_mask(batch, seq, heads=2, dim=16, guard=True):
    """A boolean mask through ``Where(mask, scores, -inf)`` with one query row that sees no
    key: NaN there without the isnan guard (as onnxruntime gives), 0 with it."""
    g = Graph(7)
    hidden = heads * dim
    x = g.input("x", [batch, seq, hidden])
    m = g.input("mask", [batch, 1, seq, seq], TensorProto.BOOL)
    q, k, v = (g.op("Transpose", g.reshape(g.op("MatMul", x, g.weight(hidden, hidden)),
                                           [batch, seq, heads, dim]), perm=[0, 2, 1, 3])
               for _ in range(3))
    scores = g.op("Div", g.op("MatMul", q, g.op("Transpose", k, perm=[0, 1, 3, 2])),
                  g.const(np.sqrt(dim)))
    p = g.op("Softmax", g.op("Where", m, scores, g.const(-np.inf)), axis=-1)
    if guard:
        p = g.op("Where", g.op("IsNaN", p), g.const(0.0), p)
    o = g.op("MatMul", p, v)
    out = g.reshape(g.op("Transpose", o, perm=[0, 2, 1, 3]), [batch, seq, hidden])
    rng = np.random.default_rng(seq)
    feeds = _feeds(rng, x=(batch, seq, hidden))
    mask = rng.random((batch, 1, seq, seq)) < 0.7
    mask[0, 0, 1, :] = False  # query 1 of the first batch sees no key
    feeds["mask"] = mask
    return g.model([out]), feeds


def contrib_attention(batch, seq, heads=2, dim=16):
    """onnxruntime's ``com.microsoft`` ``Attention`` (one QKV weight and bias, an additive
    attention bias (batch, heads, seq, seq)), which TVM's importer turns into
    ``R.nn.attention``."""
    g = Graph(8)
    hidden = heads * dim
    x = g.input("x", [batch, seq, hidden])
    bias = g.input("bias", [batch, heads, seq, seq])
    g.count += 1
    g.nodes.append(helper.make_node(
        "Attention", [x, g.weight(hidden, 3 * hidden), g.const(g.rng.standard_normal(3 * hidden)),
                      "", "", bias],
        ["out"], domain="com.microsoft", num_heads=heads, name="Attention"))
    return g.model(["out"], domains=("com.microsoft",)), _feeds(
        np.random.default_rng(seq), x=(batch, seq, hidden), bias=(batch, heads, seq, seq))
