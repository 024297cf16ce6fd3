"""Converter steps: corrected TVM 0.27 ONNX op converters for symbolic dims.

TVM's importer carries shape arithmetic symbolically: a shape is a Relax ``ShapeExpr``
and one dim a ``PrimExpr`` of the input's symbolic vars.  Some converters drop out of
that representation, which loses the link between dims (fresh vars such as
``range_len_0``) or fails outright.  Each step here replaces the converter of a few ops
by a subclass of TVM's own that handles the symbolic case and defers to TVM otherwise:

``symbolic_range``
    ``Range`` with a symbolic limit gets length ``ceil((limit - start) / delta)`` as an
    expression of the input dims instead of a fresh var read at run time.
``shape_value_reshape``
    ``Reshape`` of one symbolic dim (a ``PrimExpr``) to ``[1]``/``[-1]``/``[]`` keeps it a
    shape value (TVM: "Reshape expects the input data to be a Tensor").
``exact_resize``
    ``Resize`` with integral constant scales makes sizes ``dim * scale`` (TVM: a float
    round trip no later op can compare), and accepts symbolic ``sizes``.
``assume_equal_dims``
    ``Concat`` and broadcasting element-wise ops whose symbolic dims must be equal by
    ONNX's rules but are not provably equal (``2 * ((H - 1) // 32 + 1)`` against
    ``(H - 1) // 16 + 1``) ``match_cast`` the later input to the first input's dims, a
    check done at run time, instead of losing the output's shape; so does ``Squeeze`` of a
    symbolic axis, cast to 1 (:mod:`~relax_memplan.onnx_prepare.unit_squeeze`).
``symbolic_expand``
    ``Expand`` of a tensor with symbolic dims to a constant shape (``x[n, 4]`` to
    ``[1, 1, 4]``) broadcasts with the symbolic dims kept (TVM reads ``dim.value`` of
    every input dim: "'Var' object has no attribute 'value'").
``symbolic_auto_pad``
    ``Conv`` with ``auto_pad`` ``SAME_*`` over symbolic dims pads by an expression of the
    dims (tf2onnx's ``padding="same"``; :mod:`~relax_memplan.onnx_prepare.symbolic_auto_pad`).
``onnx_attention``
    ``Attention`` of the standard domain (opset 23 on; TVM converts every ``Attention`` as
    ``com.microsoft``'s): the plain Relax decomposition that our attention fusion matches;
    ``com.microsoft`` nodes keep TVM's converter
    (:mod:`relax_memplan.frontend.prepare.onnx_attention`).
``recurrent``
    ``LSTM`` and ``GRU`` (no TVM converter): a projection ``matmul`` and one time-loop
    kernel per node (:mod:`relax_memplan.frontend.prepare.recurrent`).
``unroll_loops``
    ``Loop`` and ``Scan`` (no TVM converter) with a small constant trip count, unrolled
    (:mod:`relax_memplan.frontend.prepare.loops`).

:func:`corrected_converters` installs the selected ones by wrapping
``onnx_frontend._get_convert_map`` and restores it on exit; nothing is patched on import.
"""

from __future__ import annotations

import contextlib
import threading
from collections import Counter
from collections.abc import Iterable

import numpy as np
import tvm
from tvm import relax, tirx
from tvm.relax.frontend.onnx import onnx_frontend as _tvm_onnx

from ...errors import PrepareStepError
from .pipeline import CONVERTER_STEP_NAMES
from .loops import LOOP_CONVERTERS, importer_tracking
from .onnx_attention import node_tracking, onnx_attention_converter
from .recurrent import RECURRENT_CONVERTERS
from .symbolic_auto_pad import symbolic_auto_pad_converter
from .unit_squeeze import unit_squeeze_converter

__all__ = ["corrected_converters", "CONVERTER_STEPS", "added_ops"]

_state = threading.local()


def _record(step: str, op_type: str) -> None:
    """Count one use of a corrected path, for the import notes."""
    usage = getattr(_state, "usage", None)
    if usage is not None:
        usage[(step, op_type)] += 1


