"""ExpandIntegerPower: ``power(x, 2|3|4)`` with a constant exponent becomes multiplications.

Why: TVM 0.27 legalizes ``relax.power`` to ``T.pow``, and on CUDA the generated kernel returns
NaN for every negative base (TVM warns "Detected pow(x, y) where y >= 3 ... unintended behaviors
when x < 0" and builds it anyway). GPT-2's tanh-approximated GELU, ``0.5 x (1 + tanh(c (x +
0.044715 x^3)))``, is exported with ``Pow(x, 3)``, so on an H200 gpt2-tiny's output was NaN in
every element, with TVM's own pipeline as with ours (``benchmarks/gpu_check.py``, found on the
first GPU run). ``x * x * x`` is exact where ``pow`` is not needed, on every target, and costs
less than ``pow`` on the CPU too.

Where it runs: on the high-level Relax graph, before ``LegalizeOps`` (first in the ``legalize``
phase of our pipeline, on every target, with or without fusion). Reads no attributes.

What it matches: ``R.power(x, c)`` where ``c`` is a 0-d (or one-element) float constant equal to
2, 3 or 4 and ``x`` a float tensor of the call's own shape and dtype. Other exponents and
integer tensors are left to TVM.
"""

from __future__ import annotations

from typing import Optional

import tvm
import tvm_ffi
from tvm import relax
from tvm.relax.expr_functor import PyExprMutator, mutator

from ._module_util import CountingRewritePass

__all__ = ["ExpandIntegerPower", "SMALL_EXPONENTS"]

SMALL_EXPONENTS = (2, 3, 4)
_POWER = "relax.power"


@tvm.transform.module_pass(opt_level=0, name="ExpandIntegerPower")
class ExpandIntegerPower(CountingRewritePass):
    """Rewrite ``power(x, n)`` for a constant ``n`` in :data:`SMALL_EXPONENTS` as ``n - 1``
    (``n`` = 4: two) multiplications (see the module docstring). Raises nothing.

    Attributes
    ----------
    expanded : int
        Power calls rewritten by the last run.
    """

    count_attr = "expanded"
    make_rewriter = staticmethod(lambda mod: _Rewriter(mod))  # the mutator, defined below


def small_integer_exponent(expr) -> Optional[int]:
    """``n`` if ``expr`` is a float constant with one element equal to ``n`` in
    :data:`SMALL_EXPONENTS`, else ``None``."""
    if not (isinstance(expr, tvm.ir.GenericConst) and isinstance(expr.value, tvm.runtime.Tensor)):
        return None
    value = expr.value.numpy()
    if value.size != 1 or value.dtype.kind != "f":
        return None
    scalar = float(value.reshape(()))
    n = int(round(scalar))
    return n if n in SMALL_EXPONENTS and scalar == n else None


def _same_tensor_type(a, b) -> bool:
    sa, sb = a.ty, b.ty
    if not (isinstance(sa, relax.TensorType) and isinstance(sb, relax.TensorType)):
        return False
    if str(sa.dtype) != str(sb.dtype) or not str(sa.dtype).startswith(("float", "bfloat")):
        return False
    if sa.shape is None or sb.shape is None:
        return False
    return tvm_ffi.structural_equal(sa.shape, sb.shape)


@mutator
class _Rewriter(PyExprMutator):
    def __init__(self, mod):
        super().__init__(mod)
        self.expanded = 0

    def visit_call_(self, op):
        call = super().visit_call_(op)
        if not (isinstance(call.op, tvm.ir.Op) and call.op.name == _POWER):
            return call
        base, exponent = call.args
        n = small_integer_exponent(exponent)
        if n is None or not _same_tensor_type(base, call):
            return call
        self.expanded += 1
        square = relax.op.multiply(base, base)
        if n == 2:
            return square
        square = self.builder_.emit(square)
        return relax.op.multiply(square, base if n == 3 else square)
