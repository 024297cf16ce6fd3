"""FoldMatmulReshape: a matmul on a flattened 2-d view, reshaped back, becomes the N-d matmul.

Where it runs: on the high-level Relax graph, before ``LegalizeOps`` (our pipeline runs it first
among the fusion passes with ``fusion=True``). Reads no attributes.

What it matches (the form exporters give a linear layer, e.g. gpt2-tiny's)::

    x2 = R.reshape(x, (N, K))            # x: (d0, ..., dn, K), N = d0 * ... * dn
    y2 = R.matmul(x2, w)                 # w: (K, M), 2-d
    y  = R.reshape(y2, (d0, ..., dn, M))

``y`` becomes ``R.matmul(x, w)``; the two reshapes go when nothing else reads them.

Why: TVM's FuseOps fuses a matmul with the elementwise ops that follow it (bias, activation,
residual add: the epilogue) but not through a reshape, so after such a sandwich the bias + GELU
of gpt2-tiny's MLP is a kernel of its own that reads and writes the (seq, 4 * hidden)
intermediate once more. On the matmul itself nothing changes (same multiply-adds). Memory: the
reshapes are views, so the tensors are the same; the peak live bytes cannot rise.
"""

from __future__ import annotations

import tvm
from tvm import relax
from tvm.relax.expr_functor import PyExprMutator, mutator

from ._module_util import CountingRewritePass

__all__ = ["FoldMatmulReshape"]


@tvm.transform.module_pass(opt_level=0, name="FoldMatmulReshape")
class FoldMatmulReshape(CountingRewritePass):
    """Replace ``reshape(matmul(reshape(x, (N, K)), w), x.shape[:-1] + (M,))`` by
    ``matmul(x, w)`` (module docstring). No parameters; raises nothing.

    Attributes
    ----------
    folded : int
        Matmuls rewritten by the last run.
    """

    count_attr = "folded"
    pattern = ("matmul_reshape", "folded")
    make_rewriter = staticmethod(lambda mod: _Rewriter(mod))  # the mutator, defined below


def _is_op(expr, name: str) -> bool:
    return isinstance(expr, relax.Call) and isinstance(expr.op, tvm.ir.Op) and expr.op.name == name


def _shape(expr):
    ty = expr.ty
    if not isinstance(ty, relax.TensorType) or ty.shape is None:
        return None
    return list(ty.shape.values)


@mutator
class _Rewriter(PyExprMutator):
    def __init__(self, mod):
        super().__init__(mod)
        self.folded = 0

    def _bound(self, var, op):
        if not isinstance(var, relax.Var):
            return None
        value = self.lookup_binding(var)
        return value if _is_op(value, op) else None

    def visit_call_(self, call):
        call = super().visit_call_(call)
        if not _is_op(call, "relax.reshape"):
            return call
        mm = self._bound(call.args[0], "relax.matmul")
        if mm is None or str(mm.attrs.out_dtype) not in ("", "void", "None"):
            return call
        flat = self._bound(mm.args[0], "relax.reshape")
        w_shape, out_shape = _shape(mm.args[1]), _shape(call)
        if flat is None or w_shape is None or len(w_shape) != 2 or out_shape is None:
            return call
        x = flat.args[0]
        x_shape = _shape(x)
        if x_shape is None or len(x_shape) < 3 or len(out_shape) != len(x_shape):
            return call
        analyzer = tvm.sym.Analyzer()
        same = lambda a, b: analyzer.can_prove_equal(a, b)  # noqa: E731
        if not (same(x_shape[-1], w_shape[0]) and same(out_shape[-1], w_shape[1])
                and all(same(a, b) for a, b in zip(x_shape[:-1], out_shape[:-1]))):
            return call
        self.folded += 1
        return relax.op.matmul(x, mm.args[1])
