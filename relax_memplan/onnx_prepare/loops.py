"""Converter step ``unroll_loops``: ONNX ``Scan`` and ``Loop`` with a small constant trip count.

TVM 0.27's ONNX importer has no ``Loop`` or ``Scan`` converter.  This step converts
them by **unrolling**: the body graph is converted once per iteration with TVM's own
subgraph converter (``ONNXGraphImporter._convert_subgraph``, the one ``If`` uses), the
loop-carried values of one iteration bound to the body inputs of the next.

Why unrolling, and when
-----------------------
Relax has no loop construct the VM runs without a function call per iteration (a
recursive Relax function allocates its body's tensors on every call).  Unrolled, every
iteration's tensors are ordinary bindings of one function: our planner sees their live
ranges, the body of iteration ``t + 1`` reuses the arena region that iteration ``t``
freed, loop-carried state takes two alternating slots, and nothing is allocated per
iteration at run time (one arena per call, as for any graph).  The price is code size
proportional to the trip count, so it is used only when the trip count is a compile-time
constant of at most :data:`MAX_UNROLLED_ITERATIONS`:

* ``Loop``: trip count ``M`` a constant; ``cond`` absent or a constant true; the body's
  condition output provably true (a constant, or the incoming condition passed through).
* ``Scan`` (opset 9+): every scan input's scanned axis has a static length; forward
  directions only.

What still costs memory: each iteration's scan-output element stays live until the
final ``stack`` copies them into the output (Relax has no in-place write into a slice
of the output), so the scan outputs take twice their size at the peak.  Carried state
and the rest of the body are freed after the next iteration reads them.

Anything else (a while loop, a symbolic trip count or scan length, a run-time condition,
reverse scan directions) raises ``NotImplementedError`` with one line, turned into an
:class:`~relax_memplan.errors.UnsupportedOperatorError` naming the node.  Recurrences
with a symbolic length should use ``LSTM``/``GRU`` (step ``recurrent``: one kernel).
"""

from __future__ import annotations

import threading

import numpy as np
import tvm
from tvm import relax, tirx
from tvm.relax.frontend.onnx import onnx_frontend as _tvm_onnx

from .loop_facts import record_loop, tensor_bytes

__all__ = ["LoopConverter", "ScanConverter", "LOOP_CONVERTERS", "MAX_UNROLLED_ITERATIONS",
           "importer_tracking"]

MAX_UNROLLED_ITERATIONS = 64
"""Largest trip count unrolled (iterations); the IR grows linearly with it."""

_state = threading.local()


class importer_tracking:  # noqa: N801 -- used as a context manager, like contextlib's
    """While active, remember the ``ONNXGraphImporter`` converting nodes (the loop
    converters need it to convert a body graph); restores TVM's method on exit."""

    def __enter__(self):
        cls = _tvm_onnx.ONNXGraphImporter
        self._saved = cls._construct_nodes
        saved = self._saved

        def construct_nodes(importer, graph):
            previous = getattr(_state, "importer", None)
            _state.importer = importer
            try:
                return saved(importer, graph)
            finally:
                _state.importer = previous

        cls._construct_nodes = construct_nodes
        return self

    def __exit__(self, *exc):
        _tvm_onnx.ONNXGraphImporter._construct_nodes = self._saved
        _state.importer = None
        return False


def _where(op_type, attr):
    return f"{op_type} node '{attr.get('tvm_custom', {}).get('name', '')}'"


def _run_body(bb, body, bindings: dict, where: str) -> list:
    """Convert ``body`` once with its inputs bound to ``bindings``; its outputs, emitted."""
    importer = getattr(_state, "importer", None)
    if importer is None:
        raise NotImplementedError(f"{where}: no ONNX importer is active")
    saved = dict(importer._nodes)
    importer._nodes.update(bindings)
    try:
        result = importer._convert_subgraph(bb, body)
    finally:
        importer._nodes = saved
    outputs = list(result.fields) if len(body.output) > 1 else [result]
    return [v if isinstance(v, (relax.Var, tvm.ir.GenericConst)) else bb.emit(v) for v in outputs]


def _stack(bb, values):
    return bb.emit(relax.op.stack(values, axis=0)) if values else None


def _constant_value(expr):
    return expr.value.numpy() if isinstance(expr, tvm.ir.GenericConst) else None