def _scalar(value):
    """A constant scalar's Python value, a PrimExpr as is, else None."""
    if isinstance(value, tvm.ir.GenericConst):
        array = value.value.numpy()
        return array.item() if array.size == 1 else None
    if tvm.ir.is_prim_expr(value):
        return value
    return None


# ----------------------------------------------------------------------------- symbolic_range
class SymbolicRange(_tvm_onnx.Range):
    """``Range`` whose integer length is an expression of the symbolic dims."""

    @classmethod
    def _impl_v12(cls, bb, inputs, attr, params):
        start, limit, delta = (_scalar(value) for value in inputs[:3])
        is_symbolic = any(tvm.ir.is_prim_expr(v) for v in (start, limit, delta))
        constant_integer_delta = isinstance(delta, (int, np.integer)) and delta != 0
        out_dtype = None
        if isinstance(inputs[0], tvm.ir.GenericConst):
            out_dtype = str(inputs[0].ty.dtype)
        elif tvm.ir.is_prim_expr(inputs[0]):
            out_dtype = _prim_dtype(inputs[0])
        if (
            not is_symbolic
            or not constant_integer_delta
            or start is None
            or limit is None
            or out_dtype not in ("int32", "int64")
        ):
            return super()._impl_v12(bb, inputs, attr, params)
        _record("symbolic_range", "Range")
        start, limit = (_as_int64(v) for v in (start, limit))
        return relax.op.arange(start, limit, int(delta), out_dtype)


def _prim_dtype(expr) -> str:
    return str(getattr(expr, "dtype", None) or expr.ty)


def _as_int64(value):
    if tvm.ir.is_prim_expr(value):
        return value if _prim_dtype(value) == "int64" else tirx.Cast("int64", value)
    return tirx.IntImm("int64", int(value))


# ----------------------------------------------------------------------------- shape_value_reshape
class ShapeValueReshape(_tvm_onnx.Reshape):
    """``Reshape`` of a single symbolic dim keeps it a shape value."""

    @classmethod
    def _impl_v13(cls, bb, inputs, attr, params):
        data, new_shape = inputs[0], inputs[1]
        if tvm.ir.is_prim_expr(data) and isinstance(new_shape, tvm.ir.GenericConst):
            target = new_shape.value.numpy().tolist()
            if target in ([1], [-1]):
                _record("shape_value_reshape", "Reshape")
                return relax.ShapeExpr([data])
            if target == []:
                _record("shape_value_reshape", "Reshape")
                return data
        return super()._impl_v13(bb, inputs, attr, params)


# ----------------------------------------------------------------------------- exact_resize
class ExactResize(_tvm_onnx.Resize):
    """``Resize`` with integral scales or symbolic sizes gives exact symbolic sizes."""

    @classmethod
    def _impl_v18(cls, bb, inputs, attr, params):
        x = inputs[0]
        shape = x.ty.shape if isinstance(x.ty, relax.TensorType) else None
        scales = inputs[2] if len(inputs) > 2 else None
        sizes = inputs[3] if len(inputs) > 3 else None
        if shape is None:
            return super()._impl_v18(bb, inputs, attr, params)
        dims = list(shape.values)
        if isinstance(scales, tvm.ir.GenericConst) and scales.value.numpy().size == len(dims):
            factors = scales.value.numpy().tolist()
            if all(float(f).is_integer() and f >= 1 for f in factors):
                _record("exact_resize", "Resize")
                out = [d * int(f) if int(f) != 1 else d for d, f in zip(dims, factors)]
                return _resize_to(bb, inputs, attr, out[2:], params)
        if isinstance(sizes, relax.ShapeExpr) and not all(
            isinstance(v, tirx.IntImm) for v in sizes.values
        ):
            _record("exact_resize", "Resize")
            return _resize_to(bb, inputs, attr, list(sizes.values)[2:], params)
        return super()._impl_v18(bb, inputs, attr, params)


