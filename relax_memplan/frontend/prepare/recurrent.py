"""Converter step ``recurrent``: ONNX ``LSTM`` and ``GRU``, which TVM 0.27 cannot import.

Each node becomes

1. the input projection for every step at once, one Relax ``matmul``
   ``X[seq*batch, input] · Wᵀ[directions, input, gates*hidden]`` plus the biases that
   can be added before the recurrence (a Relax op, so our fusion and matmul schedules
   apply to it, and the planner sees an ordinary temporary);
2. one ``call_tir`` of a time-loop kernel from :mod:`relax_memplan.kernels.recurrence`
   that writes ``Y``, ``Y_h`` (and ``Y_c``) directly; no tensor is allocated per step.

Supported: ``direction`` forward, reverse, bidirectional; ``initial_h``/``initial_c``
present or absent; ``sequence_lens`` absent or a constant equal to the (static) sequence
length everywhere; the ONNX default activations (LSTM sigmoid/tanh/tanh, GRU
sigmoid/tanh, with ``linear_before_reset`` 0 or 1); ``layout`` 0 and 1 (1 by transposes
around the kernel); float32; a symbolic sequence length and batch.  Anything else
(peepholes ``P``, ``clip``, ``input_forget``, other activations, a run-time
``sequence_lens``) raises ``NotImplementedError`` with one line that TVM's importer
wrapper turns into an :class:`~relax_memplan.errors.UnsupportedOperatorError` naming the
node.  Equations: the ONNX operator specification of ``LSTM`` (opset 7/14) and ``GRU``.
"""

from __future__ import annotations

import numpy as np
import tvm
from tvm import relax, tirx
from tvm.relax.frontend.onnx import onnx_frontend as _tvm_onnx

from .loop_facts import record_loop, tensor_bytes
from ...kernels.recurrence import RecurrenceSpec, gru_kernel, last_step_kernel, lstm_kernel

__all__ = ["LSTMConverter", "GRUConverter", "RECURRENT_CONVERTERS"]

_DEFAULT_ACTIVATIONS = {"LSTM": ("sigmoid", "tanh", "tanh"), "GRU": ("sigmoid", "tanh")}


def _text(value) -> str:
    return value.decode() if isinstance(value, bytes) else str(value)


def _node(attr) -> str:
    return attr.get("tvm_custom", {}).get("name", "")


def _check_attrs(op_type: str, attr: dict, num_directions: int) -> None:
    name = attr.get("tvm_custom", {}).get("name", "")
    where = f"{op_type} node '{name}'"
    acts = attr.get("activations")
    if acts is not None:
        given = tuple(_text(a).lower() for a in acts)
        if given != _DEFAULT_ACTIVATIONS[op_type] * num_directions:
            raise NotImplementedError(
                f"{where}: activations {list(given)} are not supported, only the ONNX "
                f"defaults {list(_DEFAULT_ACTIVATIONS[op_type])}"
            )
    if attr.get("clip") is not None:
        raise NotImplementedError(f"{where}: attribute clip is not supported")
    if int(attr.get("input_forget", 0)):
        raise NotImplementedError(f"{where}: input_forget=1 is not supported")
    if int(attr.get("layout", 0)) not in (0, 1):
        raise NotImplementedError(f"{where}: layout {attr.get('layout')} is not 0 or 1")


def _shape(expr, what: str, where: str, rank: int) -> list:
    ty = getattr(expr, "ty", None)
    if not isinstance(ty, relax.TensorType) or not isinstance(ty.shape, relax.ShapeExpr):
        raise NotImplementedError(f"{where}: the shape of {what} is unknown")
    dims = list(ty.shape.values)
    if len(dims) != rank:
        raise NotImplementedError(f"{where}: {what} has rank {len(dims)}, expected {rank}")
    if ty.dtype != "float32":
        raise NotImplementedError(f"{where}: {what} is {ty.dtype}; only float32 is supported")
    return dims


def _check_sequence_lens(seq_lens, seq, where: str) -> None:
    """Accept ``sequence_lens`` only when it provably equals ``seq`` for every batch row."""
    if seq_lens is None:
        return
    if not isinstance(seq_lens, tvm.ir.GenericConst):
        raise NotImplementedError(
            f"{where}: sequence_lens given at run time is not supported (only absent or a "
            "constant equal to the sequence length)"
        )
    values = seq_lens.value.numpy().reshape(-1)
    if not isinstance(seq, tirx.IntImm) or np.any(values != int(seq)):
        raise NotImplementedError(
            f"{where}: sequence_lens {values.tolist()} is not the full sequence length "
            f"{seq} for every batch row; partial sequences are not supported"
        )


