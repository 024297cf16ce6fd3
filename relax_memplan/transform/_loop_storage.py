"""Helpers of :mod:`relax_memplan.transform.hoist_loop_storage`: which storages of a loop
body can move out of the loop, their sizes in the caller's dims, and the rewrites of the
calls that pass them."""

from __future__ import annotations

from typing import List, Optional, Tuple

import tvm
from tvm import relax, tirx
from tvm.relax.expr_functor import PyExprMutator, mutator

from ..analysis.loop_form import LOOP_CARRIED_ATTR

__all__ = ["Storage", "loop_storages", "find_call", "lift_size", "without_bindings",
           "ThreadStorage", "AllocateBeforeCalls", "NotHoistable", "storage_params",
           "typed_global_var"]

_ALLOC_STORAGE = "relax.memory.alloc_storage"
_ALLOC_TENSOR = "relax.memory.alloc_tensor"


def _op_name(value) -> Optional[str]:
    if isinstance(value, relax.Call) and isinstance(value.op, tvm.ir.Op):
        return value.op.name
    return None


class Storage:
    """One hoisted ``alloc_storage`` binding of a body."""

    def __init__(self, var: relax.Var, call: relax.Call, output: bool):
        self.var, self.call, self.output = var, call, output

    @property
    def size(self):
        """The size in bytes, an int or a PrimExpr of the body's dims."""
        return self.call.args[0].values[0]

    @property
    def size_bytes(self) -> int:
        """The size in bytes when constant, else 0 (for the byte counts of the report)."""
        return int(self.size) if isinstance(self.size, tirx.IntImm) else 0

    def sized(self, size) -> relax.Call:
        """This ``alloc_storage`` call with ``size`` (bytes, in the caller's dims)."""
        args = list(self.call.args)
        return relax.Call(self.call.op, [relax.ShapeExpr([size])] + args[1:], self.call.attrs,
                          self.call.ty_args)


def loop_storages(func: relax.Function) -> Tuple[List[Storage], Optional[str]]:
    """The hoistable storages of a body, or a reason it cannot be hoisted."""
    bindings = {b.var: b.value for block in func.body.blocks for b in block.bindings}
    storages = {}
    for var, value in bindings.items():
        if _op_name(value) != _ALLOC_STORAGE:
            continue
        size = value.args[0]
        if not (isinstance(size, relax.ShapeExpr) and len(size.values) == 1):
            return [], f"storage '{var.name}' has no size expression"
        storages[var] = value
    outputs = set()
    result = func.body.body
    fields = result.fields if isinstance(result, relax.Tuple) else [result]
    if isinstance(result, relax.Var) and isinstance(bindings.get(result), relax.Tuple):
        fields = bindings[result].fields
    params = set(func.params)
    num_carried = int(func.attrs[LOOP_CARRIED_ATTR])
    for field in fields[num_carried:]:
        if _origin(field, bindings) not in params:
            return [], f"scan output '{field}' is not a buffer written in place"
    for field in fields[:num_carried]:
        source = _origin(field, bindings)
        value = bindings.get(source)
        if _op_name(value) != _ALLOC_TENSOR or value.args[0] not in storages:
            return [], (f"loop-carried value '{field}' is not a tensor of the body's own "
                        "storage (it is an input or a view of one)")
        outputs.add(value.args[0])
    return [Storage(v, c, v in outputs) for v, c in storages.items()], None


_VIEW_OPS = ("relax.reshape", "relax.memory.view", "relax.match_cast")
_VIEW_BUILTINS = ("vm.builtin.reshape", "vm.builtin.ensure_zero_offset")


def _origin(expr, bindings):
    """Follow variable copies and views (reshape, ``match_cast``, zero-offset views) back
    to the binding that made the memory ``expr`` lives in."""
    while isinstance(expr, relax.Var):
        value = bindings.get(expr)
        if isinstance(value, relax.Var):
            expr = value
        elif _op_name(value) in _VIEW_OPS:
            expr = value.args[0]
        elif (_op_name(value) == "relax.call_pure_packed"
              and getattr(value.args[0], "global_symbol", None) in _VIEW_BUILTINS):
            expr = value.args[1]
        else:
            return expr
    return expr


