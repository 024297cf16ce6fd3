"""FoldConstantsFirst: TVM's ``FoldConstant`` on the high-level graph, before our fusion passes.

Where it runs: first in the ``legalize`` phase with ``fusion=True``, after ``ClampEmptySlices``
and before :func:`~relax_memplan.pipeline.fusion_passes`. Reads and writes no function
attribute.

Why: the fusion passes check each rewrite against the peak live bytes after TVM's fusion
and lowering (:mod:`~relax_memplan.analysis.lowered_peak`), one lowering per rewrite, and each
lowering runs ``FoldConstant`` after ``LegalizeOps``: a constant subgraph the importer left
(gpt2-tiny's position ids and causal mask, 42 bindings) was compiled with LLVM and evaluated
again for every rewrite tried, 1.9 CPU s each (9.3 of gpt2-tiny's 12.4 CPU s of compilation).
Folded once here, every later ``FoldConstant`` (the checks' and TVM's own after
``LegalizeOps``) finds nothing left to evaluate.

When it applies: only when a Relax function holds a call whose arguments are all constants
(nothing to fold otherwise).

How: TVM's graph-level ``FoldConstant`` legalizes every operator call of a dataflow block to
look for a foldable one (magika: 93 legalizations for 3 folds, two thirds of the pass's
time). It is given instead, per Relax function, a probe function holding only the bindings
computable from constants (in dataflow blocks, where TVM folds: constants, operator and
``call_tir`` calls on them, ``R.shape_of`` of a tensor of static shape), returning each
bound var; the vars it folded to a constant or shape are replaced by it in the function and
the bindings left unused removed, as TVM's pass does. Tested to give TVM's whole-module
result (structurally equal on bert-tiny; the lowered modules of all eleven shared models are
identical with this probe and with TVM's whole-module pass).

TVM 0.27's graph-level ``FoldConstant`` can leave a binding that calls a PrimFunc it did not
add to the module (the shape function of a ``dynamic_strided_slice`` whose bounds are run-time
tensors: "There is no definition of I.GlobalVar("shape_func")"); a folded probe that is not
well-formed (``relax.analysis.well_formed``) is dropped and the module goes on unfolded, as
with TVM's pipeline (:attr:`FoldConstantsFirst.kept` says which happened).
"""

from __future__ import annotations

from typing import Optional

import tvm
from tvm import relax

__all__ = ["FoldConstantsFirst"]


@tvm.transform.module_pass(opt_level=0, name="FoldConstantsFirst")
class FoldConstantsFirst:
    """Fold constant subgraphs of the high-level graph once (module docstring). No
    parameters; raises nothing (an ill-formed fold is dropped, never returned).

    Attributes
    ----------
    kept : bool or None
        ``True``: the last run returned the folded module; ``False``: the fold was not
        well-formed and the input was returned; ``None``: no call with all-constant
        arguments in a dataflow block, nothing was run.
    """

    def __init__(self):
        self.kept: Optional[bool] = None

    def transform_module(self, mod: tvm.IRModule, _ctx) -> tvm.IRModule:
        self.kept = None
        slices = {gv: _constant_slice(f) for gv, f in mod.functions_items()
                  if isinstance(f, relax.Function) and _has_constant_call(f)}
        slices = {gv: bindings for gv, bindings in slices.items() if bindings}
        if not slices:
            return mod
        # TVM's FoldConstant legalizes every operator call it meets to look for constants
        # (magika: 93 legalizations for 3 folds, two thirds of its time): it is given the
        # constant bindings alone, one probe function per Relax function
        probes = {gv: _probe(bindings) for gv, bindings in slices.items()}
        folded = relax.transform.FoldConstant()(tvm.IRModule(
            {**{gv: f for gv, f in mod.functions_items() if not isinstance(f, relax.Function)},
             **{tvm.ir.GlobalVar(gv.name_hint + _PROBE): probe for gv, probe in probes.items()}},
            attrs=mod.attrs))
        try:  # 0.27 raises on what it finds (returns None otherwise); older TVMs return False
            self.kept = relax.analysis.well_formed(folded) is not False
        except ValueError:
            self.kept = False
        if not self.kept:
            return mod
        out = dict(mod.functions_items())
        for gv, bindings in slices.items():
            fields = _probe_outputs(folded[gv.name_hint + _PROBE])
            # vars bound to a call that folded; a var bound to a constant stays, as with
            # TVM's FoldConstant on the whole function
            values = {b.var: value for b, value in zip(bindings, fields)
                      if not isinstance(b.value, tvm.ir.GenericConst)
                      and isinstance(value, (tvm.ir.GenericConst, relax.ShapeExpr))}
            if values:
                out[gv] = relax.analysis.remove_all_unused(_Substitute(values).visit_expr(mod[gv]))
        return tvm.IRModule(out, attrs=mod.attrs, global_infos=mod.global_infos)


