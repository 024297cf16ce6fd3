"""HoistLoopStorage: a loop body's storage allocated once per call of the model, not per
iteration.

Where it runs
-------------
In the finalize phase, right after ``LowerAllocTensor`` (every allocation is then an
``R.memory.alloc_storage``: our arenas, TVM's storage tokens and the function outputs'
storage) and before ``KillAfterLastUse``.  Only with our planner: the ``tvm`` baseline
keeps TVM's behaviour (the body allocates on every iteration).

What it does
------------
It works on the recursive loop form of :mod:`relax_memplan.onnx_prepare.recursive_loops`:
a body function (attribute ``relax_memplan.loop_body``) called by a recursive driver
(attribute ``relax_memplan.loop_driver`` = the body's name), itself called from the model.

1. Every top-level ``alloc_storage`` of constant size in the body becomes a parameter of
   the body.  A storage that holds a returned tensor (a loop-carried value) is an
   *output slot*; the others (the arena of the body's temporaries, planned once by
   :class:`~relax_memplan.transform.plan_static_memory.PlanStaticMemory`) are *shared*.
2. The driver takes the shared storages and two copies ``A``/``B`` of every output slot:
   it calls the body with ``A`` and itself with ``B, A`` swapped, so iteration ``t``
   writes its carried values into one slot while it reads the previous iteration's from
   the other (the body's carried outputs are fresh tensors, never an input or a view of
   one: the converter guarantees it, and this pass checks it).
3. The outer driver (attribute ``relax_memplan.loop_outer``, which runs the driver chunk
   by chunk, every chunk but the last of even length) passes the same storages to every
   chunk: each chunk starts writing slot ``A`` and reads what the last chunk wrote in ``B``.
4. Every other caller allocates the storages once, just before the call.

Iterations then allocate nothing; a call of the model allocates the body's arena once
and each output slot twice.  A storage sized by the body's symbolic dims (a batch dim)
is sized in the caller's dims: each dim is the same axis of the argument passed for the
parameter it comes from, through the drivers' calls.  The pass leaves a body alone (and
says why in :attr:`HoistLoopStorage.skipped`; the body then allocates on every
iteration, as with TVM) when a returned value is not a tensor of its own storage.  A
storage whose size depends on the iteration number stays in the body (allocated on every
iteration, said in :attr:`HoistLoopStorage.kept`); the others are hoisted.

Function attributes
-------------------
Reads ``relax_memplan.loop_body``, ``relax_memplan.loop_carried``,
``relax_memplan.loop_driver`` and ``relax_memplan.loop_outer``; writes
``relax_memplan.hoisted_bytes`` (bytes allocated once instead of per iteration: shared
storage plus both output slots; sizes known only at run time count 0) on each body it
changed.
"""

from __future__ import annotations

from typing import Dict, List, Optional, Tuple

import tvm
from tvm import relax, tirx
from tvm.relax.expr_functor import PyExprMutator, mutator

from ..onnx_prepare.recursive_loops import (LOOP_BODY_ATTR, LOOP_CARRIED_ATTR,
                                            LOOP_DRIVER_ATTR, LOOP_OUTER_ATTR)

__all__ = ["HoistLoopStorage", "HOISTED_BYTES_ATTR"]

HOISTED_BYTES_ATTR = "relax_memplan.hoisted_bytes"

_ALLOC_STORAGE = "relax.memory.alloc_storage"
_ALLOC_TENSOR = "relax.memory.alloc_tensor"


def _op_name(value) -> Optional[str]:
    if isinstance(value, relax.Call) and isinstance(value.op, tvm.ir.Op):
        return value.op.name
    return None


class _Storage:
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


def _storages(func: relax.Function) -> Tuple[List[_Storage], Optional[str]]:
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
    return [_Storage(v, c, v in outputs) for v, c in storages.items()], None


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


def _find_call(expr, gv) -> Optional[relax.Call]:
    """A call of ``gv`` in ``expr`` (a function body: blocks, ``If`` branches)."""
    if isinstance(expr, relax.SeqExpr):
        for block in expr.blocks:
            for binding in block.bindings:
                found = _find_call(binding.value, gv)
                if found is not None:
                    return found
        return _find_call(expr.body, gv)
    if isinstance(expr, relax.If):
        found = _find_call(expr.true_branch, gv)
        return found if found is not None else _find_call(expr.false_branch, gv)
    if isinstance(expr, relax.Call) and isinstance(expr.op, tvm.ir.GlobalVar) \
            and expr.op.same_as(gv):
        return expr
    return None


