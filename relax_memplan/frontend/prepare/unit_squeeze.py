"""``Squeeze`` of an axis whose extent is symbolic, for the ``assume_equal_dims`` step.

ONNX requires every squeezed axis to have extent 1. TVM 0.27's converter accepts only an
extent it knows to be 1 ("Squeeze axis 2 has a symbolic extent that cannot be proven to be 1
at import time"): rapidocr's PP-OCRv4 recognizer squeezes the height its backbone pools to
1, an expression of the input height that is 1 at the 48 rows the model is run at. The
input is ``match_cast`` to extent 1 on those axes, a check done at run time (a height whose
feature map is not 1 high fails there, as it does in onnxruntime), and TVM's converter then
squeezes a known unit axis. ``Squeeze`` without axes (every unit axis) is left to TVM.
"""

from __future__ import annotations

import tvm
from tvm import relax, tirx
from tvm.relax.frontend.onnx import onnx_frontend as _tvm_onnx

__all__ = ["unit_squeeze_converter"]


def _axes(inputs, attr):
    """The constant axes of a Squeeze (attribute before opset 13, input after), else None."""
    if len(inputs) > 1 and inputs[1] is not None:
        if not isinstance(inputs[1], tvm.ir.GenericConst):
            return None
        return [int(a) for a in inputs[1].value.numpy().reshape(-1)]
    axes = attr.get("axes")
    return None if axes is None else [int(a) for a in axes]


def unit_squeeze_converter(record):
    """A subclass of TVM's ``Squeeze`` converter that casts symbolic squeezed axes to 1;
    ``record(op_type)`` counts each node it changes."""

    class UnitSqueeze(_tvm_onnx.Squeeze):
        @classmethod
        def get_converter(cls, opset):
            impl = _tvm_onnx.Squeeze.get_converter(opset)

            def convert(bb, inputs, attr, params):
                data, axes = inputs[0], _axes(inputs, attr)
                ty = getattr(data, "ty", None)
                if axes is not None and isinstance(ty, relax.TensorType) \
                        and isinstance(ty.shape, relax.ShapeExpr):
                    dims = list(ty.shape.values)
                    picked = {a + len(dims) if a < 0 else a for a in axes}
                    if any(0 <= a < len(dims) and not isinstance(dims[a], tirx.IntImm)
                           for a in picked):
                        record("Squeeze")
                        dims = [tirx.IntImm("int64", 1) if a in picked else d
                                for a, d in enumerate(dims)]
                        if not isinstance(data, relax.Var):
                            data = bb.emit(data)
                        data = bb.match_cast(data, relax.TensorType(dims, ty.dtype))
                        inputs = _tvm_onnx.onnx_input([data, *list(inputs)[1:]])
                return impl(bb, inputs, attr, params)

            return convert

    return UnitSqueeze
