"""FastSigmoidTanh: float32 ``sigmoid`` and ``tanh`` become kernels LLVM can vectorise.

Why: TVM's llvm backend lowers ``T.sigmoid`` and ``T.tanh`` to libm ``expf`` calls, one (two
for ``tanh``) per element even inside a vectorised loop. In our scheduled CPU build
yolov8n's 3x3 convolutions with a SiLU epilogue (``x * sigmoid(x)``) and magika's tanh-GELU
spent most of their epilogue time in ``expf``. The replacement kernels compute the same
functions with a range-reduced polynomial
(:mod:`relax_memplan.kernels.fast_math`, about 1e-7 relative error, NaN preserved), made of
vectorisable multiply-adds.

Where it runs: on the high-level Relax graph, before ``LegalizeOps`` (our ``legalize`` phase,
llvm targets with ``schedule=True`` only), after the pattern fusion passes (which match
``relax.tanh`` in GELU). Each ``R.sigmoid(x)`` / ``R.tanh(x)`` on a float32 tensor becomes an
``R.call_tir`` of a one-block element-wise PrimFunc named ``tir_sigmoid`` / ``tir_tanh``, the
names TVM's own legalization gives these kernels, so that fused kernels keep TVM's names
(``fused_conv2d_add_tir_sigmoid_multiply``) and per-kernel comparisons with TVM's build still
match. ``AnnotateTIROpPattern`` marks it element-wise and ``FuseOps`` fuses it like TVM's.
Other dtypes, and calls inside ``Composite`` functions (offloaded patterns), are left alone.
Reads no function attributes.
"""

from __future__ import annotations

import tvm
from tvm import relax, te
from tvm.relax.expr_functor import PyExprMutator, mutator

from ..kernels.fast_math import sigmoid_f32, tanh_f32

__all__ = ["FastSigmoidTanh"]

_KERNELS = {"relax.sigmoid": ("tir_sigmoid", sigmoid_f32),
            "relax.tanh": ("tir_tanh", tanh_f32)}


@tvm.transform.module_pass(opt_level=0, name="FastSigmoidTanh")
class FastSigmoidTanh:
    """Replace float32 ``sigmoid``/``tanh`` calls by vectorisable kernels (see the module
    docstring). Raises nothing; a module without such calls is returned unchanged.

    Attributes
    ----------
    replaced : int
        Calls rewritten by the last run.
    """

    def __init__(self):
        self.replaced = 0

    def transform_module(self, mod: tvm.IRModule, _ctx) -> tvm.IRModule:
        rewriter = _Rewriter(mod)
        updates = {}
        for gv, func in mod.functions_items():
            if not isinstance(func, relax.Function) or (
                    func.attrs is not None and "Composite" in func.attrs):
                continue
            before = rewriter.replaced
            new_func = rewriter.visit_expr(func)
            if rewriter.replaced != before:
                updates[gv] = new_func
        self.replaced = rewriter.replaced
        if not updates:
            return mod
        out = rewriter.builder_.get()  # the module with the new PrimFuncs
        for gv, func in updates.items():
            out[gv] = func
        return out


def _float32_tensor(expr) -> bool:
    ty = expr.ty
    return isinstance(ty, relax.TensorType) and str(ty.dtype) == "float32" \
        and ty.shape is not None


@mutator
class _Rewriter(PyExprMutator):
    def __init__(self, mod):
        super().__init__(mod)
        self.replaced = 0

    def visit_call_(self, op):
        call = super().visit_call_(op)
        if not (isinstance(call.op, tvm.ir.Op) and call.op.name in _KERNELS):
            return call
        (arg,) = call.args
        if not (_float32_tensor(arg) and _float32_tensor(call)):
            return call
        name, scalar = _KERNELS[call.op.name]

        def _compute(x):
            return te.compute(x.shape, lambda *i: scalar(x(*i)), name=name[4:])

        self.replaced += 1
        return self.builder_.call_te(_compute, arg, primfunc_name_hint=name)
