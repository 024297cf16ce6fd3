"""CheckIndexBounds: no op reads or writes outside a tensor because of an index value.

Where it runs: on the module as imported, before ``LegalizeOps`` (our pipeline runs it first in
the ``library_dispatch`` phase, right after ``AnnotateDimRanges``), on every Relax function.
Reads ``tir_var_lower_bound`` / ``tir_var_upper_bound`` (the declared dim ranges) and
``relax_memplan.onnx_nodes`` (for messages); writes no attribute.

Guarded ops (their kernels load or store ``data[index]`` unchecked): ``take`` in mode ``fast``
(ONNX Gather), ``gather_elements``, ``gather_nd``, ``scatter_elements``, ``scatter_nd``. Not
guarded because their kernels stay inside the tensor: ``take`` in mode ``clip``/``wrap``,
``one_hot`` (compares each index with ``0..depth-1``), ``dynamic_strided_slice`` (clamps begin
and end). ``strided_slice`` with symbolic bounds and ``assume_inbound`` (ONNX Slice ending at
a dim) is checked at compile time.

For each guarded op, the indices' value range is derived from constants and the declared dim
ranges (:mod:`._index_bounds`):

* proved in range -- nothing is added (e.g. BERT's position ids, a slice of a constant
  ``0..127`` gathered from a 128-row table);
* certainly out of range at a declared dim value (``arange(0, seq)`` into a 128-row table with
  ``seq`` up to 129) -- :class:`~relax_memplan.errors.IndexBoundsError` at compile time, naming
  the op and the largest allowed dim value;
* otherwise (indices from an input) -- with ``runtime_checks``, a TIR kernel checks every index
  before the op and passes the indices on (a copy the op reads, so it cannot be dropped or
  reordered). An index out of range raises ``IndexError`` through the VM, e.g.
  ``relax_memplan: index out of range in Gather node 'bert/embeddings/Gather': valid [-1000, 999]``.
  The valid range is given as ONNX defines it (``[-s, s-1]``) when the indices come from the
  importer's negative-index mapping, else as the op accepts it.

Messages name the ONNX node from the function attribute ``relax_memplan.onnx_nodes`` that
:func:`~relax_memplan.frontend.import_onnx` writes (:mod:`relax_memplan.analysis.onnx_nodes`);
without it (a module not imported from ONNX) they name the Relax op and variable, e.g.
``Gather (Relax take 'lv12')``.

The check kernels have no GPU schedule: build for ``cuda`` with ``runtime_checks=False``.
"""

from __future__ import annotations

from typing import Dict, List, Optional

import tvm
from tvm import relax, tirx

from ..analysis.dims import DimRange, declared_ranges, evaluate_int, expr_text, signature_dims
from ..analysis.onnx_nodes import onnx_node_label
from ..errors import INDEX_CHECK_MESSAGE, IndexBoundsError
from ._index_bounds import ValueRange, ValueRanges, _i64, _prim
from ._index_kernels import GUARDED_OPS, check_kernel, dtype_name, index_axes
from ._module_util import replace_functions

__all__ = ["CheckIndexBounds"]

_UNBOUNDED_PROBE = 2**31 - 1
"""Value tried for a dim declared without an upper bound."""


def _analyzer(dims: Dict[str, tirx.Var], ranges: Dict[str, DimRange]):
    analyzer = tvm.sym.Analyzer()
    for name, var in dims.items():
        r = ranges[name]
        upper = r.upper if r.upper is not None else _UNBOUNDED_PROBE
        analyzer.bind(var, tvm.ir.Range.from_min_extent(r.lower, upper - r.lower + 1))
    return analyzer


def _node(func: relax.Function, onnx_op: str, call: relax.Call, var: relax.Var) -> str:
    """``Gather node 'bert/Gather'`` when the importer recorded the ONNX node of ``var``, else
    ``onnx_op`` with the Relax op and variable (``Gather (Relax take 'lv12')``)."""
    label = onnx_node_label(func, var, call)
    if label is not None:
        return label
    return f"{onnx_op} (Relax {call.op.name.split('.')[-1]} '{var.name}')"


