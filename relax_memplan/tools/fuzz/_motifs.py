"""The motifs :func:`~relax_memplan.tools.fuzz.generator.generate` strings together.

Each motif takes the generator's builder (``b``: ``pick``, ``node``, ``const``, ``weight``,
``add_input``, ``rng``, ``shapes``) and adds a few nodes reading tensors already made. Axis 0
(the leading dim, maybe symbolic) is never reduced, split, sliced, gathered or moved.
"""

from __future__ import annotations

import numpy as np
from onnx import TensorProto, helper

_UNARY = ("Relu", "Sigmoid", "Tanh", "Neg", "Abs", "Exp")
_BINARY = ("Add", "Mul", "Sub", "Div")


def _rest(shape):
    """The dims after the leading one."""
    return tuple(int(d) for d in shape[1:])


def elementwise(b) -> None:
    """A chain of unary and broadcasting binary elementwise ops."""
    x = b.pick()
    for _ in range(b.small(1, 4)):
        shape = b.shapes[x]
        if b.rng.random() < 0.45:
            op = str(b.rng.choice(_UNARY))
            if op == "Exp":  # bounded first: exp of a long chain overflows
                x = b.node("Tanh", [x], shape, pool=False)
            x = b.node(op, [x], shape)
            continue
        op = str(b.rng.choice(_BINARY))
        other = _broadcast_operand(b, x, op)
        args = [x, other] if op == "Div" or b.rng.random() < 0.5 else [other, x]
        x = b.node(op, args, shape)


def _broadcast_operand(b, x: str, op: str) -> str:
    """A constant broadcasting against ``x`` (a suffix of its dims, some set to 1), or a
    tensor of ``x``'s shape; a divisor is kept away from zero."""
    shape = b.shapes[x]
    if op != "Div" and b.rng.random() < 0.3:
        same = [t for t in b.pool if b.shapes[t] == shape and t != x]
        if same:
            return same[-1]
    rest = _rest(shape)
    keep = int(b.rng.integers(0, len(rest) + 1))
    dims = [d if b.rng.random() < 0.7 else 1 for d in rest[len(rest) - keep:]]
    if op == "Div":
        value = b.rng.uniform(0.5, 2.0, dims) * b.rng.choice([-1.0, 1.0], dims)
    else:
        value = b.rng.normal(0.0, 1.0, dims)
    return b.const(np.asarray(value, dtype=np.float32))


def matmul(b) -> None:
    """MatMul by a weight, by another input of matching dims, or Gemm on a flattened 2-D."""
    x = b.pick(min_rank=2)
    shape = b.shapes[x]
    k, p = int(shape[-1]), b.small()
    choice = b.rng.integers(0, 3)
    if choice == 0:
        b.node("MatMul", [x, b.weight(k, p)], (*shape[:-1], p))
    elif choice == 1 and len(shape) >= 3:
        y = b.add_input((*shape[:-2], k, p))
        b.node("MatMul", [x, y], (*shape[:-1], p))
    else:
        flat = x
        if len(shape) != 2:
            flat = b.node("Flatten", [x], (shape[0], int(np.prod(_rest(shape)))), axis=1)
            k = int(np.prod(_rest(shape)))
        trans_b = int(b.rng.integers(0, 2))
        w = b.weight(p, k) if trans_b else b.weight(k, p)
        bias = b.const(b.rng.normal(0, 1, (p,)).astype(np.float32))
        b.node("Gemm", [flat, w, bias], (shape[0], p), transB=trans_b,
               alpha=float(b.rng.choice([1.0, 0.5])))


