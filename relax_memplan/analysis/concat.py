"""Which kernels are plain concatenations, and which parameters a kernel writes.

Where it runs
-------------
On the PrimFuncs of a module after ``FuseTIR`` (and after any schedule), read by
:mod:`relax_memplan.analysis.liveness` when
:class:`~relax_memplan.transform.plan_static_memory.PlanStaticMemory` runs with
``concat_inplace=True``. It only reads the TIR.

The rule (strict)
-----------------
A PrimFunc is a concatenation of its first ``n >= 2`` parameters along ``axis`` into its
last parameter when it is, up to names and function attributes, structurally equal
(``tvm_ffi.structural_equal``) to the PrimFunc TVM's own legalization of
``R.concat`` builds for the same shapes and dtype: ``topi.concatenate`` turned into TIR by
``te.create_prim_func`` (one block over the output's grid, a nested ``if_then_else``
choosing the input by the index along the axis). The axis is found from the shapes: every
dim but the axis equal, the output's dim the sum of the inputs'. A scheduled, fused
(``concat + reshape``...) or hand-written kernel does not match and is not treated as a
concatenation (:func:`concat_table` lists one named after ``R.concat`` with no axis: its
calls are counted as refused).

When every dim before the axis is 1 (NCHW at batch 1 along the channels), input ``i`` is
the contiguous byte range ``[prefix_bytes(i), prefix_bytes(i) + nbytes(i))`` of the
output, so its producer may write it there directly: the planner's concat-in-place
(:mod:`relax_memplan.transform._concat_plan`). The idea is the memory planning of
concatenation in TensorFlow's and MXNet's graph planners ("concat in place") and of
oneDNN's concat primitive fed by sub-memory descriptors.
"""

from __future__ import annotations

from typing import Dict, FrozenSet, Optional

import tvm
import tvm_ffi
from tvm import te, tirx, topi

from .inplace import _param_of

__all__ = ["CONCAT_AXIS_ATTR", "concat_axis", "concat_table", "written_params"]

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


def concat_table(mod: tvm.IRModule) -> Dict[str, Optional[int]]:
    """Kernel name -> concatenation axis, for every PrimFunc of ``mod`` that is one; ``None``
    for a kernel named after ``R.concat`` (``concatenate``, ``fused_..concatenate..``: TVM
    names legalized and fused kernels after their ops) that is not a plain concatenation
    (fused with other ops, or scheduled), so that the planner counts its calls as refused
    instead of not at all (else yolov8n under ``--schedule`` says "3 written; refused: 1"
    of its 11 concatenations)."""
    table: Dict[str, Optional[int]] = {}
    for gv, func in mod.functions_items():
        if isinstance(func, tirx.PrimFunc):
            axis = concat_axis(func)
            if axis is not None or "concatenate" in gv.name_hint:
                table[gv.name_hint] = axis
    return table


def written_params(func: tirx.PrimFunc) -> FrozenSet[int]:
    """Indices of the parameters ``func`` may write.

    A parameter is written when a ``BufferStore`` stores to its data; a function that takes
    an address (``address_of``, ``tvm_access_ptr``) or calls out (``call_extern``,
    ``call_packed``...) may write anything, so all its buffer parameters count as written.
    """
    params = list(func.params)
    buffers = [k for k, p in enumerate(params) if tirx.is_buffer_var(p)]
    written, opaque = set(), [False]

    def visit(node):
        if isinstance(node, tirx.BufferStore):
            k = _param_of(node.buffer, params)
            written.add(k if k is not None else -1)
        elif isinstance(node, tvm.ir.Call) and isinstance(node.op, tvm.ir.Op):
            name = node.op.name
            if name in ("tirx.address_of", "tirx.tvm_access_ptr") or "call_" in name:
                opaque[0] = True

    tvm_ffi.structural_walk(func.body, visit)
    if opaque[0]:
        return frozenset(buffers)
    return frozenset(k for k in written if k >= 0)
