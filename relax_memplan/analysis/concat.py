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
from tvm import tirx

from ..schedules.concat_kernel import CONCAT_AXIS_ATTR, concat_axis
from .inplace import _param_of

__all__ = ["CONCAT_AXIS_ATTR", "concat_axis", "concat_table", "written_params"]

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
