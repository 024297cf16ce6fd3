"""Converter step ``onnx_attention``: the standard ONNX ``Attention`` operator (opset 23 on).

TVM 0.27 maps op type ``Attention`` to its converter of onnxruntime's ``com.microsoft``
``Attention`` (one fused QKV projection weight, other inputs and attributes), whatever the
node's domain; its importer keys the converter table by op type only and passes no domain.
This step installs one converter for ``Attention`` that reads the domain of the node being
converted (recorded while :class:`node_tracking` is active, from the ``NodeProto`` TVM's
``ONNXGraphImporter._parse_value_proto`` is given right before each conversion): a
``com.microsoft`` (or any other non-standard) node goes to TVM's converter unchanged, an
``ai.onnx`` node is converted here.  A node inside an ``If`` branch is not seen that way; it is
told apart by its attributes (``com.microsoft`` requires ``num_heads``, which the standard
operator does not have).

An ``ai.onnx`` node becomes the plain Relax decomposition of the ONNX specification
(https://onnx.ai/onnx/operators/onnx__Attention.html), the form
:class:`~relax_memplan.transform.fuse_attention.FuseAttention` matches::

    q, k, v   3-D (B, S, H*D): reshape (B, S, H, D), permute (0, 2, 1, 3)
    k, v      concat(past, k) on the sequence axis (present_key, present_value)
    k, v      repeat(k, Hq // Hkv, axis=1) (grouped-query / multi-query heads)
    scores    matmul(q, permute(k, (0, 1, 3, 2))) * scale     (qk_matmul_output, mode 0)
              tanh(scores / softcap) * softcap                (softcap > 0)
              scores + mask (float)  |  where(mask, scores, -inf) (bool)
              where(j <= i + past_length, scores, -inf)       (is_causal)
    p         softmax(scores, -1) [in softmax_precision];  where(isnan(p), 0, p) with a mask
    y         matmul(p, v); 3-D: permute (0, 2, 1, 3), reshape (B, S, Hq*Dv)

``scale`` defaults to ``1/sqrt(D)``.  A fully masked query row gives a zero output row, as the
specification and onnxruntime do (the ``isnan`` guard, added when ``attn_mask`` is given; it
also zeroes a row whose scores are NaN).  ``attn_mask`` broadcasts to ``(B, Hq, Sq, T)``
(``T = past + Skv``) and its last dim must be ``T`` (onnxruntime's rule); a symbolic dim that is
not provably the one expected is checked at run time (``match_cast``).

Refused with ``NotImplementedError`` naming the node (TVM's importer wrapper makes it an
:class:`~relax_memplan.errors.UnsupportedOperatorError`): ``qk_matmul_output_mode`` other than
0 when ``qk_matmul_output`` is an output, ``nonpad_kv_seqlen`` (opset 24), a sliding window
(opset 25), only one of ``past_key``/``past_value``, an integer mask, Q, K, V of different
dtypes, head counts that do not divide, a symbolic head dim without ``scale``, a ``scale`` that is
not positive (onnxruntime refuses it too), and a model whose default opset is below 23.
"""

from __future__ import annotations

import math
import threading

import onnx
import tvm
from tvm import relax, tirx
from tvm.relax.frontend.onnx import onnx_frontend as _tvm_onnx

__all__ = ["onnx_attention_converter", "node_tracking"]

_state = threading.local()
_FIRST_OPSET = 23
_SOFTMAX_DTYPES = {onnx.TensorProto.FLOAT: "float32", onnx.TensorProto.FLOAT16: "float16",
                   onnx.TensorProto.DOUBLE: "float64"}


class node_tracking:  # noqa: N801 -- used as a context manager, like contextlib's
    """While active, remember the ``NodeProto`` TVM's importer is about to convert (its
    domain and output names); restores ``ONNXGraphImporter._parse_value_proto`` on exit."""

    def __enter__(self):
        cls = _tvm_onnx.ONNXGraphImporter
        self._saved = saved = cls._parse_value_proto

        def parse_value_proto(importer, value_proto):
            if isinstance(value_proto, onnx.NodeProto):
                _state.node = value_proto
            return saved(importer, value_proto)

        cls._parse_value_proto = parse_value_proto
        return self

    def __exit__(self, *exc):
        _tvm_onnx.ONNXGraphImporter._parse_value_proto = self._saved
        _state.node = None
        return False


