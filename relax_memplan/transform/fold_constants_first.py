"""FoldConstantsFirst: TVM's ``FoldConstant`` on the high-level graph, before our fusion passes.

Where it runs: first in the ``legalize`` phase with ``fusion=True``, after ``ClampEmptySlices``
and before :func:`~relax_memplan.pipeline.fusion_passes`. Reads and writes no function
attribute.

Why: the fusion passes check each rewrite against the peak live bytes after TVM's fusion
and lowering (:mod:`~relax_memplan.analysis.lowered_peak`), one lowering per trial, and each
lowering runs ``FoldConstant`` after ``LegalizeOps``: a constant subgraph the importer left
(gpt2-tiny's position ids and causal mask, 42 bindings) was compiled with LLVM and evaluated
again in every trial, 1.9 CPU s each (9.3 of gpt2-tiny's 12.4 CPU s of compilation). Folded
once here, every later ``FoldConstant`` (the trials' and TVM's own after ``LegalizeOps``) finds
nothing left to evaluate.

When it applies: only when a Relax function holds a call whose arguments are all constants
(nothing to fold otherwise: TVM's graph-level ``FoldConstant`` legalizes every operator of a
dataflow block to look, which costs a CNN without such a call ~0.1-0.4 CPU s for nothing).
TVM 0.27's graph-level ``FoldConstant`` can leave a binding that calls a PrimFunc it did not
add to the module (the shape function of a ``dynamic_strided_slice`` whose bounds are run-time
tensors: "There is no definition of I.GlobalVar("shape_func")"); a result that is not
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
        arguments, nothing was run.
    """

    def __init__(self):
        self.kept: Optional[bool] = None

    def transform_module(self, mod: tvm.IRModule, _ctx) -> tvm.IRModule:
        self.kept = None
        if not any(isinstance(f, relax.Function) and _has_constant_call(f)
                   for _gv, f in mod.functions_items()):
            return mod
        folded = relax.transform.FoldConstant()(mod)
        try:  # 0.27 raises on what it finds (returns None otherwise); older TVMs return False
            self.kept = relax.analysis.well_formed(folded) is not False
        except ValueError:
            self.kept = False
        return folded if self.kept else mod


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