def _constant(value):
    """The numpy value of a Relax constant, else None."""
    return value.value.numpy() if isinstance(value, tvm.ir.GenericConst) else None


def _transposed(weight):
    """``[directions, a, b] -> [directions, b, a]``; folded here when ``weight`` is a
    constant (an initializer), so that no transpose runs per call."""
    array = _constant(weight)
    if array is not None:
        return relax.const(np.ascontiguousarray(array.transpose(0, 2, 1)))
    return relax.op.permute_dims(weight, [0, 2, 1])


def _bias_array(bias, spec, gates: int, where: str) -> np.ndarray:
    """ONNX ``B`` as numpy ``[directions, 2*gates*hidden]`` (``Wb`` then ``Rb``); zeros
    when absent.  Folded at import so no bias arithmetic runs per call."""
    shape = (spec.num_directions, 2 * gates * spec.hidden)
    if bias is None:
        return np.zeros(shape, "float32")
    array = _constant(bias)
    if array is None:
        raise NotImplementedError(f"{where}: a bias B given at run time is not supported")
    if array.shape != shape:
        raise NotImplementedError(f"{where}: B has shape {list(array.shape)}, expected "
                                  f"{list(shape)}")
    return array.astype("float32")


class _Recurrent:
    """Shared plumbing of the LSTM and GRU converters (not a TVM converter itself)."""

    op_type = ""
    num_gates = 0

    @classmethod
    def _setup(cls, inputs, attr):
        """Check the node; return (where, spec, x [seq, batch, input] (layout 0), layout)."""
        name = attr.get("tvm_custom", {}).get("name", "")
        where = f"{cls.op_type} node '{name}'"
        direction = _text(attr.get("direction", b"forward"))
        if direction not in ("forward", "reverse", "bidirectional"):
            raise NotImplementedError(f"{where}: direction {direction!r} is not supported")
        spec = RecurrenceSpec(hidden=int(attr["hidden_size"]), directions=direction)
        _check_attrs(cls.op_type, attr, spec.num_directions)
        layout = int(attr.get("layout", 0))
        x = inputs[0]
        _shape(x, "X", where, 3)
        if layout == 1:
            x = relax.op.permute_dims(x, [1, 0, 2])
        return where, spec, x, layout

    @classmethod
    def _projection(cls, bb, x, w, bias, where):
        """``X · Wᵀ + bias`` for every step: ``[directions, seq, batch, gates*hidden]``."""
        seq, batch, size = _shape(bb.normalize(x), "X", where, 3)
        dirs, gh, w_in = _shape(w, "W", where, 3)
        flat = relax.op.reshape(x, relax.ShapeExpr([1, seq * batch, size]))
        xw = relax.op.matmul(flat, _transposed(w))
        xw = relax.op.add(xw, relax.const(np.ascontiguousarray(bias[:, None, :])))
        return relax.op.reshape(xw, relax.ShapeExpr([dirs, seq, batch, gh])), seq, batch

    @staticmethod
    def _state(bb, value, spec, batch, layout):
        """An initial state as ``[directions, batch, hidden]`` (zeros when absent)."""
        shape = relax.ShapeExpr([spec.num_directions, batch, spec.hidden])
        if value is None:
            return relax.op.zeros(shape, "float32")
        return relax.op.permute_dims(value, [1, 0, 2]) if layout == 1 else value

    @staticmethod
    def _outputs(bb, spec, call, h0, c0=None):
        """``Y``, ``Y_h`` (and ``Y_c``) from the recurrence call, each from a
        single-output call (see :mod:`relax_memplan.kernels.recurrence` for why)."""
        result = bb.emit(call)
        y = bb.emit(relax.TupleGetItem(result, 0))
        state_ty = relax.TensorType(h0.ty.shape, "float32")
        last = bb.add_func(last_step_kernel(spec), "recurrence_last_step")
        items = [y, bb.emit(relax.call_tir(last, [y, h0], out_ty=state_ty))]
        if c0 is not None:  # the LSTM cell state, [1, D, batch, H]: a one-step sequence
            cell = bb.emit(relax.TupleGetItem(result, 1))
            items.append(bb.emit(relax.call_tir(last, [cell, c0], out_ty=state_ty)))
        return items

    @staticmethod
    def _in_layout(bb, items, layout):
        """The outputs in the node's ``layout`` (1: batch first, by transposes)."""
        if layout == 1:
            items[0] = bb.emit(relax.op.permute_dims(items[0], [2, 0, 1, 3]))
            items[1:] = [bb.emit(relax.op.permute_dims(v, [1, 0, 2])) for v in items[1:]]
        return relax.Tuple(items)


