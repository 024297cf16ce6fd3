"""RemoveDropout: inference-mode ``relax.nn.dropout`` is the identity; drop it.

Where it runs: on the high-level Relax graph, before ``LegalizeOps`` (our pipeline runs it
first in the ``legalize`` phase when ``fusion=True``). Reads no attributes.

What it matches: ``TupleGetItem(R.nn.dropout(x, rate), 0)``, the data output of a dropout,
which TVM's ONNX importer makes of an ONNX ``Dropout`` node (any ``rate``; ONNX inference
ignores it). That item is replaced by ``x``; the dropout call is then removed when its mask
output (item 1) has no reader, else kept for the mask alone.

Why: TVM 0.27 legalizes ``dropout`` to a copy of its input. After an operator FuseOps can fuse
with (a matmul epilogue, an elementwise chain) the copy costs nothing more than an extra store,
but after a reduction or an opaque kernel it is a kernel of its own and a tensor that lives
beside its input. Removing it before fusion removes both.
"""

from __future__ import annotations

import tvm
from tvm import relax
from tvm.relax.expr_functor import PyExprMutator, mutator

from ._module_util import CountingRewritePass

__all__ = ["RemoveDropout"]


@tvm.transform.module_pass(opt_level=0, name="RemoveDropout")
class RemoveDropout(CountingRewritePass):
    """Replace the data output of every ``relax.nn.dropout`` by its input (see the module
    docstring). No parameters; raises nothing.

    Attributes
    ----------
    removed : int
        Dropout outputs replaced by the last run.
    """

    count_attr = "removed"
    pattern = ("dropout", "removed")
    make_rewriter = staticmethod(lambda mod: _Rewriter(mod))  # the mutator, defined below


_DROPOUT = "relax.nn.dropout"


@mutator
class _Rewriter(PyExprMutator):
    def __init__(self, mod):
        super().__init__(mod)
        self.removed = 0

    def visit_tuple_getitem_(self, op):
        op = super().visit_tuple_getitem_(op)
        if op.index != 0 or not isinstance(op.tuple_value, relax.Var):
            return op
        bound = self.lookup_binding(op.tuple_value)
        if (isinstance(bound, relax.Call) and isinstance(bound.op, tvm.ir.Op)
                and bound.op.name == _DROPOUT):
            self.removed += 1
            return bound.args[0]
        return op
