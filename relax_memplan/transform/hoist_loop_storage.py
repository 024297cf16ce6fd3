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
It works on the recursive loop form of :mod:`relax_memplan.frontend.prepare.recursive_loops`:
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

from typing import Dict

import tvm
from tvm import relax

from ..analysis.loop_form import LOOP_BODY_ATTR, LOOP_DRIVER_ATTR, LOOP_OUTER_ATTR
from ._loop_storage import (AllocateBeforeCalls, NotHoistable, ThreadStorage, find_call,
                            lift_size, loop_storages, storage_params, typed_global_var,
                            without_bindings)

__all__ = ["HoistLoopStorage", "HOISTED_BYTES_ATTR"]

HOISTED_BYTES_ATTR = "relax_memplan.hoisted_bytes"

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
        storages, reason = loop_storages(body)
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
        new_body = without_bindings(body, {s.var for s in storages},
                                     [s.var for s in storages])
        new_body = new_body.with_attr(HOISTED_BYTES_ATTR, sum(
            s.size_bytes * (2 if s.output else 1) for s in storages))
        new_body_gv = typed_global_var(body_gv.name_hint, new_body)
        original = mod
        mod = mod.clone()
        del mod[body_gv]
        mod[new_body_gv] = new_body
        # the driver: the body gets slot A, the next iteration A and B swapped
        params = storage_params(storages, order)
        body_args = [params[(k, "" if not s.output else "a")] for k, s in enumerate(storages)]
        swapped = [params[(k, {"": "", "a": "b", "b": "a"}[slot])] for k, slot in order]
        mod, top = self._thread(mod, driver_gv, params, order, [(body_gv, new_body_gv,
                                                                  body_args)], swapped)
        # the outer driver (chunks of even length): the same slots to every chunk
        outers = [gv for gv, f in mod.functions_items() if isinstance(f, relax.Function)
                  and f.attrs is not None
                  and str(f.attrs.get(LOOP_OUTER_ATTR, "")) == driver_gv.name_hint]
        for outer_gv in outers:
            params = storage_params(storages, order)
            straight = [params[key] for key in order]
            mod, outer_top = self._thread(mod, outer_gv, params, order,
                                          [(driver_gv, top, straight)], straight)
            driver_gv, top = outer_gv, outer_top
        for gv, func in list(mod.functions_items()):
            if not isinstance(func, relax.Function) or gv.same_as(top):
                continue
            alloc = AllocateBeforeCalls(mod, (driver_gv, top), storages, order, sizes)
            try:
                new_func = alloc.visit_expr(func)
            except NotHoistable as err:
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
            call = find_call(mod[caller_gv].body, callee_gv)
            if call is None:
                return None
            sizes = [None if size is None else lift_size(size, mod[callee_gv], call)
                     for size in sizes]
        return sizes

    @staticmethod
    def _thread(mod, gv, params, order, callees, self_args):
        """``gv`` with the storages as parameters, passed to ``callees`` (``(old GlobalVar,
        new GlobalVar, arguments)``) and, as ``self_args``, to itself; a new GlobalVar."""
        func = mod[gv]
        new_params = list(func.params) + [params[key] for key in order]
        new_gv = typed_global_var(gv.name_hint, relax.Function(
            new_params, func.body, func.ret_ty, func.is_pure, func.attrs))
        threaded = ThreadStorage(mod, callees + [(gv, new_gv, self_args)])
        new_func = relax.Function(new_params, threaded.visit_expr(func.body), func.ret_ty,
                                  func.is_pure, func.attrs)
        del mod[gv]
        mod[new_gv] = new_func
        return mod, new_gv