def _tracked_node(attr):
    """The tracked node when it is the one ``attr`` belongs to, else None."""
    node = getattr(_state, "node", None)
    name = attr.get("tvm_custom", {}).get("name", "")
    if node is not None and node.op_type == "Attention" and node.name == name:
        return node
    return None


def _is_standard(node, attr) -> bool:
    if node is not None:
        return node.domain in ("", "ai.onnx")
    return "num_heads" not in attr


def onnx_attention_converter(base, record):
    """A converter for op type ``Attention``: ``ai.onnx`` nodes by the decomposition of the
    module docstring, other domains by ``base`` (TVM's converter).

    Parameters
    ----------
    base : type
        TVM's ``Attention`` converter class.
    record : callable
        ``record(op_type)``, called once per ``ai.onnx`` node converted here.

    Returns
    -------
    type
        A converter class (``get_converter(opset)`` as TVM's importer calls it).
    """

    class OnnxAttention(base):
        @classmethod
        def get_converter(cls, opset):
            def convert(bb, inputs, attr, params):
                node = _tracked_node(attr)
                if not _is_standard(node, attr):
                    return base.get_converter(opset)(bb, inputs, attr, params)
                name = attr.get("tvm_custom", {}).get("name", "")
                if not name and node is not None and node.output:
                    name = node.output[0]  # an unnamed node, named as the importer's errors do
                where = f"Attention node '{name}'"
                if opset < _FIRST_OPSET:
                    raise NotImplementedError(
                        f"{where}: ai.onnx Attention needs opset {_FIRST_OPSET} or later; the "
                        f"model's default opset is {opset}")
                record("Attention")
                outputs = (list(node.output) if node is not None else
                           ["y"] * attr.get("tvm_custom", {}).get("num_outputs", 1))
                return _convert(bb, list(inputs), attr, outputs, where)

            return convert

    return OnnxAttention


# ----------------------------------------------------------------------------- checks
def _dims(expr, what: str, where: str) -> list:
    ty = getattr(expr, "ty", None)
    if not isinstance(ty, relax.TensorType) or not isinstance(ty.shape, relax.ShapeExpr):
        raise NotImplementedError(f"{where}: the shape of {what} is unknown")
    return list(ty.shape.values)


def _text(dims) -> str:
    return "(" + ", ".join(str(int(d)) if isinstance(d, tirx.IntImm) else str(d)
                           for d in dims) + ")"


def _static(dim):
    return int(dim) if isinstance(dim, tirx.IntImm) else None


def _check_attrs(attr, inputs, outputs, where):
    mode = int(attr.get("qk_matmul_output_mode", 0))
    if mode != 0 and len(outputs) > 3 and outputs[3]:
        raise NotImplementedError(
            f"{where}: qk_matmul_output_mode {mode} is not supported (only 0, the scaled "
            "Q·Kᵀ before softcap and mask)")
    if len(inputs) > 6 and inputs[6] is not None:
        raise NotImplementedError(f"{where}: input nonpad_kv_seqlen is not supported")
    for window in ("left_window_size", "right_window_size"):
        if int(attr.get(window, -1)) != -1:
            raise NotImplementedError(f"{where}: {window} {attr[window]} (a sliding window) "
                                      "is not supported")
    past = [len(inputs) > i and inputs[i] is not None for i in (4, 5)]
    if past[0] != past[1]:
        raise NotImplementedError(f"{where}: past_key and past_value must be given together")
    precision = int(attr.get("softmax_precision", 0))
    if precision and precision not in _SOFTMAX_DTYPES:
        raise NotImplementedError(f"{where}: softmax_precision {precision} is not supported "
                                  "(float, float16 or double)")
    if "scale" in attr and not float(attr["scale"]) > 0:
        raise NotImplementedError(f"{where}: scale {attr['scale']} is not positive (Q and K "
                                  "are scaled by its square root)")
    if float(attr.get("softcap", 0.0)) < 0:
        raise NotImplementedError(f"{where}: softcap {attr['softcap']} is negative")