def find_call(expr, gv) -> Optional[relax.Call]:
    """A call of ``gv`` in ``expr`` (a function body: blocks, ``If`` branches)."""
    if isinstance(expr, relax.SeqExpr):
        for block in expr.blocks:
            for binding in block.bindings:
                found = find_call(binding.value, gv)
                if found is not None:
                    return found
        return find_call(expr.body, gv)
    if isinstance(expr, relax.If):
        found = find_call(expr.true_branch, gv)
        return found if found is not None else find_call(expr.false_branch, gv)
    if isinstance(expr, relax.Call) and isinstance(expr.op, tvm.ir.GlobalVar) \
            and expr.op.same_as(gv):
        return expr
    return None


def lift_size(size, callee: relax.Function, call: relax.Call):
    """``size`` (a PrimExpr of ``callee``'s dims) in the dims of the function making
    ``call``: each dim is matched to the same axis of the argument passed for the parameter
    whose shape it is; ``None`` when a dim is no parameter's (the iteration number)."""
    if isinstance(size, tirx.IntImm):
        return size
    analyzer = tvm.sym.Analyzer()
    for var in tirx.analysis.undefined_vars(size, []):
        source = None
        for param, arg in zip(callee.params, call.args):
            pshape, ashape = _shape(param), _shape(arg)
            if pshape is None or ashape is None or len(pshape) != len(ashape):
                continue
            for pdim, adim in zip(pshape, ashape):
                if pdim.same_as(var):
                    source = adim
        if source is None:
            return None
        analyzer.bind(var, source)
    return analyzer.simplify(size)


def _shape(expr):
    ty = getattr(expr, "ty", None)
    if isinstance(ty, relax.TensorType) and isinstance(ty.shape, relax.ShapeExpr):
        return list(ty.shape.values)
    return None


def without_bindings(func: relax.Function, drop, extra_params) -> relax.Function:
    blocks = []
    for block in func.body.blocks:
        kept = [b for b in block.bindings if b.var not in drop]
        cls = relax.DataflowBlock if isinstance(block, relax.DataflowBlock) else relax.BindingBlock
        blocks.append(cls(kept))
    body = relax.SeqExpr(blocks, func.body.body)
    return relax.Function(list(func.params) + list(extra_params), body, func.ret_ty,
                          func.is_pure, func.attrs)


@mutator
class ThreadStorage(PyExprMutator):
    """Append the hoisted storages to calls: ``targets`` is a list of ``(old GlobalVar,
    new GlobalVar, extra arguments)``."""

    def __init__(self, mod, targets):
        super().__init__(mod)
        self.targets = targets

    def visit_call_(self, call):
        call = super().visit_call_(call)
        for old, new, extra in self.targets:
            if call.op.same_as(old):
                return relax.Call(new, list(call.args) + list(extra), call.attrs, call.ty_args)
        return call


@mutator
class AllocateBeforeCalls(PyExprMutator):
    """In a caller of the driver: allocate the storages once, just before each call."""

    def __init__(self, mod, driver, storages: List[Storage], order: List[Tuple[int, str]],
                 sizes):
        super().__init__(mod)
        (self.old, self.new), self.storages, self.order = driver, storages, order
        self.sizes, self.callee = sizes, mod[driver[1]]
        self.calls = 0

    def visit_call_(self, call):
        call = super().visit_call_(call)
        if not call.op.same_as(self.old):
            return call
        self.calls += 1
        made = []
        for k, slot in self.order:
            size = lift_size(self.sizes[k], self.callee, call)
            if size is None:
                raise NotHoistable(f"the size of storage {k} is not known before the loop")
            made.append(self.builder_.emit(self.storages[k].sized(size), f"loop_storage{k}{slot}"))
        return relax.Call(self.new, list(call.args) + made, call.attrs, call.ty_args)


class NotHoistable(Exception):
    """A storage whose size is not known where the loop is called."""


def storage_params(storages, order):
    """One new parameter per ``(storage index, slot)`` of ``order`` (slot ``""`` shared,
    ``"a"``/``"b"`` the two slots of an output storage), typed as the storage."""
    return {key: relax.Var(f"loop_storage{key[0]}{key[1]}", storages[key[0]].var.ty)
            for key in order}


def typed_global_var(name: str, func: relax.Function) -> tvm.ir.GlobalVar:
    """A new GlobalVar ``name`` typed with ``func``'s signature (a call is typed from its
    callee's GlobalVar, so a function whose parameters change needs a new one)."""
    gv = tvm.ir.GlobalVar(name)
    relax.expr._update_type(gv, func.ty)  # pylint: disable=protected-access
    return gv
