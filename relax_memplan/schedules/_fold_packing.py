"""Folding the weight-packing calls on constants at compile time (for
:func:`~relax_memplan.schedules.prepack.split_prepacked_weights`).

:class:`FoldPacking` replaces each ``call_tir`` of a packing PrimFunc on constants by its
result (numpy for a pure layout copy, else one LLVM build of all packers);
:func:`without_trivial_bindings` removes the bindings the split leaves around the kernels.
"""

from __future__ import annotations

import tvm
from tvm import relax

from ._layout_copy import layout_copy

__all__ = ["FoldPacking", "without_trivial_bindings"]


def without_trivial_bindings(func: relax.Function) -> relax.Function:
    """``func`` without the bindings ``SplitLayoutRewritePreproc`` leaves around a kernel whose
    weight was folded: ``w = <constant>`` and ``y = y_split`` (TVM's ``CanonicalizeBindings``,
    then the unused bindings removed). Left in, each is a program step of its own and the
    constant binding an allocation to ``ReorderForMemory``'s model, which then chose another
    order than for the unscheduled build (ConvNeXt-T's lower bound 3.61 -> 4.52 MB)."""
    mod = relax.transform.CanonicalizeBindings()(tvm.IRModule({"f": func}))
    return relax.analysis.remove_all_unused(mod["f"])


_PACKER_TARGET = {"kind": "llvm", "opt-level": 0}
"""Where the packing PrimFuncs are built to run at compile time (the host, no optimization)."""


@relax.expr_functor.mutator
class FoldPacking(relax.PyExprMutator):
    """Replace each ``call_tir`` of a packing PrimFunc on constants by its result. A packer
    that is a pure layout copy runs as numpy (:func:`._layout_copy.layout_copy`, no LLVM
    build); the others are built once, all in one module (plain ``llvm``, on the host). What
    ``FoldConstant`` does here, except that TVM 0.27's ``FoldConstant`` builds the PrimFunc
    again at every call site: 72 LLVM builds for BERT-base's 12 layers, 4 s of a 5 s pass."""

    def __init__(self, mod: tvm.IRModule, packers):
        super().__init__(mod)
        self.packers = {gv.name_hint: f for gv, f in packers.items()}
        self.copies = {n: layout_copy(f) for n, f in self.packers.items()}
        self.built = {}
        # (packer, constant arguments, packed constant): a weight read at several call sites
        # (ConvNeXt's feed-forward over 4 row chunks) is packed once and stored once, not
        # once per call (4 copies of each packed weight in the library)
        self.folded = []

    def visit_call_(self, op):
        call = super().visit_call_(op)
        if not (isinstance(call.op, tvm.ir.Op) and call.op.name == "relax.call_tir"):
            return call
        name = call.args[0].name_hint
        args = call.args[1].fields if hasattr(call.args[1], "fields") else [call.args[1]]
        if name not in self.packers or not all(isinstance(a, tvm.ir.GenericConst) for a in args):
            return call
        for packer, consts, packed in self.folded:
            if packer == name and len(consts) == len(args) and all(
                    c.same_as(a) for c, a in zip(consts, args)):
                return packed
        packed = self._fold(name, call, args)
        self.folded.append((name, args, packed))
        return packed

    def _fold(self, name, call, args):
        """The packing PrimFunc ``name`` run on the constants ``args``: a new constant."""
        if self.copies[name] is not None:
            # vad-lstm's one packer: LLVM build + load 0.02 CPU s, numpy well under 1 ms
            return relax.const(self.copies[name](args[0].value.numpy()))
        if not self.built:
            # every packer in one LLVM module: one code generation and one JIT, not one
            # per packer; LLVM at -O0: a packer is a copy, run once (bert-tiny, 3 packers:
            # 0.10 -> 0.05 CPU s; vad-lstm, 1: 0.034 -> 0.023)
            funcs = {n: f.with_attr("global_symbol", n) for n, f in self.packers.items()
                     if self.copies[n] is None}
            built = tvm.compile(tvm.IRModule(funcs), target=_PACKER_TARGET)
            self.built = {n: built[n] for n in funcs}
        (out_ty,) = call.ty_args
        out = tvm.runtime.empty([int(d) for d in out_ty.shape.values], str(out_ty.dtype))
        self.built[name](*[a.value for a in args], out)
        return relax.const(out.numpy())