def _lift(size, callee: relax.Function, call: relax.Call):
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


def _without_bindings(func: relax.Function, drop, extra_params) -> relax.Function:
    blocks = []
    for block in func.body.blocks:
        kept = [b for b in block.bindings if b.var not in drop]
        cls = relax.DataflowBlock if isinstance(block, relax.DataflowBlock) else relax.BindingBlock
        blocks.append(cls(kept))
    body = relax.SeqExpr(blocks, func.body.body)
    return relax.Function(list(func.params) + list(extra_params), body, func.ret_ty,
                          func.is_pure, func.attrs)


@mutator
class _ThreadStorage(PyExprMutator):
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
class _AllocateBeforeCalls(PyExprMutator):
    """In a caller of the driver: allocate the storages once, just before each call."""

    def __init__(self, mod, driver, storages: List[_Storage], order: List[Tuple[int, str]],
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
            size = _lift(self.sizes[k], self.callee, call)
            if size is None:
                raise _NotHoistable(f"the size of storage {k} is not known before the loop")
            made.append(self.builder_.emit(self.storages[k].sized(size), f"loop_storage{k}{slot}"))
        return relax.Call(self.new, list(call.args) + made, call.attrs, call.ty_args)


class _NotHoistable(Exception):
    """A storage whose size is not known where the loop is called."""


@tvm.transform.module_pass(opt_level=0, name="HoistLoopStorage")
class HoistLoopStorage:
    """Move the storage of recursive loop bodies out of the loop (see the module docstring).

    Attributes
    ----------
    hoisted : dict of str to int
        Body function name -> bytes now allocated once per call instead of per iteration.
    skipped : dict of str to str
        Body function name -> why its storage stays per iteration.
    allocated_in : dict of str to int
        Caller function name (``main``) -> bytes of loop storage it now allocates per call
        (constant sizes, on top of its own plan).
    kept : dict of str to str
        Body function name -> the storages left in a hoisted body (sized by the iteration
        number: still allocated on every iteration).
    """

    def __init__(self):
        self.hoisted: Dict[str, int] = {}
        self.skipped: Dict[str, str] = {}
        self.kept: Dict[str, str] = {}
        self.allocated_in: Dict[str, int] = {}

    def transform_module(self, mod: tvm.IRModule, _ctx) -> tvm.IRModule:
        funcs = {gv: f for gv, f in mod.functions_items() if isinstance(f, relax.Function)}
        for body_gv, body in funcs.items():
            if body.attrs is None or LOOP_BODY_ATTR not in body.attrs:
                continue
            drivers = [gv for gv, f in funcs.items() if f.attrs is not None
                       and str(f.attrs.get(LOOP_DRIVER_ATTR, "")) == body_gv.name_hint]
            if len(drivers) != 1:
                self.skipped[body_gv.name_hint] = f"{len(drivers)} driver functions"
                continue
            mod = self._hoist(mod, body_gv, drivers[0])
        return mod

    def _hoist(self, mod, body_gv, driver_gv) -> tvm.IRModule:
        body = mod[body_gv]
        storages, reason = _storages(body)
        if reason is not None or not storages:
            self.skipped[body_gv.name_hint] = reason or "nothing to hoist"
            return mod
        lifted = self._lifted_sizes(mod, body_gv, driver_gv, storages)
        if lifted is None or any(size is None and s.output for s, size in zip(storages, lifted)):
            self.skipped[body_gv.name_hint] = "the loop is not called as the converter makes it"
            return mod
        kept = [s for s, size in zip(storages, lifted) if size is None]
        if kept:  # sized by the iteration number: allocated on every iteration, as with TVM
            self.kept[body_gv.name_hint] = (
                f"{len(kept)} storage(s) whose size depends on the iteration "
                f"({', '.join(s.var.name for s in kept)}) stay in the body")
        sizes = [size for size in lifted if size is not None]
        storages = [s for s, size in zip(storages, lifted) if size is not None]
        if not storages:
            self.skipped[body_gv.name_hint] = self.kept.pop(body_gv.name_hint)
            return mod
        # driver parameters: shared storages, then output slots A, then B
        order = ([(k, "") for k, s in enumerate(storages) if not s.output]
                 + [(k, "a") for k, s in enumerate(storages) if s.output]
                 + [(k, "b") for k, s in enumerate(storages) if s.output])
        new_body = _without_bindings(body, {s.var for s in storages},
                                     [s.var for s in storages])
        new_body = new_body.with_attr(HOISTED_BYTES_ATTR, sum(
            s.size_bytes * (2 if s.output else 1) for s in storages))
        new_body_gv = _typed_global_var(body_gv.name_hint, new_body)
        original = mod
        mod = mod.clone()
        del mod[body_gv]
        mod[new_body_gv] = new_body
        # the driver: the body gets slot A, the next iteration A and B swapped
        params = _params(storages, order)
        body_args = [params[(k, "" if not s.output else "a")] for k, s in enumerate(storages)]
        swapped = [params[(k, {"": "", "a": "b", "b": "a"}[slot])] for k, slot in order]
        mod, top = self._thread(mod, driver_gv, params, order, [(body_gv, new_body_gv,
                                                                  body_args)], swapped)
        # the outer driver (chunks of even length): the same slots to every chunk
        outers = [gv for gv, f in mod.functions_items() if isinstance(f, relax.Function)
                  and f.attrs is not None
                  and str(f.attrs.get(LOOP_OUTER_ATTR, "")) == driver_gv.name_hint]
        for outer_gv in outers:
            params = _params(storages, order)
            straight = [params[key] for key in order]
            mod, outer_top = self._thread(mod, outer_gv, params, order,
                                          [(driver_gv, top, straight)], straight)
            driver_gv, top = outer_gv, outer_top
        for gv, func in list(mod.functions_items()):
            if not isinstance(func, relax.Function) or gv.same_as(top):
                continue
            alloc = _AllocateBeforeCalls(mod, (driver_gv, top), storages, order, sizes)
            try:
                new_func = alloc.visit_expr(func)
            except _NotHoistable as err:
                self.skipped[body_gv.name_hint] = str(err)
                return original
            if alloc.calls:
                mod[gv] = new_func
                self.allocated_in[gv.name_hint] = self.allocated_in.get(gv.name_hint, 0) + (
                    alloc.calls * int(new_body.attrs[HOISTED_BYTES_ATTR]))
        self.hoisted[body_gv.name_hint] = int(new_body.attrs[HOISTED_BYTES_ATTR])
        return mod

    @staticmethod
    def _lifted_sizes(mod, body_gv, driver_gv, storages):
        """Each storage's size in the dims of the outermost driver (an item ``None`` where it
        depends on the iteration number; ``None`` when a driver does not call the body)."""
        sizes = [s.size for s in storages]
        chain = [(body_gv, driver_gv)]
        for gv, func in mod.functions_items():
            if isinstance(func, relax.Function) and func.attrs is not None \
                    and str(func.attrs.get(LOOP_OUTER_ATTR, "")) == driver_gv.name_hint:
                chain.append((driver_gv, gv))
        for callee_gv, caller_gv in chain:
            call = _find_call(mod[caller_gv].body, callee_gv)
            if call is None:
                return None
            sizes = [None if size is None else _lift(size, mod[callee_gv], call)
                     for size in sizes]
        return sizes

    @staticmethod
    def _thread(mod, gv, params, order, callees, self_args):
        """``gv`` with the storages as parameters, passed to ``callees`` (``(old GlobalVar,
        new GlobalVar, arguments)``) and, as ``self_args``, to itself; a new GlobalVar."""
        func = mod[gv]
        new_params = list(func.params) + [params[key] for key in order]
        new_gv = _typed_global_var(gv.name_hint, relax.Function(
            new_params, func.body, func.ret_ty, func.is_pure, func.attrs))
        threaded = _ThreadStorage(mod, callees + [(gv, new_gv, self_args)])
        new_func = relax.Function(new_params, threaded.visit_expr(func.body), func.ret_ty,
                                  func.is_pure, func.attrs)
        del mod[gv]
        mod[new_gv] = new_func
        return mod, new_gv


def _params(storages, order):
    return {key: relax.Var(f"loop_storage{key[0]}{key[1]}", storages[key[0]].var.ty)
            for key in order}


def _typed_global_var(name: str, func: relax.Function) -> tvm.ir.GlobalVar:
    gv = tvm.ir.GlobalVar(name)
    relax.expr._update_type(gv, func.ty)  # pylint: disable=protected-access
    return gv
