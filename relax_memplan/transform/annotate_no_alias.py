"""AnnotateNoAlias: mark single-pointer helper PrimFuncs ``tirx.noalias`` so kernels keep theirs.

Where it runs
-------------
Last pass of the ``finalize`` phase, after ``VMShapeLower`` (which adds the
``shape_func`` PrimFuncs of symbolic shapes) and after every pass of ours that
adds a PrimFunc (``InsertDimRangeCheck``'s ``relax_memplan_check_dims_*``).
Reads and writes the ``tirx.noalias`` PrimFunc attribute; changes nothing else.

Why (TVM 0.27's LLVM codegen)
-----------------------------
``CodeGenLLVM`` keeps whether the function being emitted is ``tirx.noalias``
in one member, ``is_restricted_``, set in ``DeclareFunctionInternal``.
``AddFunctionsOrdered`` (``codegen_llvm.h``) first declares every PrimFunc of
the module, sorted by symbol name, then emits each one; on emission
``DeclareFunctionInternal`` finds the function already declared and returns
before setting the flag. So every function of an LLVM module is emitted with
the flag of the **alphabetically last** symbol. When that function lacks
``tirx.noalias``, every kernel loses: no ``noalias`` on the pointer arguments
of its ``<name>_compute_`` function (``codegen_cpu.cc``, ``compute_scope``,
which is then also inlined), every bound pointer goes to ``alias_var_set_``,
and all loads/stores share one TBAA tag, so LLVM must assume the output may
alias the inputs (reloads, no hoisting): a scheduled dense runs 2-3x slower.

Legalized and fused kernels carry ``tirx.noalias`` (TE ``create_prim_func``,
``FuseTIR``); the helpers do not: ``shape_func`` (``VMShapeLower``, only with
symbolic shapes) and ``relax_memplan_check_dims_main``. ``__tvm_ffi_shape_func``
sorts after most kernel names (``matmul``, ``fused_*``, ``layer_norm``...),
hence "symbolic kernels have no noalias" while the same kernel in a static
build (no ``shape_func``) has it.

Which functions are marked (safety)
-----------------------------------
``tirx.noalias`` promises that distinct pointers do not alias. A PrimFunc that
mentions at most one pointer or buffer variable (parameters, declared,
bound and allocated buffers all counted) has nothing to alias with, so
marking it cannot change its meaning; both helpers above are of this kind
(``shape_func(H)``: one buffer; the dim check: int64 scalars only). A PrimFunc
lacking the attribute and mentioning two or more pointers is left alone and
named in :attr:`AnnotateNoAlias.unrestricted`: if its symbol sorts last, the
module's kernels are emitted without ``noalias`` again (and, the other way
round, TVM gives ``noalias`` to such a function whenever a restricted function
sorts last: that is TVM's behaviour, not changed here).

Kernels themselves are not marked here: those from our pipeline already carry
the attribute, which says their arguments are distinct tensors; our memory
plan keeps that true (distinct live tensors at disjoint arena offsets, no
in-place kernel).
"""

from __future__ import annotations

from typing import List

import tvm
import tvm_ffi
from tvm import ir, tirx

from ._module_util import replace_functions

__all__ = ["AnnotateNoAlias", "NOALIAS_ATTR", "pointer_vars"]

NOALIAS_ATTR = "tirx.noalias"
"""PrimFunc attribute read by TVM's codegens: its pointer arguments do not alias."""


def pointer_vars(func: tirx.PrimFunc) -> List[str]:
    """Names of the distinct pointer / buffer variables ``func`` mentions (params and body).

    One entry per variable, in order of first appearance (two variables may share a name).
    """
    seen = {}

    def on_node(node, visitor):
        if isinstance(node, tirx.Var) and isinstance(node.ty, (tirx.BufferType, ir.PointerType)):
            seen.setdefault(node, node.name)
        visitor.default_visit(node)

    tvm_ffi.structural_visit(func, [(object, on_node)])
    return list(seen.values())


def _restricted(func: tirx.PrimFunc) -> bool:
    return func.attrs is not None and NOALIAS_ATTR in func.attrs and bool(func.attrs[NOALIAS_ATTR])


@tvm.transform.module_pass(opt_level=0, name="AnnotateNoAlias")
class AnnotateNoAlias:
    """Set ``tirx.noalias`` on PrimFuncs with at most one pointer (see the module docstring).

    Attributes
    ----------
    annotated : list of str
        Filled (anew) each time the pass runs: PrimFuncs given the attribute.
    unrestricted : list of str
        PrimFuncs still without it, one line each with the pointers they
        mention (``"<func>: 2 pointers (a, b)"``).
    """

    def __init__(self):
        self.annotated: List[str] = []
        self.unrestricted: List[str] = []

    def transform_module(self, mod: tvm.IRModule, _ctx) -> tvm.IRModule:
        self.annotated, self.unrestricted = [], []
        updates = {}
        for gv, func in mod.functions_items():
            if not isinstance(func, tirx.PrimFunc) or _restricted(func):
                continue
            pointers = pointer_vars(func)
            if len(pointers) <= 1:
                updates[gv] = func.with_attr(NOALIAS_ATTR, True)
                self.annotated.append(gv.name_hint)
            else:
                self.unrestricted.append(
                    f"{gv.name_hint}: {len(pointers)} pointers ({', '.join(pointers)})")
        return replace_functions(mod, updates)