class _Refusal:
    """Builds the compile-time message for an index that leaves its tensor at a declared dim."""

    def __init__(self, dims: Dict[str, tirx.Var], ranges: Dict[str, DimRange]):
        self.dims, self.ranges = dims, ranges

    @staticmethod
    def _at(expr, values: Dict[str, int]) -> int:
        return evaluate_int(expr, values)

    def _smallest_above(self, over: tvm.ir.Expr, top: Dict[str, int], name: str) -> str:
        """``"; the smallest allowed <name> is N"`` when some value above the declared range has
        ``over <= 0`` (the index fits once the dim is large enough, e.g. a frame count of
        ``(samples - 192) // 512 + 1``), found by doubling then bisection; else ``""``."""
        lo = top[name]
        hi = max(2 * lo, 1)
        while self._at(over, {**top, name: hi}) > 0:
            if hi >= _UNBOUNDED_PROBE:
                return ""
            lo, hi = hi, min(2 * hi, _UNBOUNDED_PROBE)
        while hi - lo > 1:  # over > 0 at lo, <= 0 at hi
            mid = (lo + hi) // 2
            lo, hi = (lo, mid) if self._at(over, {**top, name: mid}) <= 0 else (mid, hi)
        return f"; the smallest allowed {name} is {hi}"

    def check(self, over: tvm.ir.Expr, what: str) -> None:
        """Raise if ``over > 0`` at some declared dim value (``over`` grows with each dim)."""
        free = {v.name for v in tirx.analysis.undefined_vars(over)}
        used = [n for n in self.dims if n in free]
        if not used:
            if int(tvm.sym.Analyzer().simplify(over)) > 0:
                raise IndexBoundsError(f"{what} at the input shapes compiled")
            return
        top = {n: (r.upper if r.upper is not None else _UNBOUNDED_PROBE)
               for n, r in self.ranges.items() if n in self.dims}
        if self._at(over, top) <= 0:
            return
        declared = ", ".join(f"--dim {n}={self.ranges[n].lower}.."
                             f"{'' if self.ranges[n].upper is None else self.ranges[n].upper}"
                             for n in used)
        if len(used) != 1:
            raise IndexBoundsError(f"{declared}: {what} at the declared upper bounds")
        name = used[0]
        lo, hi = self.ranges[name].lower, top[name]
        if self._at(over, {**top, name: lo}) > 0:
            raise IndexBoundsError(f"{declared}: {what} for every {name} in the range"
                                   f"{self._smallest_above(over, top, name)}")
        while lo < hi:  # largest value with over <= 0
            mid = (lo + hi + 1) // 2
            lo, hi = (mid, hi) if self._at(over, {**top, name: mid}) <= 0 else (lo, mid - 1)
        raise IndexBoundsError(f"{declared}: {what}; the largest allowed {name} is {lo}")


@tvm.transform.module_pass(opt_level=0, name="CheckIndexBounds")
class CheckIndexBounds:
    """Refuse at compile time, or check at run time, index values that leave their tensor
    (see the module docstring).

    Parameters
    ----------
    runtime_checks : bool
        Insert the run-time check before each guarded op whose indices are not proved in
        range; ``False`` keeps only the compile-time refusals.

    Attributes
    ----------
    checked, proved : list of str
        Filled when the pass runs: the guarded ops checked at run time, and those proved in
        range (``"<function>: <node>"``, e.g. ``"main: Gather node 'bert/Gather'"``).
    refused : IndexBoundsError or None
        The compile-time refusal, kept because TVM re-raises errors of a pass as
        ``RuntimeError``.

    Raises
    ------
    IndexBoundsError
        When running: an index certainly leaves its tensor at a declared dim value.
    """

    def __init__(self, runtime_checks: bool = True):
        self.runtime_checks = runtime_checks
        self.checked: List[str] = []
        self.proved: List[str] = []
        self.refused: Optional[IndexBoundsError] = None

    def transform_module(self, mod: tvm.IRModule, _ctx) -> tvm.IRModule:
        try:
            return self._transform(mod)
        except IndexBoundsError as err:
            # TVM's pass machinery re-raises it as a RuntimeError: keep it for the caller
            self.refused = err
            raise

    def _transform(self, mod: tvm.IRModule) -> tvm.IRModule:
        builder = relax.BlockBuilder(mod)
        updates = {}
        for gv, func in mod.functions_items():
            if isinstance(func, relax.Function) and isinstance(func.body, relax.SeqExpr):
                new = self._function(gv.name_hint, func, builder)
                if new is not None:
                    updates[gv] = new
        if not updates:
            return mod
        return relax.transform.Normalize()(replace_functions(builder.get(), updates))

    def _function(self, fname, func, builder) -> Optional[relax.Function]:
        dims, ranges = signature_dims(func), declared_ranges(func)
        analyzer = _analyzer(dims, ranges)
        values, refusal = ValueRanges(func, analyzer), _Refusal(dims, ranges)
        blocks, changed = [], False
        for block in func.body.blocks:
            bindings = []
            for b in block.bindings:
                call = b.value if isinstance(b, relax.VarBinding) else None
                op = getattr(getattr(call, "op", None), "name", None) if isinstance(call, relax.Call) else None
                if op == "relax.strided_slice":
                    _check_slice(b.var, call, analyzer, refusal, _node(func, "Slice", call, b.var))
                if op in GUARDED_OPS and (op != "relax.take" or call.attrs.mode == "fast"):
                    node = _node(func, GUARDED_OPS[op].onnx_name, call, b.var)
                    new = self._guard(fname, node, b, op, call, values, analyzer, refusal, builder,
                                      isinstance(block, relax.DataflowBlock))
                    if new is not None:
                        bindings += new
                        changed = True
                        continue
                bindings.append(b)
            blocks.append(relax.DataflowBlock(bindings, block.span)
                          if isinstance(block, relax.DataflowBlock)
                          else relax.BindingBlock(bindings, block.span))
        if not changed:
            return None
        body = relax.SeqExpr(blocks, func.body.body, func.body.span)
        return relax.Function(func.params, body, func.ret_ty, func.is_pure, func.attrs, func.span)

    def _guard(self, fname, node, binding, op, call, values, analyzer, refusal, builder, dataflow):
        spec = GUARDED_OPS[op]
        axes = index_axes(op, call)
        data, indices = call.args[0], call.args[spec.indices_arg]
        where = f"{fname}: {node}"
        shape = getattr(data.ty, "shape", None)
        if axes is not None and not spec.coordinates and shape is not None:
            extent = shape[axes[0]]
            lo_ok = -extent if spec.wraps_negative else tirx.IntImm("int64", 0)
            got: Optional[ValueRange] = values.of(indices)
            if got is not None:
                if analyzer.can_prove(got.lo >= lo_ok) and analyzer.can_prove(got.hi <= extent - 1):
                    self.proved.append(where)
                    return None
                if got.tight:
                    refusal.check(got.hi - (extent - 1),
                                  _reads(node, call, got.hi, extent, axes[0]))
        if not self.runtime_checks:
            return None
        if axes is None or getattr(indices.ty, "ndim", -1) < 0 or not dtype_name(indices.ty).startswith("int"):
            return None  # unknown rank or axis: the op's own type checks are all we have
        message = _message(node, spec, call, axes, values.bindings.get(indices))
        kernel = check_kernel(data.ty, indices.ty, axes, spec.coordinates, spec.wraps_negative, message)
        gv = builder.add_func(kernel, "relax_memplan_check_indices")
        var_type = relax.DataflowVar if dataflow else relax.Var
        checked = var_type(f"{binding.var.name}_indices", indices.ty)
        args = list(call.args)
        args[spec.indices_arg] = checked
        self.checked.append(where)
        return [relax.VarBinding(checked, relax.call_tir(gv, [data, indices], indices.ty)),
                relax.VarBinding(binding.var, relax.Call(call.op, args, call.attrs, call.ty_args,
                                                         call.span))]


