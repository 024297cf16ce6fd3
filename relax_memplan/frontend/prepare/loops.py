"""Converter step ``unroll_loops``: ONNX ``Scan`` and ``Loop``, unrolled or recursive.

TVM 0.27's ONNX importer has no ``Loop`` or ``Scan`` converter.  This step converts them
in one of two forms; both convert the body graph with TVM's own subgraph converter
(``ONNXGraphImporter._convert_subgraph``, the one ``If`` uses).

Which form, when, and why
-------------------------
* **Unrolled** -- the trip count / scan length is a compile-time constant of at most
  :data:`MAX_UNROLLED_ITERATIONS`.  The body is converted once per iteration into
  ``main``, the carried values of one iteration bound to the body inputs of the next.
  Every iteration's tensors are ordinary bindings of one function: our planner sees their
  live ranges, iteration ``t + 1`` reuses the arena region iteration ``t`` freed, and
  there is no call per iteration, so it is the faster form.  Its price is code size
  proportional to the trip count, hence the limit.  Each iteration's scan-output element
  stays live until the final ``stack`` copies them into the output, so the scan outputs
  take twice their size at the peak.
* **Recursive** -- anything longer, a length known only at run time (a symbolic scan
  length, a trip count given as an input or computed from a shape), or a reversed scan.
  The body becomes a Relax function called by a self-calling driver function, the scan
  outputs are allocated once and written row by row in place
  (:mod:`~relax_memplan.frontend.prepare.recursive_loops`), and
  :class:`~relax_memplan.transform.hoist_loop_storage.HoistLoopStorage` moves the body's
  storage out of the loop, so an iteration allocates nothing.  Each iteration is a few VM
  calls, and the recursion depth is limited
  (:data:`~relax_memplan.frontend.prepare.recursive_loops.MAX_RECURSIVE_ITERATIONS`, checked
  at run time).

Supported: ``Loop`` with a trip count ``M`` (a constant, an input or a computed scalar),
``cond`` absent or a constant true and the body's condition output provably true (a
constant, or the incoming condition passed through), loop-carried values and scan outputs;
``Scan`` (opset 9+) with any scan axes and directions.  Bodies may read values of the
enclosing graph (passed to the recursive functions as loop-invariant parameters).

Anything else (a while loop, a run-time condition) raises ``NotImplementedError`` with one
line, turned into an :class:`~relax_memplan.errors.UnsupportedOperatorError` naming the
node.  Recurrences ``LSTM``/``GRU`` have their own step (``recurrent``: one kernel for the
whole time loop).
"""

from __future__ import annotations

import threading

import numpy as np
import tvm
from tvm import relax, tirx
from tvm.relax.frontend.onnx import onnx_frontend as _tvm_onnx

from .loop_facts import record_loop, tensor_bytes
from .recursive_loops import emit_recursive_loop, make_spec, outer_names, trip_count_var

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
    """ONNX ``Loop`` with a trip count: unrolled when it is a constant of at most
    :data:`MAX_UNROLLED_ITERATIONS`, else the recursive form (see the module docstring)."""

    @classmethod
    def _impl_v11(cls, bb, inputs, attr, params):
        where = _where("Loop", attr)
        body = attr["body"]
        trip, cond = inputs[0], inputs[1]
        carried = list(inputs[2:])
        if trip is None:
            raise NotImplementedError(f"{where}: a loop without a trip count (a while loop) "
                                      "is not supported")
        if cond is not None and not _is_true(cond):
            raise NotImplementedError(f"{where}: the initial condition must be a constant true")
        trip_value = _constant_value(trip)
        if trip_value is not None and int(trip_value.reshape(-1)[0]) <= MAX_UNROLLED_ITERATIONS:
            return _unrolled_loop(bb, body, int(trip_value.reshape(-1)[0]), carried, attr, where)
        count = (tirx.IntImm("int64", int(trip_value.reshape(-1)[0])) if trip_value is not None
                 else trip_count_var(bb, trip, where))
        # a graph input holding the count: the report gives the value each run had
        trip_input = trip.name if trip_value is None and isinstance(trip, relax.Var) else ""
        return _recursive_loop(bb, body, count, carried, attr, where, trip_input)


def _unrolled_loop(bb, body, count: int, carried, attr, where: str):
    true = relax.const(np.array(True))
    names = [v.name for v in body.input]
    carried_bytes = _total_bytes(carried)
    scans = [[] for _ in range(len(body.output) - 1 - len(carried))]
    for t in range(count):
        bindings = {names[0]: relax.const(np.array(t, "int64")), names[1]: true}
        bindings.update(zip(names[2:], carried))
        out = _run_body(bb, body, bindings, where)
        _check_condition(out[0], true, where)
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


def _check_condition(cond_out, true, where: str) -> None:
    if not (cond_out is true or _is_true(cond_out)):
        raise NotImplementedError(
            f"{where}: the body's condition output is computed at run time (early "
            "exit is not supported)")


def _outer_bindings(body, where: str):
    """The enclosing-scope values the body reads: constants bound as they are, other
    values (passed to the loop functions as loop-invariant parameters)."""
    importer = getattr(_state, "importer", None)
    constants, invariants = {}, {}
    for name in outer_names(body):
        value = importer._nodes.get(name) if importer is not None else None
        if value is None:
            raise NotImplementedError(f"{where}: the body reads '{name}', which is not "
                                      "defined before the loop")
        if isinstance(value, tvm.ir.GenericConst):
            constants[name] = value
        else:
            invariants[name] = value
    return importer, constants, invariants


