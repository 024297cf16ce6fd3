"""Liveness of the tensors a Relax function allocates, at the point where memory is planned.

The analysis runs on a function after ``CallTIRRewrite`` (the place of TVM's
``StaticPlanBlockMemory``), where every intermediate tensor is an explicit
``R.builtin.alloc_tensor`` binding and every kernel call writes into its output
arguments (destination-passing style).

Program steps
-------------
Every binding gets one step, in program order. The bindings of an ``R.If``
are linearised: the condition, then the true branch, then the false branch,
then the binding of the ``If`` result. This order is a safe model of both
run-time paths: a tensor local to one branch is never live together with a
tensor local to the other branch, and a tensor from outside the ``If`` that
is used in either branch stays live across everything in between.

Aliases
-------
A tensor stays live while any value that may refer to its storage is live:
plain variable rebinding, ``R.reshape`` views (lowered to
``vm.builtin.reshape``, which shares storage), ``match_cast``, tuples and
tuple items (conservatively: every tensor of the tuple), the result of an
extern (packed) call (conservatively: every tensor argument), and ``If``
results (the tensors of both branches).

In-place reuse
--------------
With a kernel table (:func:`relax_memplan.analysis.inplace.kernel_table`), a kernel
call may write its output over an input: when the table allows the pair, the output
argument is a fresh allocation (no call took it before) and the input argument refers
to the whole storage of one tensor (the allocation itself, a rebinding, a
``match_cast``, an ``R.reshape`` or ``ensure_zero_offset`` of it, never a tuple item or
an extern result), of the same dtype, byte size, device and scope, that **dies at this
call** (its last use, aliases included, is this step) and is passed by no other
argument of the call, and both tensors are plannable (so neither is a function
parameter, output, constant or retained tensor) or held back only by a symbolic size.
Symbolic byte sizes must be equal *as expressions*: ``tvm.sym.Analyzer`` proves the two
byte-size PrimExprs equal for every value of the dims (``PlanDynamicMemory``'s ``exact``
strategy places such a pair; ``PlanStaticMemory`` uses only pairs of tensors it places).
The pairs are listed in :attr:`FunctionLiveness.inplace`; the planner gives both tensors
one offset.

Concatenations
--------------
With a concat table (:func:`relax_memplan.analysis.concat.concat_table`), every call of a
concatenation kernel is listed in :attr:`FunctionLiveness.concat_sites` with, per
argument, the tensor whose whole storage it is (an allocation, a rebinding, a whole view,
or an item of a tuple literal of such, the tuple used only through ``TupleGetItem``) or
why there is none; each tensor records the steps of the calls that may write it
(:attr:`TensorLiveness.write_steps`), its first use and whether it sits in a tuple used
otherwise than through ``TupleGetItem``. The planner
(:mod:`relax_memplan.transform._concat_plan`) decides from these facts.

Which tensors are left to TVM
-----------------------------
A tensor is *not plannable* (and keeps TVM's behaviour) when

* its shape is symbolic (sized at run time);
* it may be part of the function's return value (an output);
* it is passed to a callee that may retain it: a call that is neither a
  PrimFunc of the module, nor an extern packed function, nor a view op.
  This is the rule of TVM's ``StaticPlanBlockMemory`` (``DiscardTokensIn``).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Dict, FrozenSet, List, Optional, Sequence

import tvm
from tvm import relax, tirx

from ._concat_facts import _ALLOC_TENSOR, _VIEW_OPS, _WHOLE_VIEW_OPS, ConcatFacts, ConcatSite

__all__ = ["TensorLiveness", "FunctionLiveness", "InplaceUse", "ConcatSite", "analyze_liveness",
           "dtype_size_bytes", "SYMBOLIC_SHAPE"]

#: ``TensorLiveness.reason`` of a tensor whose only obstacle to static planning
#: is a size that depends on symbolic dims (dynamic planning may place it).
SYMBOLIC_SHAPE = "symbolic shape"



def dtype_size_bytes(dtype: str, num_elements: int) -> int:
    """Bytes the VM allocates for ``num_elements`` elements of ``dtype``.

    Same rule as the Relax VM (``(bits * lanes + 7) // 8`` bytes per element),
    so ``bool`` takes one byte per element.
    """
    dt = tvm.runtime.DataType(dtype)
    return num_elements * ((dt.bits * dt.lanes + 7) // 8)


@dataclass
class TensorLiveness:
    """One ``R.builtin.alloc_tensor`` and its live range.

    Attributes
    ----------
    var : relax.Var
        The variable the allocation is bound to.
    name : str
        Name hint of ``var`` (not necessarily unique in a function).
    uid : str
        Unique id within the function (``name`` or ``name#k``).
    shape : tuple
        Shape as ints (static) or PrimExprs (symbolic), in elements.
    dtype : str
        Element type.
    size_bytes : int or None
        Bytes of the tensor, ``None`` when the shape is symbolic.
    size_expr : tvm.tirx.PrimExpr
        Bytes of the tensor as an int64 expression of the shape's symbolic
        vars (a constant when the shape is static).
    device_index : int
        ``runtime_device_index`` of the allocation.
    storage_scope : str
        Storage scope, e.g. ``"global"``.
    start, end : int
        Half-open live range ``[start, end)`` in program steps: ``start`` is the
        step of the allocation, ``end - 1`` the step of the last use of the
        tensor or of any alias of it.
    aliases : list of str
        Names of the variables that may refer to this tensor's storage.
    in_branch : bool
        Whether the allocation sits inside an ``R.If`` branch.
    reason : str or None
        Why the tensor is left to TVM's planner, ``None`` when plannable.
    producer : str or None
        The kernel (PrimFunc or extern function) that first takes the tensor as an
        argument: in destination-passing style, the one that writes it.
    write_steps : list of int
        Steps of the calls that may write the tensor (a PrimFunc writing the parameter it
        is passed to, any extern call taking it); filled with a concat table only.
    first_use : int or None
        Step of the first binding after the allocation that uses the tensor or an alias.
    in_escaping_tuple : bool
        Whether the tensor is in a tuple used otherwise than through ``TupleGetItem``
        (passed to a call, returned, rebound); filled with a concat table only.
    """

    var: relax.Var
    name: str
    uid: str
    shape: tuple
    dtype: str
    size_bytes: Optional[int]
    size_expr: object
    device_index: int
    storage_scope: str
    start: int
    end: int
    aliases: List[str] = field(default_factory=list)
    in_branch: bool = False
    reason: Optional[str] = None
    producer: Optional[str] = None
    write_steps: List[int] = field(default_factory=list)
    first_use: Optional[int] = None
    in_escaping_tuple: bool = False

    @property
    def plannable(self) -> bool:
        """True when our planner may place the tensor in an arena."""
        return self.reason is None


@dataclass(frozen=True)
class InplaceUse:
    """A kernel call that writes its output over an input tensor that dies there.

    Attributes
    ----------
    step : int
        Program step of the call.
    kernel : str
        PrimFunc name.
    out_index, in_index : int
        Argument positions of the output and of the input it overwrites.
    in_uid, out_uid : str
        Uids of the two tensors (they get one offset).
    call : tvm.ir.Call
        The call in the function body.
    binding_var : relax.Var
        The variable the call is bound to (identifies the binding).
    """

    step: int
    kernel: str
    out_index: int
    in_index: int
    in_uid: str
    out_uid: str
    call: object = field(default=None, compare=False, repr=False)
    binding_var: object = field(default=None, compare=False, repr=False)


@dataclass
class FunctionLiveness:
    """Liveness of all allocations of one Relax function.

    Attributes
    ----------
    name : str
        Global symbol of the function.
    tensors : list of TensorLiveness
        In allocation order.
    num_steps : int
        Number of program steps (bindings, linearised across ``If`` branches).
    """

    name: str
    tensors: List[TensorLiveness]
    num_steps: int
    inplace: List[InplaceUse] = field(default_factory=list)
    concat_sites: List[ConcatSite] = field(default_factory=list)

    def sharing_groups(self, uses: Optional[Sequence["InplaceUse"]] = None) -> List[List[str]]:
        """Uids of tensors that share one storage through in-place calls (chains merged),
        each group in allocation order; groups of one tensor are left out.

        ``uses``: the in-place uses to merge (default :attr:`inplace`, all of them), e.g.
        only those whose two tensors one planner places."""
        parent = {t.uid: t.uid for t in self.tensors}

        def find(u):
            while parent[u] != u:
                parent[u] = parent[parent[u]]
                u = parent[u]
            return u

        for use in (self.inplace if uses is None else uses):
            parent[find(use.out_uid)] = find(use.in_uid)
        groups: Dict[str, List[str]] = {}
        for t in self.tensors:
            groups.setdefault(find(t.uid), []).append(t.uid)
        return [g for g in groups.values() if len(g) > 1]

    @property
    def plannable(self) -> List[TensorLiveness]:
        """The tensors our planner may place."""
        return [t for t in self.tensors if t.plannable]

    @property
    def left_to_tvm(self) -> List[TensorLiveness]:
        """The tensors left to TVM (symbolic, outputs, possibly retained)."""
        return [t for t in self.tensors if not t.plannable]


def _same_bytes(a: TensorLiveness, b: TensorLiveness) -> bool:
    """Equal byte sizes: equal constants, or (a symbolic size) byte-size expressions that
    ``tvm.sym.Analyzer`` proves equal for every value of the dims (never for two sizes that
    only happen to agree at some shapes)."""
    if a.size_bytes is not None and b.size_bytes is not None:
        return a.size_bytes == b.size_bytes
    return bool(tvm.sym.Analyzer().can_prove_equal(a.size_expr, b.size_expr))


def _may_place(t: TensorLiveness) -> bool:
    """A planner may place the tensor: plannable, or held back only by a symbolic size
    (the dynamic planner's tensors)."""
    return t.reason in (None, SYMBOLIC_SHAPE)


class _LivenessAnalyzer(ConcatFacts):
    """Walks one function body in program order; see the module docstring."""

    def __init__(self, mod: tvm.IRModule, table=None, concat_table=None, params=()):
        self._mod = mod
        self._table = table
        self._concat_table = concat_table
        self._params = set(params)
        self._tuple_fields: Dict[relax.Var, list] = {}  # tuple literal var -> whole tensors
        self._written_params: Dict[str, FrozenSet[int]] = {}
        self._concat_sites: List[ConcatSite] = []
        self._item_direct: Dict[relax.Var, int] = {}  # var -> tensor, through tuple items
        self._binding_var = None
        self._direct: Dict[relax.Var, int] = {}  # var -> tensor whose whole storage it is
        self._written: set = set()  # tensors already passed to a call
        self._candidates: List[tuple] = []
        self._step = 0
        self._tensors: List[TensorLiveness] = []
        self._last_use: List[int] = []
        self._alias: Dict[relax.Var, FrozenSet[int]] = {}
        self._branch_depth = 0
        self._name_count: Dict[str, int] = {}

    # ---- helpers -------------------------------------------------------
    def _next_step(self) -> int:
        step = self._step
        self._step += 1
        return step

    def _tensors_of(self, expr) -> FrozenSet[int]:
        """Tensors whose storage ``expr`` may refer to."""
        if isinstance(expr, relax.Var):
            return self._alias.get(expr, frozenset())
        if isinstance(expr, relax.Tuple):
            out: FrozenSet[int] = frozenset()
            for f in expr.fields:
                out |= self._tensors_of(f)
            return out
        if isinstance(expr, relax.TupleGetItem):
            return self._tensors_of(expr.tuple_value)
        return frozenset()

    def _use(self, tensors: FrozenSet[int], step: int) -> None:
        for i in tensors:
            if self._last_use[i] < step:
                self._last_use[i] = step
            if self._tensors[i].first_use is None and step > self._tensors[i].start:
                self._tensors[i].first_use = step

    def _exclude(self, tensors: FrozenSet[int], reason: str) -> None:
        # "symbolic shape" only says the size is not constant; a reason that
        # forbids planning at all (output, retained) takes its place.
        for i in tensors:
            if self._tensors[i].reason in (None, SYMBOLIC_SHAPE):
                self._tensors[i].reason = reason

    def _vars_in(self, expr) -> List[relax.Var]:
        found: List[relax.Var] = []
        relax.analysis.post_order_visit(
            expr, lambda e: found.append(e) if isinstance(e, relax.Var) else None
        )
        return found

    def _is_prim_func(self, op) -> bool:
        if not isinstance(op, tvm.ir.GlobalVar):
            return False
        try:
            return isinstance(self._mod[op], tirx.PrimFunc)
        except (KeyError, tvm.error.InternalError):
            return False

    def _uid(self, name: str) -> str:
        k = self._name_count.get(name, 0)
        self._name_count[name] = k + 1
        return name if k == 0 else f"{name}#{k}"

    # ---- visitors ------------------------------------------------------
    def _new_tensor(self, var: relax.Var, call, step: int) -> int:
        shape_expr, dtype_imm, dev, scope = call.args
        dtype = str(dtype_imm.value)
        dims = list(shape_expr.values) if isinstance(shape_expr, relax.ShapeExpr) else None
        static = dims is not None and all(isinstance(d, tirx.IntImm) for d in dims)
        shape = tuple(int(d) for d in dims) if static else tuple(dims or ())
        size = None
        dt = tvm.runtime.DataType(dtype)
        size_expr = tirx.IntImm("int64", (dt.bits * dt.lanes + 7) // 8)
        for d in dims or ():
            size_expr = size_expr * d.astype("int64")
        if static:
            n = 1
            for d in shape:
                n *= d
            size = dtype_size_bytes(dtype, n)
            size_expr = tirx.IntImm("int64", size)
        idx = len(self._tensors)
        self._tensors.append(
            TensorLiveness(
                var=var,
                name=var.name,
                uid=self._uid(var.name),
                shape=shape,
                dtype=dtype,
                size_bytes=size,
                size_expr=size_expr,
                device_index=int(dev) if isinstance(dev, tirx.IntImm) else -1,
                storage_scope=str(scope.value) if hasattr(scope, "value") else str(scope),
                start=step,
                end=step + 1,
                in_branch=self._branch_depth > 0,
                reason=None if static else SYMBOLIC_SHAPE,
            )
        )
        self._last_use.append(step)
        if not isinstance(dev, tirx.IntImm):
            self._tensors[idx].reason = "symbolic device index"
        return idx

    def visit_seq(self, seq: relax.SeqExpr) -> FrozenSet[int]:
        """Visit a SeqExpr; returns the tensors its result may refer to."""
        for block in seq.blocks:
            for binding in block.bindings:
                self._visit_binding(binding)
        step = self._next_step()
        result = self._tensors_of(seq.body)
        for v in self._vars_in(seq.body):
            self._use(self._alias.get(v, frozenset()), step)
            if v in self._tuple_fields:
                self._escape(self._alias.get(v, frozenset()))
        return result

    def _visit_binding(self, binding) -> None:
        var, value = binding.var, binding.value
        self._binding_var = var
        if isinstance(value, relax.If):
            cond_step = self._next_step()
            for v in self._vars_in(value.cond):
                self._use(self._alias.get(v, frozenset()), cond_step)
            self._branch_depth += 1
            then_t = self.visit_seq(value.true_branch)
            else_t = self.visit_seq(value.false_branch)
            self._branch_depth -= 1
            self._next_step()
            self._alias[var] = then_t | else_t
            return

        step = self._next_step()
        if isinstance(value, tvm.ir.Call) and isinstance(value.op, tvm.ir.Op):
            if value.op.name == _ALLOC_TENSOR:
                idx = self._new_tensor(var, value, step)
                self._alias[var] = frozenset({idx})
                self._direct[var] = idx
                return
        for v in self._vars_in(value):
            self._use(self._alias.get(v, frozenset()), step)
        if self._concat_table is not None:
            self._note_concat_facts(var, value, step, isinstance(binding, relax.MatchCast))

        if isinstance(binding, relax.MatchCast) or isinstance(
            value, (relax.Var, relax.Tuple, relax.TupleGetItem)
        ):
            self._alias[var] = self._tensors_of(value)
            if isinstance(value, relax.Var) and value in self._direct:
                self._direct[var] = self._direct[value]
        elif isinstance(value, tvm.ir.Call):
            self._note_inplace(value, step, var)
            self._note_producer(value)
            self._alias[var] = self._visit_call(value)
            if (isinstance(value.op, tvm.ir.Op) and value.op.name in _WHOLE_VIEW_OPS
                    and isinstance(value.args[0], relax.Var) and value.args[0] in self._direct):
                self._direct[var] = self._direct[value.args[0]]
        else:
            self._alias[var] = frozenset()

    def _note_inplace(self, call, step: int, var) -> None:
        """Record the table's pairs this call may use; :meth:`finish` keeps those whose input
        dies here."""
        op = call.op
        pairs = self._table.get(op.name_hint, ()) if (
            self._table is not None and self._is_prim_func(op)) else ()
        arg_sets = [self._tensors_of(a) for a in call.args]
        for pair in pairs:
            if max(pair.out_index, pair.in_index) >= len(call.args):
                continue
            out_arg, in_arg = call.args[pair.out_index], call.args[pair.in_index]
            o, x = self._direct.get(out_arg), self._direct.get(in_arg)
            if o is None or x is None or o == x or o in self._written:
                continue
            others = [s for k, s in enumerate(arg_sets) if k not in (pair.out_index, pair.in_index)]
            if any(x in s or o in s for s in others):
                continue
            to, tx = self._tensors[o], self._tensors[x]
            if (not _same_bytes(to, tx) or to.dtype != tx.dtype
                    or (to.device_index, to.storage_scope) != (tx.device_index, tx.storage_scope)):
                continue
            self._candidates.append((step, call, var, pair, x, o))
        for s in arg_sets:
            self._written |= s

    def _accept_inplace(self) -> List[InplaceUse]:
        used_in, used_out, uses = set(), set(), []
        for step, call, var, pair, x, o in self._candidates:
            tx, to = self._tensors[x], self._tensors[o]
            if x in used_in or o in used_out or self._last_use[x] != step:
                continue
            if not (_may_place(tx) and _may_place(to)):
                continue
            used_in.add(x)
            used_out.add(o)
            uses.append(InplaceUse(step, call.op.name_hint, pair.out_index, pair.in_index,
                                   tx.uid, to.uid, call, var))
        return uses

    def _note_producer(self, call) -> None:
        """A kernel call is the producer of each argument tensor not yet written."""
        op = call.op
        if self._is_prim_func(op):
            kernel = op.name_hint
        elif isinstance(op, relax.ExternFunc):
            kernel = str(op.global_symbol)
        else:
            return
        for a in call.args:
            for i in self._tensors_of(a):
                if self._tensors[i].producer is None:
                    self._tensors[i].producer = kernel

    def _visit_call(self, call) -> FrozenSet[int]:
        op = call.op
        arg_tensors: FrozenSet[int] = frozenset()
        for a in call.args:
            arg_tensors |= self._tensors_of(a)
        if isinstance(op, tvm.ir.Op) and op.name in _VIEW_OPS:
            return self._tensors_of(call.args[0])
        if self._is_prim_func(op):
            return frozenset()  # destination-passing style: writes into its arguments
        if isinstance(op, relax.ExternFunc):
            return arg_tensors  # may return a view of an argument
        name = op.name if isinstance(op, tvm.ir.Op) else str(op)
        self._exclude(arg_tensors, f"passed to {name}, which may retain it")
        return arg_tensors

    def finish(self, name: str, result: FrozenSet[int]) -> FunctionLiveness:
        self._exclude(result, "function output")
        for t, last in zip(self._tensors, self._last_use):
            t.end = max(last, t.start) + 1
        for var, tensors in self._alias.items():
            for i in tensors:
                if var is not self._tensors[i].var and var.name not in self._tensors[i].aliases:
                    self._tensors[i].aliases.append(var.name)
        return FunctionLiveness(name=name, tensors=self._tensors, num_steps=self._step,
                                inplace=self._accept_inplace(),
                                concat_sites=list(self._concat_sites))


def analyze_liveness(mod: tvm.IRModule, func_name: str, inplace_table=None,
                     concat_table=None) -> FunctionLiveness:
    """Live ranges of the tensors allocated by one Relax function.

    Parameters
    ----------
    mod : tvm.IRModule
        Module after ``CallTIRRewrite`` (tensors as ``R.builtin.alloc_tensor``).
    func_name : str
        Name of a Relax function in ``mod``.
    inplace_table : dict of str to list of InplacePair, optional
        :func:`relax_memplan.analysis.inplace.kernel_table` of ``mod``: with it, the
        in-place calls allowed (module docstring) are listed in
        :attr:`FunctionLiveness.inplace`; without it, none.
    concat_table : dict of str to int, optional
        :func:`relax_memplan.analysis.concat.concat_table` of ``mod``: with it, the calls of
        concatenation kernels are listed in :attr:`FunctionLiveness.concat_sites` and the
        facts the concat-in-place planner needs are filled (module docstring).

    Returns
    -------
    FunctionLiveness
        Every allocation with its half-open live range in program steps, its
        size in bytes (``None`` if symbolic), its aliases, and why it is left to
        TVM if it is.

    Raises
    ------
    ValueError
        If ``func_name`` is not a Relax function of ``mod``.
    """
    func = mod[func_name] if func_name in [gv.name_hint for gv in mod.get_global_vars()] else None
    if not isinstance(func, relax.Function):
        raise ValueError(f"'{func_name}' is not a Relax function of the module")
    analyzer = _LivenessAnalyzer(mod, inplace_table, concat_table, func.params)
    body = func.body
    if not isinstance(body, relax.SeqExpr):
        return FunctionLiveness(name=func_name, tensors=[], num_steps=0)
    result = analyzer.visit_seq(body)
    return analyzer.finish(func_name, result)