def _resize_to(bb, inputs, attr, spatial_sizes, params):
    """TVM's Resize with ``sizes`` given as constants; then the output cast to the
    symbolic spatial sizes (TVM's converter reads ``int(dim)``)."""
    x = inputs[0]
    dims = list(x.ty.shape.values)
    if len(dims) != 4:
        raise NotImplementedError("Resize to symbolic sizes is supported for 4-D inputs only")
    placeholder = relax.const(np.ones(len(dims), "int64"))
    call = _tvm_onnx.Resize._impl_v18(bb, [x, inputs[1], None, placeholder], attr, params)
    if not isinstance(call, relax.Call):  # e.g. a dynamic ROI: TVM's TOPI path
        raise NotImplementedError("Resize to symbolic sizes needs a constant ROI")
    return relax.op.image.resize2d(
        x,
        size=relax.ShapeExpr(spatial_sizes),
        roi=[float(v) for v in call.attrs.roi],
        layout="NCHW",
        method=call.attrs.method,
        coordinate_transformation_mode=call.attrs.coordinate_transformation_mode,
        rounding_method=call.attrs.rounding_method,
        cubic_alpha=call.attrs.cubic_alpha,
        cubic_exclude=call.attrs.cubic_exclude,
        extrapolation_value=call.attrs.extrapolation_value,
    )


# ----------------------------------------------------------------------------- assume_equal_dims
_BROADCASTING_OPS = (
    "Add", "Sub", "Mul", "Div", "Pow", "Mod", "And", "Or", "Xor", "Equal", "Less",
    "LessOrEqual", "Greater", "GreaterOrEqual", "Where", "Max", "Min", "Sum", "Mean",
    "PRelu", "BitwiseAnd", "BitwiseOr", "BitwiseXor",
)


def _known_shape(expr):
    ty = getattr(expr, "ty", None)
    if isinstance(ty, relax.TensorType) and isinstance(ty.shape, relax.ShapeExpr):
        return list(ty.shape.values)
    return None


def _is_one(dim) -> bool:
    return isinstance(dim, tirx.IntImm) and int(dim) == 1


def _match_dims(bb, expr, dims, op_type):
    """``match_cast`` ``expr`` to ``dims`` (a run-time check) and count the use."""
    _record("assume_equal_dims", op_type)
    if not isinstance(expr, relax.Var):  # match_cast a bound var: a Call value crashes lowering
        expr = bb.emit(expr)
    return bb.match_cast(expr, relax.TensorType(dims, expr.ty.dtype))


def _defines_itself(var, dims) -> bool:
    """Whether ``var`` is a bare symbolic var that another of ``dims`` is an expression of."""
    return isinstance(var, tirx.Var) and any(
        not dim.same_as(var) and any(v.same_as(var) for v in tirx.analysis.undefined_vars(dim))
        for dim in dims)


def _reference_dim(dims):
    """The dim the others on one axis are cast to: the first, unless it is a bare var that
    another dim is an expression of. ``match_cast`` of ``(H - 1) // 4 * 4 + 4`` to ``H`` makes
    TVM 0.27's CanonicalizeBindings (run inside FuseTIR) recurse without end and the process
    die of a stack overflow, with TVM's own pipeline too; the cast the other way, of ``H`` to
    the expression, is the same run-time check and builds."""
    for dim in dims:
        if not _defines_itself(dim, dims):
            return dim
    return dims[0]