_PROBE = "__fold_constants_first_probe"
"""Name suffix of the probe functions given to TVM's FoldConstant (never returned)."""


def _known_constant(arg, known) -> bool:
    if isinstance(arg, relax.Tuple):
        return all(_known_constant(a, known) for a in arg.fields)
    if isinstance(arg, relax.Var):
        return arg in known
    # a GlobalVar: the PrimFunc of a call_tir
    return isinstance(arg, (tvm.ir.GenericConst, relax.ShapeExpr, tvm.tirx.IntImm,
                            tvm.tirx.FloatImm, tvm.ir.GlobalVar))


def _constant_slice(func: relax.Function) -> list:
    """The bindings of ``func`` computable from constants alone, in order: a var bound to a
    constant, to the shape of a tensor of static shape (as that shape, as FoldConstant folds
    it), or to an operator call whose arguments are constants or such vars; empty when no
    call is among them. Only dataflow blocks are read."""
    known, found = set(), []
    for block in func.body.blocks:
        if not isinstance(block, relax.DataflowBlock):
            continue  # TVM's FoldConstant folds inside dataflow blocks only
        for binding in block.bindings:
            if not isinstance(binding, relax.VarBinding):
                continue
            value = binding.value
            shape = _static_shape_of(value)
            if shape is not None:
                known.add(binding.var)
                found.append(relax.VarBinding(binding.var, shape))
            elif isinstance(value, tvm.ir.GenericConst) or (
                    isinstance(value, relax.Call) and isinstance(value.op, tvm.ir.Op)
                    and value.args and all(_known_constant(a, known) for a in value.args)):
                known.add(binding.var)
                found.append(binding)
    return found if any(isinstance(b.value, relax.Call) for b in found) else []


def _static_shape_of(value) -> Optional[relax.ShapeExpr]:
    """The shape ``R.shape_of(x)`` returns when ``x``'s type has a static shape, else None."""
    if not (isinstance(value, relax.Call) and isinstance(value.op, tvm.ir.Op)
            and value.op.name == "relax.shape_of"):
        return None
    shape = getattr(value.args[0].ty, "shape", None)
    if isinstance(shape, relax.ShapeExpr) and all(isinstance(d, tvm.tirx.IntImm)
                                                  for d in shape.values):
        return relax.ShapeExpr(list(shape.values))
    return None


def _probe(bindings) -> relax.Function:
    """A function of no parameters: ``bindings`` in one dataflow block, every bound var
    returned in a tuple."""
    outs = [relax.Var(f"out{k}", b.var.ty) for k, b in enumerate(bindings)]
    block = relax.DataflowBlock(list(bindings) + [relax.VarBinding(o, b.var)
                                                  for o, b in zip(outs, bindings)])
    return relax.Function([], relax.SeqExpr([block], relax.Tuple(outs)),
                          ret_ty=relax.TupleType([o.ty for o in outs]), is_pure=True)


def _probe_outputs(func: relax.Function) -> list:
    """What each field of a folded probe's tuple is, vars followed to what they are bound."""
    bound = {b.var: b.value for block in func.body.blocks for b in block.bindings
             if isinstance(b, relax.VarBinding)}
    body = func.body.body
    while isinstance(body, relax.Var) and body in bound:
        body = bound[body]
    out = []
    for field in body.fields:
        while isinstance(field, relax.Var) and field in bound:
            field = bound[field]
        out.append(field)
    return out


@relax.expr_functor.mutator
class _Substitute(relax.PyExprMutator):
    """Each var of ``values`` replaced by its folded constant at every use."""

    def __init__(self, values):
        super().__init__()
        self.values = values

    def visit_var_(self, op):
        return self.values.get(op, op)

    def visit_dataflow_var_(self, op):
        return self.values.get(op, op)


def _has_constant_call(func: relax.Function) -> bool:
    """A call to an operator whose arguments are all constants (something to fold)."""
    found = []

    def constant(arg) -> bool:
        if isinstance(arg, relax.Tuple):
            return all(constant(a) for a in arg.fields)
        return isinstance(arg, (tvm.ir.GenericConst, relax.ShapeExpr, tvm.tirx.IntImm,
                                tvm.tirx.FloatImm))

    def visit(expr):
        if (not found and isinstance(expr, relax.Call) and isinstance(expr.op, tvm.ir.Op)
                and expr.args and all(constant(a) for a in expr.args)):
            found.append(expr)

    relax.analysis.post_order_visit(func, visit)
    return bool(found)