class LoopConverter(_tvm_onnx.OnnxOpConverter):
    """ONNX ``Loop`` with a constant trip count, unrolled (see the module docstring)."""

    @classmethod
    def _impl_v11(cls, bb, inputs, attr, params):
        where = _where("Loop", attr)
        body = attr["body"]
        trip, cond = inputs[0], inputs[1]
        carried = list(inputs[2:])
        trip_value = _constant_value(trip) if trip is not None else None
        if trip_value is None:
            raise NotImplementedError(
                f"{where}: the trip count must be a constant (a while loop or a trip count "
                "computed at run time is not supported)")
        count = int(trip_value.reshape(-1)[0])
        if count > MAX_UNROLLED_ITERATIONS:
            raise NotImplementedError(f"{where}: trip count {count} is above the unroll "
                                      f"limit {MAX_UNROLLED_ITERATIONS}")
        if cond is not None and not _is_true(cond):
            raise NotImplementedError(f"{where}: the initial condition must be a constant true")
        true = relax.const(np.array(True))
        names = [v.name for v in body.input]
        carried_bytes = _total_bytes(carried)
        scans = [[] for _ in range(len(body.output) - 1 - len(carried))]
        for t in range(count):
            bindings = {names[0]: relax.const(np.array(t, "int64")), names[1]: true}
            bindings.update(zip(names[2:], carried))
            out = _run_body(bb, body, bindings, where)
            if not (out[0] is true or _is_true(out[0])):
                raise NotImplementedError(
                    f"{where}: the body's condition output is computed at run time (early "
                    "exit is not supported)")
            carried = out[1:1 + len(carried)]
            for values, v in zip(scans, out[1 + len(carried):]):
                values.append(v)
            body_bytes = _total_bytes(out[1:])
        if count == 0 and scans:
            raise NotImplementedError(f"{where}: scan outputs of a zero-trip loop")
        record_loop(node=attr["tvm_custom"]["name"], op="Loop", form="unrolled",
                    iterations=count, carried_state_bytes=carried_bytes,
                    body_bytes=body_bytes if count else 0)
        return _results(carried + [_stack(bb, v) for v in scans])




def _total_bytes(values) -> int:
    """Bytes of static-shaped tensor values (a symbolic one counts 0)."""
    sizes = [tensor_bytes(v) for v in values]
    return sum(int(n) for n in sizes if isinstance(n, (int, tirx.IntImm)))


def _is_true(expr) -> bool:
    value = _constant_value(expr)
    return value is not None and value.size == 1 and bool(value.reshape(-1)[0])


def _results(values):
    return values[0] if len(values) == 1 else relax.Tuple(values)


class ScanConverter(_tvm_onnx.OnnxOpConverter):
    """ONNX ``Scan`` (opset 9+) over a static length, unrolled (see the module docstring)."""

    @classmethod
    def _impl_v9(cls, bb, inputs, attr, params):
        where = _where("Scan", attr)
        body = attr["body"]
        num_scan = int(attr["num_scan_inputs"])
        states, xs = list(inputs[:len(inputs) - num_scan]), list(inputs[len(inputs) - num_scan:])
        for key in ("scan_input_directions", "scan_output_directions"):
            if any(int(v) for v in attr.get(key, ())):
                raise NotImplementedError(f"{where}: reverse {key} is not supported")
        in_axes = [int(a) for a in attr.get("scan_input_axes", [0] * num_scan)]
        out_axes = [int(a) for a in attr.get("scan_output_axes", ())]
        length = _scan_length(xs, in_axes, where)
        names = [v.name for v in body.input]
        num_out = len(body.output) - len(states)
        scans = [[] for _ in range(num_out)]
        carried_bytes, body_bytes = _total_bytes(states), 0
        for t in range(length):
            slices = [bb.emit(relax.op.squeeze(
                relax.op.strided_slice(x, axes=[a], begin=[t], end=[t + 1]), [a]))
                for x, a in zip(xs, in_axes)]
            out = _run_body(bb, body, dict(zip(names, states + slices)), where)
            states = out[:len(states)]
            for values, v in zip(scans, out[len(states):]):
                values.append(v)
            body_bytes = _total_bytes(out)
        record_loop(node=attr["tvm_custom"]["name"], op="Scan", form="unrolled",
                    iterations=length, carried_state_bytes=carried_bytes, body_bytes=body_bytes)
        stacked = []
        for k, values in enumerate(scans):
            axis = out_axes[k] if k < len(out_axes) else 0
            stacked.append(bb.emit(relax.op.stack(values, axis=axis)))
        return _results(states + stacked)




def _scan_length(xs, axes, where) -> int:
    lengths = set()
    for x, axis in zip(xs, axes):
        shape = getattr(x.ty, "shape", None)
        if not isinstance(shape, relax.ShapeExpr):
            raise NotImplementedError(f"{where}: a scan input's shape is unknown")
        dim = shape.values[axis]
        if not isinstance(dim, tirx.IntImm):
            raise NotImplementedError(
                f"{where}: scan length {dim} is symbolic; only a static length is unrolled")
        lengths.add(int(dim))
    if len(lengths) != 1:
        raise NotImplementedError(f"{where}: scan inputs of different lengths {sorted(lengths)}")
    length = lengths.pop()
    if length > MAX_UNROLLED_ITERATIONS:
        raise NotImplementedError(f"{where}: scan length {length} is above the unroll limit "
                                  f"{MAX_UNROLLED_ITERATIONS}")
    return length


LOOP_CONVERTERS = {"Loop": LoopConverter, "Scan": ScanConverter}
"""Op type to converter, installed by the converter step ``unroll_loops``."""