def _equalize_broadcast(bb, inputs, op_type):
    analyzer = tvm.sym.Analyzer()
    shapes = [_known_shape(value) for value in inputs]
    known = [s for s in shapes if s is not None]
    if len(known) < 2:
        return inputs
    rank = max(len(s) for s in known)
    # per right-aligned axis: the non-1 dims in input order, and the one the others match
    seen = [[] for _ in range(rank)]
    for shape in known:
        for axis, dim in enumerate(shape):
            if not _is_one(dim):
                seen[rank - len(shape) + axis].append(dim)
    reference = [_reference_dim(dims) if dims else None for dims in seen]
    result = list(inputs)
    for index, (value, shape) in enumerate(zip(inputs, shapes)):
        if shape is None:
            continue
        offset = rank - len(shape)
        new_dims, differs = list(shape), False
        for axis, dim in enumerate(shape):
            ref = reference[offset + axis]
            if _is_one(dim):
                continue
            if not analyzer.can_prove_equal(ref, dim) and not _is_one(ref):
                if isinstance(dim, tirx.IntImm) and isinstance(ref, tirx.IntImm):
                    continue  # a real mismatch: let TVM report it
                new_dims[axis], differs = ref, True
        if differs:
            result[index] = _match_dims(bb, value, new_dims, op_type)
    return result


def _equalize_concat(bb, inputs, axis, op_type):
    analyzer = tvm.sym.Analyzer()
    shapes = [_known_shape(value) for value in inputs]
    if any(s is None for s in shapes) or len({len(s) for s in shapes}) != 1 or not shapes:
        return inputs
    axis = axis + len(shapes[0]) if axis < 0 else axis
    reference = [_reference_dim([s[i] for s in shapes]) for i in range(len(shapes[0]))]
    result = list(inputs)
    for index in range(len(inputs)):
        dims = list(shapes[index])
        differs = False
        for i, (ref, dim) in enumerate(zip(reference, dims)):
            if i != axis and not analyzer.can_prove_equal(ref, dim):
                if isinstance(dim, tirx.IntImm) and isinstance(ref, tirx.IntImm):
                    return inputs  # a real mismatch: let TVM report it
                dims[i], differs = ref, True
        if differs:
            result[index] = _match_dims(bb, inputs[index], dims, op_type)
    return result


def _equal_dims_converter(base, op_type):
    """A subclass of TVM's converter ``base`` that equalizes its inputs' dims first."""

    class _Converter(base):
        @classmethod
        def get_converter(cls, opset):
            impl = base.get_converter(opset)

            def convert(bb, inputs, attr, params):
                tensors = [v for v in inputs if v is not None and _known_shape(v) is not None]
                if len(tensors) >= 2:
                    if op_type == "Concat":
                        fixed = _equalize_concat(bb, list(inputs), attr.get("axis", 0), op_type)
                    else:
                        fixed = _equalize_broadcast(bb, list(inputs), op_type)
                    inputs = _tvm_onnx.onnx_input(fixed)
                return impl(bb, inputs, attr, params)

            return convert

    _Converter.__name__ = f"EqualDims{base.__name__}"
    return _Converter


# ----------------------------------------------------------------------------- symbolic_expand
class SymbolicExpand(_tvm_onnx.Expand):
    """``Expand`` of a tensor with symbolic dims to a constant target shape."""

    @classmethod
    def _impl_v13(cls, bb, inputs, attr, params):
        data, shape = inputs[0], inputs[1]
        dims = _known_shape(data)
        if (
            not isinstance(shape, tvm.ir.GenericConst)
            or dims is None
            or all(isinstance(d, tirx.IntImm) for d in dims)
        ):
            return super()._impl_v13(bb, inputs, attr, params)
        target = shape.value.numpy().reshape(-1).tolist()
        if len(target) < len(dims):  # right-aligned: the target takes the input's rank
            target = [1] * (len(dims) - len(target)) + target
        if any(value < 1 and value != -1 for value in target):
            return super()._impl_v13(bb, inputs, attr, params)  # TVM reports the bad dim
        _record("symbolic_expand", "Expand")
        padded = [tirx.IntImm("int64", 1)] * (len(target) - len(dims)) + dims
        # -1 keeps the input's dim (TVM's reading); TVM's ShapeExpr path does the rest
        target = [padded[i] if value == -1 else tirx.IntImm("int64", value)
                  for i, value in enumerate(target)]
        return super()._impl_v13(bb, [data, relax.ShapeExpr(target)], attr, params)


