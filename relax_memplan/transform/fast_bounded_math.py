"""FastBoundedMath: ``tanh``, ``sigmoid``, ``erf`` and ``softmax`` as TVM's vectorizable approximations.

Where it runs: on the high-level Relax graph, right before ``LegalizeOps``, after our fusion
passes (which match ``relax.nn.softmax``, ``relax.erf``, ``relax.tanh``). Our pipeline runs it
for llvm targets with ``schedule=True``. Reads and writes no function attribute; functions
carrying a ``Composite`` attribute (patterns kept for offloading) are left alone.

What it does, on float32 tensors (other dtypes are left to TVM's legalization), with TVM's
``topi`` approximations (the kernels of its ``relax.transform.FastMathTransform``):

* ``relax.tanh(x)`` -> ``topi.fast_tanh(x)`` (a rational function, input clamped to [-9, 9]),
  in a kernel named ``fast_tanh``;
* ``relax.sigmoid(x)`` -> ``0.5 + 0.5 * topi.fast_tanh(x / 2)`` (the identity
  ``sigmoid(x) = (1 + tanh(x / 2)) / 2``), in a kernel named ``tir_sigmoid``, the name TVM's
  own legalization gives it, so that fused kernels keep TVM's names
  (``fused_conv2d_add_tir_sigmoid_multiply``) and per-kernel comparisons with TVM's build match;
* ``relax.erf(x)`` -> ``topi.fast_erf(x)``;
* ``relax.nn.softmax(x)`` -> ``topi.nn.fast_softmax`` (``fast_exp`` of ``x - max``, so its
  argument is <= 0).

``tanh`` and ``sigmoid`` give NaN for NaN (``fast_tanh``'s clamp to [-9, 9] is lowered as
selects that pass NaN through; asserted in the tests) and their limits for +-inf. A plain ``relax.exp`` is left alone:
``topi.fast_exp`` clamps its input to [-88.4, 88.4], so ``exp(100)`` would be 2.4e38 instead
of ``inf``; every function rewritten here is bounded, so the clamps cannot show.

Why: the legalized ``tanh`` / ``sigmoid`` / ``erf`` / ``exp`` call LLVM's ``llvm.exp``/libm per
element; a vectorized loop of them becomes one scalar libm call per lane (GPT-2's and magika's
tanh GELU, BERT's erf GELU in the matmul epilogue, yolov8n's SiLU in its convolutions' write-
back). The approximations are polynomials / rational functions that vectorize; their error is
at float32 rounding level (onnxruntime's MLAS kernels approximate these functions the same
way; bounds asserted in ``tests/transform/test_fast_bounded_math.py``). Measured on gpt2-tiny
(1, 64), 1 thread, loaded shared machine: the FFN matmul + tanh GELU kernel 0.6-1.3 ms vs
1.0-2.7 ms, max error vs onnxruntime 7.2e-7 vs 8.3e-7.
"""

from __future__ import annotations

import tvm
from tvm import relax, te, tirx, topi
from tvm.relax.expr_functor import PyExprMutator, mutator

from ._module_util import CountingRewritePass

__all__ = ["FastBoundedMath", "FAST_OPS", "fast_sigmoid"]

FAST_OPS = frozenset({"relax.tanh", "relax.sigmoid", "relax.erf", "relax.nn.softmax"})
"""Operators rewritten (their approximations are bounded; see the module docstring)."""


def fast_sigmoid(x: te.Tensor) -> te.Tensor:
    """``0.5 + 0.5 * topi.fast_tanh(x / 2)`` (a TE function for ``BlockBuilder.call_te``).

    A linear chain of element-wise stages (halve, TVM's clamp and rational function, affine
    map), which FuseTIR and our schedules inline into one loop body, also in a convolution's
    or matmul's write-back.

    Parameters
    ----------
    x : tvm.te.Tensor
        float32, any shape.

    Returns
    -------
    tvm.te.Tensor
        Same shape, values in [0, 1]; absolute error at float32 rounding level (asserted in the
        tests; for ``x < -17`` the exact value is below half a float32 ulp of 1, so it is 0).
        NaN for NaN.
    """
    half = tirx.const(0.5, x.dtype)
    t = topi.fast_tanh(te.compute(x.shape, lambda *i: x(*i) * half, name="half_x"))
    return te.compute(x.shape, lambda *i: half + half * t(*i), name="sigmoid")


_KERNELS = {"relax.tanh": (topi.fast_tanh, "fast_tanh"),
            "relax.sigmoid": (fast_sigmoid, "tir_sigmoid"),
            "relax.erf": (topi.fast_erf, "fast_erf")}


def _float32_tensor(expr) -> bool:
    """A float32 tensor whose dims are constants or plain symbolic vars. A dim given by an
    expression (``T.min(2147483647, n) - ...`` after a slice) is left to TVM's op: ``call_te``
    simplifies it in the new kernel's buffers, and FuseTIR then refuses a fused function where
    one tensor meets two spellings of its shape ("Inconsistent buffers ... mapped to the same
    relax var"; magika at a symbolic batch)."""
    ty = expr.ty
    if not (isinstance(ty, relax.TensorType) and str(ty.dtype) == "float32"):
        return False
    values = getattr(ty.shape, "values", None)
    return values is not None and all(isinstance(d, (tirx.IntImm, tirx.Var)) for d in values)


@mutator
class _Rewriter(PyExprMutator):
    def __init__(self, mod):
        super().__init__(mod)
        self.rewritten = 0

    def visit_call_(self, op):
        call = super().visit_call_(op)
        name = getattr(call.op, "name", None)
        if name not in FAST_OPS or not _float32_tensor(call.args[0]):
            return call
        self.rewritten += 1
        if name == "relax.nn.softmax":
            return self.builder_.call_te(topi.nn.fast_softmax, call.args[0], call.attrs.axis,
                                         primfunc_name_hint="fast_softmax")
        compute, kernel = _KERNELS[name]
        return self.builder_.call_te(compute, call.args[0], primfunc_name_hint=kernel)


@tvm.transform.module_pass(opt_level=0, name="FastBoundedMath")
class FastBoundedMath(CountingRewritePass):
    """Rewrite float32 ``tanh``, ``sigmoid``, ``erf`` and ``softmax`` to TVM's fast
    approximations (module docstring). No parameters; raises nothing; a module without such
    calls is returned unchanged.

    Attributes
    ----------
    rewritten : int
        Calls rewritten by the last run.
    """

    count_attr = "rewritten"

    def rewrite(self, mod: tvm.IRModule):
        """One mutator over every function but composites (its builder's module holds the new
        PrimFuncs), so not :func:`rewrite_functions`."""
        rewriter = _Rewriter(mod)
        updates = {}
        for gv, func in mod.functions_items():
            if not isinstance(func, relax.Function) or (
                    func.attrs is not None and "Composite" in func.attrs):
                continue
            before = rewriter.rewritten
            new_func = rewriter.visit_expr(func)
            if rewriter.rewritten != before:
                updates[gv] = new_func
        if not updates:
            return mod, rewriter.rewritten
        out = rewriter.builder_.get()  # the module with the new PrimFuncs
        for gv, func in updates.items():
            out[gv] = func
        return out, rewriter.rewritten
