"""ShareTransposedWeights: a matmul by the transpose of a weight that the model also reads as
it is reads that one weight, so the library stores it once.

Where it runs: on the high-level Relax graph before any constant folding (our pipeline runs it
last in the ``library_dispatch`` phase, CPU targets). Reads no attributes.

What it matches, in each Relax function, where ``W`` is a 2-d constant (``N x K``)::

    y = R.matmul(x, Wt)                      # Wt a constant equal to W transposed, or
    y = R.matmul(x, R.permute_dims(W))       # W read by another binding as well

``y`` becomes one kernel ``matmul_nt(x, W)``, ``y[..., i, j] = sum_k x[..., i, k] * W[j, k]``,
and the transposed copy goes. The first form is what TVM's ONNX frontend and our
``fold_constants`` step make of ``Transpose(W)`` on an initializer; the second is a ``Gemm``
with ``transB``.

Why: a language model's output projection is the token embedding transposed (GPT-2's ``wte``,
tied; 50,257 x 768 float32, 154 MB): the embedding's ``Gather`` reads ``W``, the projection
reads ``W`` transposed, and folding the transpose stores a second copy in the library and in
memory (GPT-2's library: 649 MB for a 498 MB model). The matmul does the same multiply-adds
reading ``W`` by rows. A weight that is only transposed is left to folding (one copy either
way, and the folded layout is the one TVM's kernels read contiguously). Under our CPU schedules
a weight whose kernel prepacks it (:mod:`relax_memplan.schedules.prepack`) is still two
tensors, the raw one and the packed one.
"""

from __future__ import annotations

from collections import Counter
from typing import Dict, Optional

import numpy as np
import tvm
from tvm import relax, te
from tvm.relax.expr_functor import PyExprMutator, mutator

from ._module_util import CountingRewritePass

__all__ = ["ShareTransposedWeights"]


def _is_op(expr, name: str) -> bool:
    return isinstance(expr, relax.Call) and isinstance(expr.op, tvm.ir.Op) and expr.op.name == name


def _array(const) -> Optional[np.ndarray]:
    """A 2-d float constant's values (a view through DLPack), else None."""
    value = const.value
    if not isinstance(value, tvm.runtime.Tensor) or len(value.shape) != 2 or \
            not str(value.dtype).startswith("float") or value.device.dlpack_device_type() != 1:
        return None
    return np.from_dlpack(value)


def _matmul_nt(x: te.Tensor, w: te.Tensor) -> te.Tensor:
    """``out[..., j] = sum_k x[..., k] * w[j, k]`` (``x @ w.T`` for a 2-d ``w``)."""
    k = te.reduce_axis((0, w.shape[1]), name="k")
    return te.compute([*x.shape[:-1], w.shape[0]],
                      lambda *i: te.sum(x[(*i[:-1], k)] * w[i[-1], k], axis=k), name="matmul_nt")


class _Uses:
    """Per function: how often each constant is an argument, and the constants by identity."""

    def __init__(self, func: relax.Function):
        self.count: Counter = Counter()
        self.constants: Dict[int, relax.Expr] = {}

        def visit(expr):
            if isinstance(expr, relax.Call):
                for arg in expr.args:
                    if isinstance(arg, tvm.ir.GenericConst):
                        self.count[hash(arg)] += 1
                        self.constants[hash(arg)] = arg

        relax.analysis.post_order_visit(func, visit)

    def raw_of(self, transposed) -> Optional[relax.Expr]:
        """Another constant of this function whose values are ``transposed``'s transposed."""
        t = _array(transposed)
        if t is None:
            return None
        for key, const in self.constants.items():
            if key == hash(transposed):
                continue
            w = _array(const)
            if w is not None and w.dtype == t.dtype and w.shape == t.shape[::-1] and \
                    np.array_equal(w[:1, :8], t[:8, :1].T) and np.array_equal(w, t.T):
                return const
        return None


@mutator
class _Rewriter(PyExprMutator):
    def __init__(self, mod):
        super().__init__(mod)
        self.shared = 0
        self.uses: Optional[_Uses] = None

    def visit_function_(self, func):
        self.uses = _Uses(func)
        return super().visit_function_(func)

    def _raw_weight(self, b) -> Optional[relax.Expr]:
        if isinstance(b, tvm.ir.GenericConst):
            return self.uses.raw_of(b)
        value = self.lookup_binding(b) if isinstance(b, relax.Var) else None
        if not _is_op(value, "relax.permute_dims"):
            return None
        w = value.args[0]
        axes = value.attrs.axes
        if not isinstance(w, tvm.ir.GenericConst) or _array(w) is None or \
                (axes is not None and [int(a) for a in axes] != [1, 0]):
            return None
        return w if self.uses.count[hash(w)] > 1 else None

    def visit_call_(self, call):
        call = super().visit_call_(call)
        if not _is_op(call, "relax.matmul") or \
                str(call.attrs.out_dtype) not in ("", "void", "None"):
            return call
        x, b = call.args
        w = self._raw_weight(b)
        if w is None or getattr(x.ty, "dtype", None) != str(w.value.dtype) or \
                getattr(x.ty, "ndim", -1) < 1:
            return call
        self.shared += 1
        return self.builder_.call_te(_matmul_nt, x, w, primfunc_name_hint="matmul_nt")


@tvm.transform.module_pass(opt_level=0, name="ShareTransposedWeights")
class ShareTransposedWeights(CountingRewritePass):
    """Make each matmul by a weight's transpose read the weight itself when the model also
    reads the weight untransposed (module docstring). No parameters; raises nothing; a module
    without such matmuls is returned unchanged.

    Attributes
    ----------
    shared : int
        Matmuls rewritten by the last run.
    """

    count_attr = "shared"

    def rewrite(self, mod: tvm.IRModule):
        """One mutator over every Relax function (its builder's module holds the new
        PrimFuncs), unused bindings removed where it changed something."""
        rewriter = _Rewriter(mod)
        updates = {}
        for gv, func in mod.functions_items():
            if not isinstance(func, relax.Function):
                continue
            before = rewriter.shared
            new_func = rewriter.visit_expr(func)
            if rewriter.shared != before:
                updates[gv] = relax.analysis.remove_all_unused(new_func)
        if not updates:
            return mod, 0
        out = rewriter.builder_.get()
        for gv, func in updates.items():
            out[gv] = func
        return out, rewriter.shared