def _reads(node, call, hi, extent, axis) -> str:
    if axis == 0 and call.op.name == "relax.take":
        return f"{node} reads row {_fmt(hi)} of a {_fmt(extent)}-row table"
    return f"{node} reads index {_fmt(hi)} of axis {axis} (size {_fmt(extent)})"


def _check_slice(var, call, analyzer, refusal, node) -> None:
    """``strided_slice(..., assume_inbound=True)`` with symbolic bounds: no clamping, so its
    last element must lie inside the axis at every declared dim value."""
    if not call.attrs.assume_inbound or len(call.args) < 4:
        return
    shape, out = getattr(call.args[0].ty, "shape", None), getattr(var.ty, "shape", None)
    if shape is None or out is None:
        return
    axes, begins = call.args[1].fields if hasattr(call.args[1], "fields") else (), call.args[2]
    strides = call.args[4].fields if len(call.args) > 4 else None
    for k, axis in enumerate(axes):
        axis = int(_value(axis))
        begin = _prim(begins.fields[k]) if hasattr(begins, "fields") else None
        stride = _prim(strides[k]) if strides is not None else tirx.IntImm("int64", 1)
        if begin is None or not isinstance(stride, tirx.IntImm) or stride.value < 1:
            continue
        begin, stride = _i64(begin), _i64(stride)
        last = begin + (out[axis] - 1) * stride
        if analyzer.can_prove(last <= shape[axis] - 1) or analyzer.can_prove(out[axis] == 0):
            continue
        refusal.check(last - (shape[axis] - 1),
                      f"{node} reads element {_fmt(analyzer.simplify(last))} "
                      f"of axis {axis} (size {_fmt(shape[axis])})")


def _fmt(expr) -> str:
    """``seq - 1`` rather than TVMScript's ``seq - T.int64(1)``."""
    return expr_text(expr)


def _value(x):
    return getattr(x, "value", x)


def _message(node, spec, call, axes, indices_value) -> str:
    shape = call.args[0].ty.shape
    mapped = (isinstance(indices_value, relax.Call)
              and getattr(indices_value.op, "name", "") == "relax.where")
    ranges = []
    for axis in axes:
        s = shape[axis] if shape is not None else f"shape[{axis}]"
        lo = f"-{_fmt(s)}" if spec.wraps_negative or mapped else "0"
        hi = _fmt(tvm.sym.Analyzer().simplify(s - 1)) if shape is not None else f"{s}-1"
        ranges.append(f"[{lo}, {hi}]")
    return f"{INDEX_CHECK_MESSAGE} {node}: valid {', '.join(ranges)}"
