"""Which kernels are plain concatenations: the TIR-level rule of
:mod:`relax_memplan.analysis.concat`, here so that the schedules (a layer below the analyses)
can mark a concatenation they reschedule.

A PrimFunc concatenates its first ``n >= 2`` parameters along ``axis`` into its last one when
it is structurally equal, up to names and attributes, to what TVM's legalization of
``R.concat`` builds for the same shapes (``topi.concatenate`` through ``te.create_prim_func``),
or when it carries :data:`CONCAT_AXIS_ATTR` equal to the axis its shapes give.
"""

from __future__ import annotations

from typing import Optional

import tvm_ffi
from tvm import te, tirx, topi

__all__ = ["CONCAT_AXIS_ATTR", "concat_axis"]

CONCAT_AXIS_ATTR = "relax_memplan.concat_axis"
"""PrimFunc attribute: the axis of a kernel that was a plain concatenation before a schedule
changed its loops (:func:`~relax_memplan.schedules.cpu_schedule_pass` writes it), so that the
scheduled kernel is still known as one (without it yolov8n under our schedules wrote 3 of its
concatenations in place instead of 9, and its lower bound rose 2,048,000 -> 2,457,600 B)."""


def _shape(buf):
    return [int(d) if isinstance(d, tirx.IntImm) else None for d in buf.shape]


def _axis_from_shapes(ins, out) -> Optional[int]:
    """The only axis along which ``ins`` concatenate to ``out`` (static shapes), else None."""
    shapes = [_shape(b) for b in ins]
    oshape = _shape(out)
    if None in oshape or any(None in s or len(s) != len(oshape) for s in shapes):
        return None
    axes = [a for a in range(len(oshape))
            if all(s[d] == oshape[d] for s in shapes for d in range(len(oshape)) if d != a)
            and sum(s[a] for s in shapes) == oshape[a]]
    return axes[0] if len(axes) == 1 else None


def _reference(ins, axis: int) -> tirx.PrimFunc:
    placeholders = [te.placeholder(b.shape, b.dtype, name=f"x{k}") for k, b in enumerate(ins)]
    return te.create_prim_func(placeholders + [topi.concatenate(placeholders, axis)])


def concat_axis(func: tirx.PrimFunc) -> Optional[int]:
    """The axis along which ``func`` concatenates its inputs into its last parameter.

    Parameters
    ----------
    func : tvm.tirx.PrimFunc
        A kernel after ``FuseTIR``: buffer parameters, inputs first, the output last.

    Returns
    -------
    int or None
        The axis when ``func`` matches the legalized ``R.concat`` for its shapes (module
        docstring), or carries :data:`CONCAT_AXIS_ATTR` equal to the axis its shapes give;
        ``None`` otherwise (not a concatenation, symbolic shapes, scheduled without the
        attribute).
    """
    params = list(func.params)
    if len(params) < 3 or not all(tirx.is_buffer_var(p) for p in params):
        return None
    ins, out = params[:-1], params[-1]
    if any(str(b.dtype) != str(out.dtype) for b in ins):
        return None
    axis = _axis_from_shapes(ins, out)
    if axis is None:
        return None
    if func.attrs is not None and CONCAT_AXIS_ATTR in func.attrs:
        return axis if int(func.attrs[CONCAT_AXIS_ATTR]) == axis else None
    ref = _reference(ins, axis)
    bare = tirx.PrimFunc(func.params, func.body, func.ret_type)
    bare_ref = tirx.PrimFunc(ref.params, ref.body, ref.ret_type)
    return axis if tvm_ffi.structural_equal(bare, bare_ref, map_free_vars=True) else None