# ----------------------------------------------------------------------------- installation
def _converter_table(converters: dict) -> dict[str, dict[str, type]]:
    equal_dims = {
        op: _equal_dims_converter(converters[op], op)
        for op in ("Concat", *_BROADCASTING_OPS)
        if op in converters
    }
    return {
        "symbolic_range": {"Range": SymbolicRange},
        "shape_value_reshape": {"Reshape": ShapeValueReshape},
        "exact_resize": {"Resize": ExactResize},
        "assume_equal_dims": {
            **equal_dims, "Squeeze": unit_squeeze_converter(
                lambda op: _record("assume_equal_dims", op))},
        "symbolic_expand": {"Expand": SymbolicExpand},
        "symbolic_auto_pad": {"Conv": symbolic_auto_pad_converter(
            lambda op: _record("symbolic_auto_pad", op))},
        "onnx_attention": {"Attention": onnx_attention_converter(
            converters["Attention"], lambda op: _record("onnx_attention", op))},
        "recurrent": dict(RECURRENT_CONVERTERS),
        "unroll_loops": dict(LOOP_CONVERTERS),
    }


CONVERTER_STEPS = CONVERTER_STEP_NAMES
"""The converter step names, in install order (same tuple as in ``pipeline``)."""

_lock = threading.Lock()


def added_ops() -> dict[str, str]:
    """Op types TVM 0.27's importer has no converter for that a converter step adds
    (``LSTM`` -> ``"recurrent"``, ``Loop`` -> ``"unroll_loops"``), to the step's name.
    A step's converter may still refuse a node's attributes (see the step's module)."""
    tvm_ops = _tvm_onnx._get_convert_map()
    table = _converter_table(tvm_ops)
    return {op: step for step in CONVERTER_STEPS for op in table[step] if op not in tvm_ops}


@contextlib.contextmanager
def corrected_converters(steps: Iterable[str] = CONVERTER_STEPS):
    """Install the corrected converters of ``steps`` while the block runs.

    Wraps ``tvm.relax.frontend.onnx.onnx_frontend._get_convert_map`` (which the importer
    calls for every node) so that it returns TVM's table updated with the corrected
    converters; the original function is restored on exit, also on error.  Imports
    inside the block are serialized.

    Parameters
    ----------
    steps : iterable of str
        Converter step names (see :data:`CONVERTER_STEPS`).

    Yields
    ------
    collections.Counter
        ``(step, op_type)`` to the number of nodes converted by a corrected path.

    Raises
    ------
    PrepareStepError
        For a name that is not a converter step.
    """
    steps = list(steps)
    unknown = [name for name in steps if name not in CONVERTER_STEPS]
    if unknown:
        raise PrepareStepError(
            f"unknown converter step(s) {unknown}; known: {', '.join(CONVERTER_STEPS)}"
        )
    with _lock:
        original = _tvm_onnx._get_convert_map
        table = _converter_table(original())
        overrides = {}
        for name in CONVERTER_STEPS:
            if name in steps:
                overrides.update(table[name])

        def convert_map():
            converters = original()
            converters.update(overrides)
            return converters

        usage = Counter()
        _state.usage = usage
        _tvm_onnx._get_convert_map = convert_map
        try:
            with contextlib.ExitStack() as tracking:
                if "unroll_loops" in steps:
                    tracking.enter_context(importer_tracking())
                if "onnx_attention" in steps:
                    tracking.enter_context(node_tracking())
                yield usage
        finally:
            _tvm_onnx._get_convert_map = original
            _state.usage = None


def describe_usage(usage: Counter) -> list[str]:
    """Notes ``"<step>: corrected <op> at N node(s)"`` from a usage counter."""
    notes = {}
    for (step, op_type), count in sorted(usage.items()):
        notes.setdefault(step, []).append(f"{op_type} at {count} node(s)")
    return [f"{step}: corrected {', '.join(parts)}" for step, parts in notes.items()]
