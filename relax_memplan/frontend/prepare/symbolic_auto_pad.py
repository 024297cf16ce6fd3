"""Converter step ``symbolic_auto_pad``: ``Conv`` with ``auto_pad`` ``SAME_UPPER``/``SAME_LOWER``
over symbolic spatial dims.

tf2onnx writes Keras' ``padding="same"`` as ``auto_pad="SAME_UPPER"``. TVM 0.27's converter
computes the padding with numpy on the input's dims, which fails on a symbolic dim ("Cannot
use and / or / not operator to Expr"): a Keras CNN with input ``(None, None, None, 3)``
imports only with every dim fixed. Here the padding is the same arithmetic as an expression
of the dims (ONNX: total ``max(k_eff - (s if d % s == 0 else d % s), 0)`` with the effective
kernel ``k_eff = (k - 1) * dilation + 1``, split in halves, the odd one after for
``SAME_UPPER``, before for ``SAME_LOWER``), applied by an explicit pad, and TVM's converter
runs on the padded input with no ``auto_pad``. Static dims are left to TVM.
"""

from __future__ import annotations

from tvm import relax, tirx, topi
from tvm.relax.frontend.onnx import onnx_frontend as _tvm_onnx

__all__ = ["symbolic_auto_pad_converter", "same_pads"]


def same_pads(dims, strides, kernel, dilations, mode: str):
    """(pads before, pads after) per spatial dim for ``SAME_UPPER``/``SAME_LOWER``, as
    expressions of ``dims`` (ints or PrimExprs)."""
    before, after = [], []
    for d, s, k, r in zip(dims, strides, kernel, dilations):
        effective = (int(k) - 1) * int(r) + 1
        rest = tirx.floormod(d, int(s))
        taken = tirx.Select(rest == 0, tirx.IntImm("int64", int(s)), rest)  # shape dims: int64
        total = tirx.max(effective - taken, 0)
        half = tirx.floordiv(total, 2)
        small, large = half, total - half
        before.append(large if mode == "SAME_LOWER" else small)
        after.append(small if mode == "SAME_LOWER" else large)
    return before, after


def _mode(attr) -> str:
    mode = attr.get("auto_pad", "NOTSET")
    return mode.decode("utf-8") if isinstance(mode, bytes) else mode


def symbolic_auto_pad_converter(record):
    """A subclass of TVM's ``Conv`` converter whose ``SAME_*`` padding is computed on
    symbolic dims; ``record(op_type)`` counts each node it changes."""

    class SymbolicAutoPadConv(_tvm_onnx.Conv):
        @classmethod
        def _impl_v11(cls, bb, inputs, attr, params):
            data, mode = inputs[0], _mode(attr)
            ty = getattr(data, "ty", None)
            if mode not in ("SAME_UPPER", "SAME_LOWER") or not isinstance(ty, relax.TensorType) \
                    or not isinstance(ty.shape, relax.ShapeExpr):
                return super()._impl_v11(bb, inputs, attr, params)
            dims = list(ty.shape.values)[2:]
            if all(isinstance(d, tirx.IntImm) for d in dims):
                return super()._impl_v11(bb, inputs, attr, params)
            spatial = len(dims)
            kernel = attr.get("kernel_shape") or [int(k) for k in inputs[1].ty.shape.values[2:]]
            before, after = same_pads(dims, attr.get("strides", [1] * spatial), kernel,
                                      attr.get("dilations", [1] * spatial), mode)
            padded = bb.emit_te(topi.nn.pad, data, [0, 0, *before], [0, 0, *after], 0.0)
            attr = {k: v for k, v in attr.items() if k != "auto_pad"}
            attr["pads"] = [0] * (2 * spatial)
            record("Conv")
            return super()._impl_v11(bb, _tvm_onnx.onnx_input([padded, *list(inputs)[1:]]),
                                     attr, params)

    return SymbolicAutoPadConv