class LSTMConverter(_Recurrent, _tvm_onnx.OnnxOpConverter):
    """ONNX ``LSTM`` (opset 7 and 14) as a projection ``matmul`` and one recurrence kernel."""

    op_type = "LSTM"

    @classmethod
    def _impl_v7(cls, bb, inputs, attr, params):
        where, spec, x, layout = cls._setup(inputs, attr)
        w, r, bias = inputs[1], inputs[2], inputs[3]
        if len(inputs) > 7 and inputs[7] is not None:
            raise NotImplementedError(f"{where}: peephole weights P are not supported")
        gh = 4 * spec.hidden
        both = _bias_array(bias, spec, 4, where)
        xw, seq, batch = cls._projection(bb, x, w, both[:, :gh] + both[:, gh:], where)
        _check_sequence_lens(inputs[4] if len(inputs) > 4 else None, seq, where)
        h0 = cls._state(bb, inputs[5] if len(inputs) > 5 else None, spec, batch, layout)
        c0 = cls._state(bb, inputs[6] if len(inputs) > 6 else None, spec, batch, layout)
        cell_ty = relax.TensorType([1, spec.num_directions, batch, spec.hidden], "float32")
        y_ty = relax.TensorType([seq, spec.num_directions, batch, spec.hidden], "float32")
        kernel = bb.add_func(lstm_kernel(spec), "lstm_recurrence")
        h0, c0 = bb.emit(h0), bb.emit(c0)
        call = relax.call_tir(kernel, [bb.normalize(v) for v in (xw, _transposed(r), h0, c0)],
                              out_ty=[y_ty, cell_ty])
        record_loop(node=_node(attr), op="LSTM", form="kernel", iterations=seq,
                    carried_state_bytes=tensor_bytes(h0) * 2, body_bytes=0)
        return cls._in_layout(bb, cls._outputs(bb, spec, call, h0, c0), layout)



class GRUConverter(_Recurrent, _tvm_onnx.OnnxOpConverter):
    """ONNX ``GRU`` (opset 7 and 14) as a projection ``matmul`` and one recurrence kernel."""

    op_type = "GRU"

    @classmethod
    def _impl_v7(cls, bb, inputs, attr, params):
        where, spec, x, layout = cls._setup(inputs, attr)
        w, r, bias = inputs[1], inputs[2], inputs[3]
        lbr = bool(int(attr.get("linear_before_reset", 0)))
        hidden, dirs = spec.hidden, spec.num_directions
        gh = 3 * hidden
        both = _bias_array(bias, spec, 3, where)
        wb, rb = both[:, :gh], both[:, gh:].copy()
        rbh = relax.const(np.ascontiguousarray(rb[:, 2 * hidden:]))
        if lbr:  # Rbh is inside r ⊙ (...): the kernel adds it; z and r take Rb here
            rb[:, 2 * hidden:] = 0
        xw, seq, batch = cls._projection(bb, x, w, wb + rb, where)
        _check_sequence_lens(inputs[4] if len(inputs) > 4 else None, seq, where)
        h0 = cls._state(bb, inputs[5] if len(inputs) > 5 else None, spec, batch, layout)
        y_ty = relax.TensorType([seq, dirs, batch, hidden], "float32")
        scratch_ty = relax.TensorType([batch, hidden], "float32")
        kernel = bb.add_func(gru_kernel(spec, lbr), "gru_recurrence")
        h0 = bb.emit(h0)
        call = relax.call_tir(kernel, [bb.normalize(v) for v in (xw, _transposed(r), rbh, h0)],
                              out_ty=[y_ty, scratch_ty])
        record_loop(node=_node(attr), op="GRU", form="kernel", iterations=seq,
                    carried_state_bytes=tensor_bytes(h0),
                    body_bytes=0 if lbr else tensor_bytes(relax.Var("s", scratch_ty)))
        return cls._in_layout(bb, cls._outputs(bb, spec, call, h0), layout)



RECURRENT_CONVERTERS = {"LSTM": LSTMConverter, "GRU": GRUConverter}
"""Op type to converter, installed by the converter step ``recurrent``."""
