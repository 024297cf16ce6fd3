"""ClampEmptySlices: make ``relax.dynamic_strided_slice`` give an empty result, not a negative extent.

Where it runs: before ``LegalizeOps`` (our pipeline runs it first in the legalize phase,
for both planners). Reads no attributes.

Why: TVM 0.27's legalization of ``dynamic_strided_slice`` computes each output extent as
``ceildiv(end - begin, stride)`` after clamping begin and end, without ``max(0, ...)``.
When begin and end are run-time tensors with ``end`` before ``begin`` (valid ONNX:
``Slice`` with starts=[5], ends=[2] gives a (0, 8) result) the extent is negative, and the
VM allocating it fails with ``std::bad_alloc``. This pass replaces such an ``end`` by
``begin`` itself at run time (the extent is then 0), leaving every other slice unchanged:

``end' = where(empty, begin, end)`` with ``empty = stride < 0 ? c(end) > c(begin) :
c(end) < c(begin)``, ``c`` the same clamping TVM's legalization applies.
"""

from __future__ import annotations

import tvm
from tvm import relax
from tvm.relax.expr_functor import PyExprMutator, mutator

from ._module_util import replace_functions

__all__ = ["ClampEmptySlices"]


@tvm.transform.module_pass(opt_level=0, name="ClampEmptySlices")
class ClampEmptySlices:
    """Rewrite the ``end`` of every ``relax.dynamic_strided_slice`` so an empty slice has
    extent 0 (see the module docstring). No parameters; raises nothing."""

    def transform_module(self, mod: tvm.IRModule, _ctx) -> tvm.IRModule:
        op = tvm.ir.Op.get("relax.dynamic_strided_slice")
        updates = {}
        for gv, func in mod.functions_items():
            if isinstance(func, relax.Function) and _calls(func, op):
                updates[gv] = _Rewriter(mod).visit_expr(func)
        return replace_functions(mod, updates) if updates else mod


def _calls(func, op) -> bool:
    found = []
    relax.analysis.post_order_visit(
        func, lambda e: found.append(e) if isinstance(e, relax.Call) and e.op.same_as(op) else None)
    return bool(found)


@mutator
class _Rewriter(PyExprMutator):
    def visit_call_(self, call):
        call = super().visit_call_(call)
        if not (isinstance(call.op, tvm.ir.Op) and call.op.name == "relax.dynamic_strided_slice"):
            return call
        data, begin, end, strides = call.args
        emit = self.builder_.emit
        strides = emit(relax.op.astype(strides, "int64"))
        zero = relax.const(0, "int64")
        extent = emit(relax.op.astype(relax.op.shape_to_tensor(relax.op.shape_of(data)), "int64"))
        negative = emit(relax.op.less(strides, zero))
        low = emit(relax.op.where(negative, relax.const(-1, "int64"), zero))
        high = emit(relax.op.where(negative, relax.op.subtract(extent, relax.const(1, "int64")),
                                   extent))

        def clamp(index):
            index = emit(relax.op.astype(index, "int64"))
            wrapped = emit(relax.op.where(relax.op.less(index, zero),
                                          relax.op.add(index, extent), index))
            return emit(relax.op.minimum(relax.op.maximum(wrapped, low), high))

        b, e = clamp(begin), clamp(end)
        empty = emit(relax.op.where(negative, relax.op.greater(e, b), relax.op.less(e, b)))
        safe_end = emit(relax.op.where(empty, begin, end))
        return relax.op.dynamic_strided_slice(data, begin, safe_end, call.args[3])