def _fit(bb, expr, expected, what, where, broadcast=False):
    """``expr`` with each dim checked against ``expected`` (None: any; with ``broadcast``, 1
    except on the last axis): a static mismatch is an error, a symbolic dim not provably the
    expected one is cast to it (a run-time check)."""
    dims = _dims(expr, what, where)
    analyzer = tvm.sym.Analyzer()
    fitted, changed = list(dims), False
    offset = len(expected) - len(dims)
    if offset < 0:
        raise NotImplementedError(f"{where}: {what} {_text(dims)} has more than "
                                  f"{len(expected)} dims")
    for axis, dim in enumerate(dims):
        want = expected[offset + axis]
        if want is None or analyzer.can_prove_equal(dim, want):
            continue
        if broadcast and axis < len(dims) - 1 and _static(dim) == 1:
            continue
        if _static(dim) is not None and _static(want) is not None:
            raise NotImplementedError(
                f"{where}: {what} {_text(dims)} does not fit "
                f"{_text([d if d is not None else '_' for d in expected[offset:]])}")
        fitted[axis], changed = want, True
    if not changed:
        return expr
    if not isinstance(expr, relax.Var):
        expr = bb.emit(expr)
    return bb.match_cast(expr, relax.TensorType(fitted, expr.ty.dtype))