def conv(b) -> None:
    """Conv (maybe depthwise), Relu, then MaxPool or AveragePool."""
    x = b.pick(rank=4)
    n, c, h, w = b.shapes[x]
    if min(int(h), int(w)) < 3:
        x = b.add_input((n, int(c), b.small(4, 8), b.small(4, 8)))
        n, c, h, w = b.shapes[x]
    c, h, w = int(c), int(h), int(w)
    k, s, p = int(b.rng.choice([1, 3])), int(b.rng.integers(1, 3)), int(b.rng.integers(0, 2))
    group = c if b.rng.random() < 0.3 else 1
    co = c if group > 1 else b.small(2, 6)
    ho, wo = (h + 2 * p - k) // s + 1, (w + 2 * p - k) // s + 1
    y = b.node("Conv", [x, b.weight(co, c // group, k, k, scale=0.3),
                        b.const(b.rng.normal(0, 1, (co,)).astype(np.float32))],
               (n, co, ho, wo), kernel_shape=[k, k], strides=[s, s], pads=[p] * 4, group=group)
    y = b.node("Relu", [y], (n, co, ho, wo))
    if min(ho, wo) >= 2:
        op = str(b.rng.choice(["MaxPool", "AveragePool"]))
        b.node(op, [y], (n, co, ho // 2, wo // 2), kernel_shape=[2, 2], strides=[2, 2])


def views(b) -> None:
    """Reshape (leading dim copied with 0), Transpose keeping axis 0, or Flatten."""
    x = b.pick(min_rank=2)
    shape = b.shapes[x]
    rest = _rest(shape)
    choice = b.rng.integers(0, 3)
    if choice == 0:
        total = int(np.prod(rest))
        divisors = [d for d in range(1, total + 1) if total % d == 0]
        a = int(b.rng.choice(divisors))
        new = (0, a, total // a) if b.rng.random() < 0.6 else (0, -1)
        out = (shape[0], a, total // a) if len(new) == 3 else (shape[0], total)
        b.node("Reshape", [x, b.const(np.array(new, dtype=np.int64))], out)
    elif choice == 1 and len(rest) >= 2:
        perm = [0] + [int(i) + 1 for i in b.rng.permutation(len(rest))]
        b.node("Transpose", [x], tuple(shape[i] for i in perm), perm=perm)
    else:
        b.node("Flatten", [x], (shape[0], int(np.prod(rest))), axis=1)


def concat_split_slice(b) -> None:
    """Concat of two or three tensors on a non-leading axis, then Split or Slice."""
    x = b.pick(min_rank=2)
    shape = b.shapes[x]
    axis = int(b.rng.integers(1, len(shape)))
    parts = [x]
    for _ in range(b.small(1, 2)):
        if b.rng.random() < 0.5:
            parts.append(b.node("Sigmoid", [x], shape, pool=False))
        else:
            other = list(shape)
            other[axis] = b.small(1, 4)
            parts.append(b.add_input(tuple(other), pool=False))
    out = list(shape)
    out[axis] = sum(int(b.shapes[t][axis]) for t in parts)
    y = b.node("Concat", parts, tuple(out), axis=axis)
    size = out[axis]
    if b.rng.random() < 0.5 and size >= 2:
        first = b.small(1, size - 1)
        outs = [b.name("split"), b.name("split")]
        b.nodes.append(helper.make_node("Split", [y, b.const(np.array(
            [first, size - first], dtype=np.int64))], outs, name=f"n_{outs[0]}", axis=axis))
        for name, d in zip(outs, (first, size - first)):
            b.shapes[name] = tuple(out[:axis] + [d] + out[axis + 1:])
            b.pool.append(name)
    else:
        _slice(b, y, axis)


def _slice(b, y: str, axis: int) -> None:
    out = list(b.shapes[y])
    size = int(out[axis])
    step = int(b.rng.choice([1, 2, -1]))
    if step > 0:
        start = int(b.rng.integers(0, size))
        end = int(b.rng.integers(start + 1, size + 1))
        out[axis] = len(range(start, end, step))
    else:
        start, end = size - 1, -size - 1  # the whole axis reversed
        out[axis] = size
    consts = [b.const(np.array([v], dtype=np.int64)) for v in (start, end, axis, step)]
    b.node("Slice", [y, *consts], tuple(out))


def gather_scatter(b) -> None:
    """Gather by constant indices (negative ones too) or ScatterElements of distinct indices."""
    x = b.pick(min_rank=2)
    shape = b.shapes[x]
    axis = int(b.rng.integers(1, len(shape)))
    d = int(shape[axis])
    if b.rng.random() < 0.5:
        ind_shape = tuple(int(v) for v in b.rng.integers(1, 4, int(b.rng.integers(1, 3))))
        ind = b.rng.integers(-d, d, ind_shape).astype(np.int64)
        out = (*shape[:axis], *ind_shape, *shape[axis + 1:])
        b.node("Gather", [x, b.const(ind)], out, axis=axis)
        return
    upd_shape = [1] + [int(v) for v in shape[1:]]
    upd_shape[axis] = b.small(1, d) if d > 1 else 1
    order = np.argsort(b.rng.random([*upd_shape[:axis], d, *upd_shape[axis + 1:]]), axis=axis)
    ind = np.take(order, range(upd_shape[axis]), axis=axis).astype(np.int64)
    upd = b.rng.normal(0, 1, upd_shape).astype(np.float32)
    b.node("ScatterElements", [x, b.const(ind), b.const(upd)], shape, axis=axis)


def reduce(b) -> None:
    """ReduceSum (axes input), ReduceMean or ReduceMax (axes attribute), keepdims either way."""
    x = b.pick(min_rank=2)
    shape = b.shapes[x]
    count = int(b.rng.integers(1, len(shape)))
    axes = sorted(int(a) + 1 for a in b.rng.choice(len(shape) - 1, count, replace=False))
    keep = int(b.rng.integers(0, 2))
    out = tuple(1 if i in axes else d for i, d in enumerate(shape) if keep or i not in axes)
    op = str(b.rng.choice(["ReduceSum", "ReduceMean", "ReduceMax"]))
    if op == "ReduceSum":
        b.node(op, [x, b.const(np.array(axes, dtype=np.int64))], out, keepdims=keep)
    else:
        b.node(op, [x], out, axes=axes, keepdims=keep)


def normalize(b) -> None:
    """Softmax over the last axis, or LayerNormalization with scale and bias."""
    x = b.pick(min_rank=2)
    shape = b.shapes[x]
    if b.rng.random() < 0.5:
        b.node("Softmax", [x], shape, axis=-1)
        return
    d = int(shape[-1])
    scale = b.const(b.rng.normal(1, 0.2, (d,)).astype(np.float32))
    bias = b.const(b.rng.normal(0, 0.2, (d,)).astype(np.float32))
    b.node("LayerNormalization", [x, scale, bias], shape, axis=-1, epsilon=1e-5)


def attention(b) -> None:
    """softmax(Q K^T * scale + mask) V with Q, K, V projections of one (lead, S, D) tensor."""
    x = b.pick(rank=3)
    n, s, d = b.shapes[x]
    s, d, e = int(s), int(d), b.small(2, 8)
    q, k, v = (b.node("MatMul", [x, b.weight(d, e)], (n, s, e), pool=False) for _ in range(3))
    kt = b.node("Transpose", [k], (n, e, s), pool=False, perm=[0, 2, 1])
    scores = b.node("MatMul", [q, kt], (n, s, s), pool=False)
    scaled = b.node("Mul", [scores, b.const(np.float32(1.0 / np.sqrt(e)))], (n, s, s),
                    pool=False)
    mask = np.triu(np.full((s, s), -1e4, dtype=np.float32), 1)
    masked = b.node("Add", [scaled, b.const(mask)], (n, s, s), pool=False)
    probs = b.node("Softmax", [masked], (n, s, s), pool=False, axis=-1)
    b.node("MatMul", [probs, v], (n, s, e))


def if_branches(b) -> None:
    """An ``If`` on a bool input whose branches read a tensor still read after it."""
    a = b.pick()
    shape = list(b.shapes[a])
    cond = b.add_input((), dtype=TensorProto.BOOL, pool=False)
    branches = []
    for stem, op, last in (("then", "Add", "Relu"), ("else", "Mul", "Sigmoid")):
        c = b.const(b.rng.normal(0, 1, _rest(shape)[-1:]).astype(np.float32))
        mid, out = b.name(stem), b.name(stem)
        nodes = [helper.make_node(op, [a, c], [mid], name=f"n_{mid}"),
                 helper.make_node(last, [mid], [out], name=f"n_{out}")]
        branches.append(helper.make_graph(nodes, f"{stem}_branch", [], [
            helper.make_tensor_value_info(out, TensorProto.FLOAT, shape)]))
    res = b.node("If", [cond], tuple(shape), pool=False, then_branch=branches[0],
                 else_branch=branches[1])
    b.node("Add", [res, a], tuple(shape))


MOTIFS = {"elementwise": elementwise, "matmul": matmul, "conv": conv, "views": views,
          "concat_split_slice": concat_split_slice, "gather_scatter": gather_scatter,
          "reduce": reduce, "normalize": normalize, "attention": attention,
          "if": if_branches}
"""Motif name -> function(builder)."""
