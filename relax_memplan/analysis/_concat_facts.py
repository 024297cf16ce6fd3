"""Facts about concatenation calls gathered while :mod:`relax_memplan.analysis.liveness` walks a
function (private): which tensor's whole storage each argument of a concat call is, which calls
may write a tensor, and which tensors sit in a tuple used otherwise than through
``TupleGetItem``. :mod:`relax_memplan.transform._concat_plan` decides from them."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import FrozenSet, Optional

import tvm
from tvm import relax

from .concat import written_params

__all__ = ["ConcatSite", "ConcatFacts"]

_ALLOC_TENSOR = "relax.builtin.alloc_tensor"
# Ops whose result shares the storage of their first argument.
_VIEW_OPS = frozenset({"relax.reshape", "relax.memory.view", "relax.memory.ensure_zero_offset"})
# Views that cover the whole storage of their argument from byte 0.
_WHOLE_VIEW_OPS = frozenset({"relax.reshape", "relax.memory.ensure_zero_offset"})


@dataclass(frozen=True)
class ConcatSite:
    """A call of a concatenation kernel (:mod:`relax_memplan.analysis.concat`).

    Attributes
    ----------
    step : int
        Program step of the call.
    kernel : str
        PrimFunc name.
    axis : int
        Concatenation axis.
    inputs : tuple
        Per input argument: the index in :attr:`FunctionLiveness.tensors` of the tensor
        whose whole storage it is, or a string saying why there is none
        (``"function parameter"``, ``"constant"``, ``"view or alias of other storage"``).
    output : int or str
        The same for the output argument (the last one).
    binding_var : relax.Var
        The variable the call is bound to (identifies the binding).
    """

    step: int
    kernel: str
    axis: int
    inputs: tuple
    output: object
    binding_var: object = field(default=None, compare=False, repr=False)


class ConcatFacts:
    """Mixin of the liveness analyzer; uses its ``_tensors``, ``_direct``, ``_alias``,
    ``_tensors_of``, ``_vars_in``, ``_is_prim_func`` and the ``_concat_table``,
    ``_params``, ``_tuple_fields``, ``_item_direct``, ``_written_params``,
    ``_concat_sites`` and ``_binding_var`` it sets up."""

    def _escape(self, tensors: FrozenSet[int]) -> None:
        for i in tensors:
            self._tensors[i].in_escaping_tuple = True

    def _whole_of(self, expr) -> Optional[int]:
        """The tensor whose whole storage ``expr`` is, also through an item of a tuple literal."""
        if isinstance(expr, relax.Var):
            if expr in self._direct:
                return self._direct[expr]
            return self._item_direct.get(expr)
        return None

    def _note_concat_facts(self, var, value, step: int, match_cast: bool) -> None:
        """Tuple literals and their escapes, whole-storage items, writes, concat sites."""
        whole_var = value if isinstance(value, relax.Var) else (
            value.args[0] if isinstance(value, tvm.ir.Call) and isinstance(value.op, tvm.ir.Op)
            and value.op.name in _WHOLE_VIEW_OPS and value.args else None)
        if isinstance(value, relax.Tuple) and not match_cast:
            self._tuple_fields[var] = [self._whole_of(f) for f in value.fields]
            nested = [v for f in value.fields for v in self._vars_in(f) if v in self._tuple_fields]
        elif (isinstance(value, relax.TupleGetItem) and not match_cast
              and isinstance(value.tuple_value, relax.Var)
              and value.tuple_value in self._tuple_fields):
            fields = self._tuple_fields[value.tuple_value]
            if 0 <= value.index < len(fields) and fields[value.index] is not None:
                self._item_direct[var] = fields[value.index]
            nested = []
        else:
            nested = [v for v in self._vars_in(value) if v in self._tuple_fields]
            if isinstance(value, tvm.ir.Call):
                for arg in value.args:
                    if isinstance(arg, relax.Tuple):
                        self._escape(self._tensors_of(arg))
            if whole_var is not None and self._whole_of(whole_var) is not None:
                self._item_direct[var] = self._whole_of(whole_var)
        for v in nested:
            self._escape(self._alias.get(v, frozenset()))
        if isinstance(value, tvm.ir.Call):
            self._note_writes(value, step)

    def _note_writes(self, call, step: int) -> None:
        """Record ``step`` on every tensor the call may write; record a concat site."""
        op = call.op
        if isinstance(op, tvm.ir.Op) and (op.name in _VIEW_OPS or op.name == _ALLOC_TENSOR):
            return
        if self._is_prim_func(op):
            name = op.name_hint
            if name not in self._written_params:
                self._written_params[name] = written_params(self._mod[op])
            positions = self._written_params[name]
            if name in self._concat_table:
                self._note_concat_site(call, step, name)
        else:
            positions = range(len(call.args))  # extern or other op: may write anything
        for k in positions:
            if k < len(call.args):
                for i in self._tensors_of(call.args[k]):
                    self._tensors[i].write_steps.append(step)

    def _arg_fact(self, arg):
        idx = self._whole_of(arg)
        if idx is not None:
            return idx
        if isinstance(arg, relax.Var) and arg in self._params:
            return "function parameter"
        if not isinstance(arg, relax.Var):
            return "constant"
        return "view or alias of other storage"

    def _note_concat_site(self, call, step: int, name: str) -> None:
        facts = tuple(self._arg_fact(a) for a in call.args)
        self._concat_sites.append(ConcatSite(step, name, self._concat_table[name], facts[:-1],
                                             facts[-1], self._binding_var))