def _recursive_loop(bb, body, count, carried, attr, where: str, trip_input: str = ""):
    importer, constants, invariants = _outer_bindings(body, where)
    names = [v.name for v in body.input]
    num_scan = len(body.output) - 1 - len(carried)

    def convert(sub, iteration, carried_params, _rows, invariant_params):
        true = relax.const(np.array(True))
        bindings = {**constants, **invariant_params, names[0]: iteration, names[1]: true}
        bindings.update(zip(names[2:], carried_params))
        out = _run_body(sub, body, bindings, where)
        _check_condition(out[0], true, where)
        return out[1:1 + len(carried)], out[1 + len(carried):]

    spec = make_spec(attr["tvm_custom"]["name"], where, count, carried, [], invariants)
    final, scans, body_outs, function = emit_recursive_loop(bb, importer, spec, convert,
                                                            num_scan)
    record_loop(node=spec.node, op="Loop", form="recursive", iterations=count,
                carried_state_bytes=_total_bytes(carried), body_bytes=_total_bytes(body_outs),
                function=function, trip_input=trip_input)
    return _results(final + scans)


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
    """ONNX ``Scan`` (opset 9+): unrolled over a static length of at most
    :data:`MAX_UNROLLED_ITERATIONS`, else the recursive form (see the module docstring)."""

    @classmethod
    def _impl_v9(cls, bb, inputs, attr, params):
        where = _where("Scan", attr)
        body = attr["body"]
        num_scan = int(attr["num_scan_inputs"])
        states, xs = list(inputs[:len(inputs) - num_scan]), list(inputs[len(inputs) - num_scan:])
        in_axes = [int(a) for a in attr.get("scan_input_axes", [0] * num_scan)]
        length = _scan_length(xs, in_axes, where)
        reverse = any(int(v) for key in ("scan_input_directions", "scan_output_directions")
                      for v in attr.get(key, ()))
        if isinstance(length, int) and length <= MAX_UNROLLED_ITERATIONS and not reverse:
            return _unrolled_scan(bb, body, states, xs, in_axes, length, attr, where)
        return _recursive_scan(bb, body, states, xs, in_axes, attr, where)


def _unrolled_scan(bb, body, states, xs, in_axes, length: int, attr, where: str):
    out_axes = [int(a) for a in attr.get("scan_output_axes", ())]
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


def _to_front(bb, x, axis: int, reverse: bool):
    """``x`` with ``axis`` moved to the front (and reversed along it when ``reverse``)."""
    if axis != 0:
        rest = [k for k in range(x.ty.ndim) if k != axis]
        x = bb.emit(relax.op.permute_dims(x, [axis] + rest))
    return bb.emit(relax.op.flip(x, 0)) if reverse else x


def _from_front(bb, y, axis: int, reverse: bool):
    """The inverse of :func:`_to_front` for a scan output."""
    if reverse:
        y = bb.emit(relax.op.flip(y, 0))
    if axis == 0:
        return y
    ndim = y.ty.ndim
    axis = axis % ndim
    order = list(range(1, ndim))
    order.insert(axis, 0)
    return bb.emit(relax.op.permute_dims(y, order))


def _recursive_scan(bb, body, states, xs, in_axes, attr, where: str):
    importer, constants, invariants = _outer_bindings(body, where)
    num_scan = len(xs)
    in_dirs = [int(v) for v in attr.get("scan_input_directions", [0] * num_scan)]
    num_out = len(body.output) - len(states)
    out_axes = [int(a) for a in attr.get("scan_output_axes", [0] * num_out)]
    out_dirs = [int(v) for v in attr.get("scan_output_directions", [0] * num_out)]
    xs = [_to_front(bb, x, a % x.ty.ndim, bool(d)) for x, a, d in zip(xs, in_axes, in_dirs)]
    count = xs[0].ty.shape.values[0]
    names = [v.name for v in body.input]

    def convert(sub, _iteration, carried_params, rows, invariant_params):
        bindings = {**constants, **invariant_params}
        bindings.update(zip(names, list(carried_params) + list(rows)))
        out = _run_body(sub, body, bindings, where)
        return out[:len(states)], out[len(states):]

    spec = make_spec(attr["tvm_custom"]["name"], where, count, states, xs, invariants)
    final, scans, body_outs, function = emit_recursive_loop(bb, importer, spec, convert,
                                                            num_out)
    record_loop(node=spec.node, op="Scan", form="recursive", iterations=count,
                carried_state_bytes=_total_bytes(states), body_bytes=_total_bytes(body_outs),
                function=function)
    scans = [_from_front(bb, y, a, bool(d)) for y, a, d in zip(scans, out_axes, out_dirs)]
    return _results(final + scans)


def _scan_length(xs, axes, where):
    """The scan length: an int when static, else the symbolic dim (checked equal)."""
    lengths = []
    for x, axis in zip(xs, axes):
        shape = getattr(x.ty, "shape", None)
        if not isinstance(shape, relax.ShapeExpr):
            raise NotImplementedError(f"{where}: a scan input's shape is unknown")
        dim = shape.values[axis]
        lengths.append(int(dim) if isinstance(dim, tirx.IntImm) else dim)
    analyzer = tvm.sym.Analyzer()
    if any(not analyzer.can_prove_equal(tirx.IntImm("int64", a) if isinstance(a, int) else a,
                                        tirx.IntImm("int64", b) if isinstance(b, int) else b)
           for a, b in zip(lengths, lengths[1:])):
        raise NotImplementedError(f"{where}: scan inputs of different lengths "
                                  f"{[str(v) for v in lengths]}")
    return lengths[0]


LOOP_CONVERTERS = {"Loop": LoopConverter, "Scan": ScanConverter}
"""Op type to converter, installed by the converter step ``unroll_loops``."""