# ----------------------------------------------------------------------------- decomposition
def _heads_first(bb, x, heads, what, where):
    """3-D ``(B, S, H*D)`` as ``(B, H, S, D)``."""
    batch, seq, hidden = _dims(x, what, where)
    if _static(hidden) is None or int(hidden) % heads:
        raise NotImplementedError(f"{where}: {what} hidden size {hidden} is not a multiple of "
                                  f"{heads} heads")
    split = relax.op.reshape(x, relax.ShapeExpr([batch, seq, heads, int(hidden) // heads]))
    return bb.emit(relax.op.permute_dims(split, [0, 2, 1, 3]))


def _as_4d(bb, q, k, v, attr, where):
    """(q, k, v) as ``(B, H, S, D)``, and whether the inputs were 3-D."""
    ranks = {len(_dims(x, n, where)) for x, n in ((q, "Q"), (k, "K"), (v, "V"))}
    if ranks == {4}:
        for name, x, axis in (("q_num_heads", q, 1), ("kv_num_heads", k, 1)):
            given, dim = int(attr.get(name, 0)), _dims(x, "", where)[axis]
            if given and _static(dim) is not None and given != int(dim):
                raise NotImplementedError(f"{where}: {name} {given} differs from the "
                                          f"inputs' {int(dim)} heads")
        return q, k, v, False
    if ranks != {3}:
        raise NotImplementedError(f"{where}: Q, K and V must all be 3-D or all 4-D")
    q_heads, kv_heads = int(attr.get("q_num_heads", 0)), int(attr.get("kv_num_heads", 0))
    if q_heads <= 0 or kv_heads <= 0:
        raise NotImplementedError(f"{where}: 3-D inputs need q_num_heads and kv_num_heads")
    return (_heads_first(bb, q, q_heads, "Q", where), _heads_first(bb, k, kv_heads, "K", where),
            _heads_first(bb, v, kv_heads, "V", where), True)


def _group_repeats(q_heads, kv_heads, where) -> int:
    if tvm.sym.Analyzer().can_prove_equal(q_heads, kv_heads):
        return 1
    hq, hkv = _static(q_heads), _static(kv_heads)
    if hq is None or hkv is None or hkv == 0 or hq % hkv:
        raise NotImplementedError(f"{where}: {q_heads} query heads are not a multiple of "
                                  f"{kv_heads} key/value heads")
    return hq // hkv


def _scale(attr, head_dim, where) -> float:
    if "scale" in attr:
        return float(attr["scale"])
    if _static(head_dim) is None:
        raise NotImplementedError(f"{where}: the default scale needs a static head size, "
                                  f"not {head_dim}")
    return 1.0 / math.sqrt(int(head_dim))


def _causal(bb, queries, keys, past):
    """``j <= i + past`` over ``(queries, keys)``, bool."""
    zero = tirx.IntImm("int64", 0)
    rows = relax.op.arange(past, past + queries, 1, "int64")
    cols = relax.op.arange(zero, keys, 1, "int64")
    return bb.emit(relax.op.less_equal(relax.op.reshape(cols, relax.ShapeExpr([1, keys])),
                                       relax.op.reshape(rows, relax.ShapeExpr([queries, 1]))))


def _masked(bb, scores, mask, causal, dtype, where):
    """The scores with the float or bool mask and the causal mask applied."""
    minus_inf = relax.const(float("-inf"), dtype)
    if mask is not None:
        mask_dtype = mask.ty.dtype
        if mask_dtype == "bool":
            scores = bb.emit(relax.op.where(mask, scores, minus_inf))
        elif mask_dtype == dtype:
            scores = bb.emit(relax.op.add(scores, mask))
        else:
            raise NotImplementedError(f"{where}: attn_mask of dtype {mask_dtype} is not "
                                      f"supported (bool, or {dtype} like Q)")
    if causal is not None:
        scores = bb.emit(relax.op.where(causal, scores, minus_inf))
    return scores


def _keys_values(bb, q, k, v, past_k, past_v, where):
    """(k, v) with the past concatenated, checked against q, and the past length."""
    batch, _, _, head_dim = _dims(q, "Q", where)
    k = _fit(bb, k, [batch, None, None, head_dim], "K", where)
    _, kv_heads, kv_len, _ = _dims(k, "K", where)
    v = _fit(bb, v, [batch, kv_heads, kv_len, None], "V", where)
    if past_k is None:
        return k, v, tirx.IntImm("int64", 0)
    past_k = _fit(bb, past_k, [batch, kv_heads, None, head_dim], "past_key", where)
    past_len = _dims(past_k, "past_key", where)[2]
    past_v = _fit(bb, past_v, [batch, kv_heads, past_len, _dims(v, "V", where)[3]],
                  "past_value", where)
    return (bb.emit(relax.op.concat([past_k, k], axis=2)),
            bb.emit(relax.op.concat([past_v, v], axis=2)), past_len)


def _probabilities(bb, scores, attr, mask, causal, where):
    """softmax of the scores after softcap and masks, in the node's softmax precision."""
    dtype = scores.ty.dtype
    softcap = float(attr.get("softcap", 0.0))
    if softcap > 0:
        cap = relax.const(softcap, dtype)
        scores = bb.emit(relax.op.multiply(relax.op.tanh(relax.op.divide(scores, cap)), cap))
    scores = _masked(bb, scores, mask, causal, dtype, where)
    softmax_dtype = _SOFTMAX_DTYPES.get(int(attr.get("softmax_precision", 0)), dtype)
    if softmax_dtype != dtype:
        scores = bb.emit(relax.op.astype(scores, softmax_dtype))
    probs = bb.emit(relax.op.nn.softmax(scores, axis=-1))
    if mask is not None:  # a fully masked row: zeros, not NaN
        nan = bb.emit(relax.op.isnan(probs))
        probs = bb.emit(relax.op.where(nan, relax.const(0.0, softmax_dtype), probs))
    if softmax_dtype != dtype:
        probs = bb.emit(relax.op.astype(probs, dtype))
    return probs


def _convert(bb, inputs, attr, outputs, where):
    _check_attrs(attr, inputs, outputs, where)
    inputs = inputs + [None] * (6 - len(inputs))
    q, k, v, mask, past_k, past_v = (bb.normalize(x) if x is not None else None
                                     for x in inputs[:6])
    _dims(q, "Q", where)
    dtype = q.ty.dtype
    if {k.ty.dtype, v.ty.dtype} != {dtype}:
        raise NotImplementedError(f"{where}: Q, K, V of dtypes {dtype}, {k.ty.dtype}, "
                                  f"{v.ty.dtype}; one dtype is supported")
    q, k, v, three_d = _as_4d(bb, q, k, v, attr, where)
    batch, q_heads, queries, head_dim = _dims(q, "Q", where)
    present_k, present_v, past_len = _keys_values(bb, q, k, v, past_k, past_v, where)
    total, value_dim = _dims(present_v, "V", where)[2:]
    k, v = present_k, present_v
    repeats = _group_repeats(q_heads, _dims(k, "K", where)[1], where)
    if repeats > 1:
        k = bb.emit(relax.op.repeat(k, repeats, axis=1))
        v = bb.emit(relax.op.repeat(v, repeats, axis=1))
    qk = bb.emit(relax.op.matmul(q, relax.op.permute_dims(k, [0, 1, 3, 2])))
    scores = bb.emit(relax.op.multiply(qk, relax.const(_scale(attr, head_dim, where), dtype)))
    if mask is not None:
        mask = _fit(bb, mask, [batch, q_heads, queries, total], "attn_mask", where,
                    broadcast=True)
    causal = _causal(bb, queries, total, past_len) if int(attr.get("is_causal", 0)) else None
    y = relax.op.matmul(_probabilities(bb, scores, attr, mask, causal, where), v)
    if three_d:
        y = bb.emit(relax.op.permute_dims(bb.emit(y), [0, 2, 1, 3]))
        y = relax.op.reshape(y, relax.ShapeExpr([batch, queries, q_heads * value_dim]))
    if len(outputs) == 1:
        return y
    y = bb.emit(y)
    items = [y, present_k, present_v, scores if len(outputs) > 3 and outputs[3] else y]
    return relax.Tuple(items[:len(outputs)])
