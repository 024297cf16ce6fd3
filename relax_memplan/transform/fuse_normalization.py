"""FuseNormalization: layer norms and RMS norms written as element-wise steps, as one norm op.

Where it runs: on the high-level Relax graph, before ``LegalizeOps`` and before
:class:`~relax_memplan.transform.fuse_add_layer_norm.FuseAddLayerNorm` (our pipeline runs it
in the ``legalize`` phase with ``fusion=True``, after ``RemoveDropout``), so that a residual
add before a norm found here is fused with it there, exactly as before an ``R.nn.layer_norm``
imported from ``LayerNormalization``. Reads ``main``'s ``relax_memplan.onnx_nodes`` (to name
the ONNX nodes of a refused candidate); writes no attribute.

What it matches, by structure (:mod:`~relax_memplan.transform._norm_match`):

* the layer norm of ONNX opsets below 17 (TorchScript exporter, tf2onnx)::

      m = mean(x, -1); d = x - m; v = mean(d ** 2 or d * d, -1)
      y = d / sqrt(v + eps)  or  d * rsqrt(v + eps)  or  d * (1 / sqrt(v + eps))
      [y = y * gamma] [y = y + beta]

  becomes ``R.nn.layer_norm(x, gamma, beta, axes=[-1], epsilon=eps)`` (ones and zeros where
  gamma or beta are absent);
* the RMS norm of Llama and T5 (``x * rsqrt(mean(x ** 2) + eps) * w``, also
  ``x / sqrt(mean(x * x) + eps)``, with casts to the same dtype around it) becomes
  ``R.nn.rms_norm(x, w, axes=[-1], epsilon=eps)``.

``x`` is any tensor of shape ``(..., hidden)`` (float32 or float16); the norm op replaces the
chain's last binding and the other bindings of the chain, read nowhere else, disappear. Each
op legalizes to one kernel where the steps took five to nine (FuseOps fuses element-wise
steps into a reduction's consumer but not two reductions into one kernel).

Each candidate (a ``mean`` of a square) is fused or refused with its reason in
:attr:`FuseNormalization.records` (``layer_norm`` and ``rms_norm``,
:mod:`~relax_memplan.transform.fusion_record`); a refused one is left exactly as it was.
Memory: the rewrite only removes tensors (the centred values, the squares), so the peak live
bytes cannot rise.
"""

from __future__ import annotations

from typing import Dict

import tvm
from tvm import relax
from tvm.relax.expr_functor import PyExprMutator, mutator

from ._module_util import replace_functions
from ._norm_match import REASONS, FunctionGraph, NormMatch, NormRefusal, candidates, find_norm
from .fusion_record import PatternRecord

__all__ = ["FuseNormalization", "KINDS"]

#: The patterns of the pass, as named in its records and the report.
KINDS = ("layer_norm", "rms_norm")


@tvm.transform.module_pass(opt_level=0, name="FuseNormalization")
class FuseNormalization:
    """Rewrite each layer norm or RMS norm found by structure into its norm op (module
    docstring).

    Attributes
    ----------
    fused : dict of str to int
        Norms rewritten by the last run, per kind (``layer_norm``, ``rms_norm``).
    records : list of PatternRecord
        ``[layer_norm, rms_norm]``: candidates, fused, and each refusal with its reason
        (:data:`~relax_memplan.transform._norm_match.REASONS`) and bindings.
    """

    def __init__(self):
        self.fused: Dict[str, int] = {k: 0 for k in KINDS}
        self.records = [PatternRecord(k) for k in KINDS]

    def transform_module(self, mod: tvm.IRModule, _ctx) -> tvm.IRModule:
        records = {k: PatternRecord(k) for k in KINDS}
        self.records = list(records.values())
        updates = {}
        rewriter = None
        for gv, func in mod.functions_items():
            if not isinstance(func, relax.Function) or not isinstance(func.body, relax.SeqExpr):
                continue
            graph = FunctionGraph(func)
            plans = {}
            for var in candidates(graph):
                got = find_norm(graph, var)
                if isinstance(got, NormRefusal):
                    records[got.kind].refuse(REASONS[got.code], got.bindings, func, gv.name_hint)
                    continue
                plans[got.anchor] = got
                records[got.kind].accept()
            if not plans:
                continue
            rewriter = rewriter or _Rewriter(mod)
            rewriter.plans = plans
            updates[gv] = relax.analysis.remove_all_unused(rewriter.visit_expr(func))
        self.fused = {k: r.fused for k, r in records.items()}
        if not updates:
            return mod
        return replace_functions(rewriter.builder_.get(), updates)


@mutator
class _Rewriter(PyExprMutator):
    """Replaces the binding of each anchor var by its norm op."""

    def __init__(self, mod):
        super().__init__(mod)
        self.plans: Dict[relax.Var, NormMatch] = {}

    def _param(self, p, hidden, dtype, fill):
        """``p`` as a ``(hidden,)`` tensor; ones or zeros (``fill``) where absent."""
        if p is None:
            make = relax.op.ones if fill == 1 else relax.op.zeros
            return self.builder_.emit(make(relax.ShapeExpr([hidden]), dtype))
        p = self.visit_expr(p)
        if p.ty.ndim != 1:
            p = self.builder_.emit(relax.op.reshape(p, relax.ShapeExpr([hidden])))
        return p

    def visit_var_binding_(self, binding):
        plan = self.plans.get(binding.var)
        if plan is None:
            return super().visit_var_binding_(binding)
        x = self.visit_expr(plan.x)
        hidden, dtype = x.ty.shape.values[-1], x.ty.dtype
        gamma = self._param(plan.gamma, hidden, dtype, 1)
        if plan.kind == "layer_norm":
            beta = self._param(plan.beta, hidden, dtype, 0)
            call = relax.op.nn.layer_norm(x, gamma, beta, axes=[-1], epsilon=plan.eps)
        else:
            call = relax.op.nn.rms_norm(x, gamma, axes=[-1], epsilon=plan.eps)
        return super().visit_var_binding_(relax.VarBinding(binding.var, call))
