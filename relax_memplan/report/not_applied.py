"""Why a build with symbolic dims (``--dim``) gets none of some memory features a fixed-shape
build of the same model gets, for the report (``CompileReport.not_applied``).

Three features are static-only or rarely apply with symbolic shapes:

* concat in place (``PlanStaticMemory(concat_inplace=True)``): only the static planner places a
  concatenation's inputs inside its output; :class:`~relax_memplan.transform.PlanDynamicMemory`
  does not, so every concatenation of a symbolic shape is computed into a fresh tensor;
* conv chains (:class:`~relax_memplan.transform.fuse_conv_chain.FuseConvChain`): its matcher takes
  constant shapes only (its kernel's row tiles are sized at compile time);
* in-place reuse with symbolic sizes: a call writes over an input only where the two byte sizes
  are provably equal as expressions of the dims; the ``upper_bound`` strategy does no in-place.

ppocrv4-det's bound is 8,179,328 B with ``--dim`` against 5,424,000 B with fixed shapes: the
report says which features were not applied, and why, so the difference is explained.

Counts come from the imported module (before any pass): ``relax.concat`` calls and strided
``relax.nn.conv2d`` calls (stride >= 2, the consumers FuseConvChain fuses) whose output shape
is not constant. A feature that is off, or that has nothing to act on, is not listed.
"""

from __future__ import annotations

from typing import Dict, Tuple

import tvm
from tvm import relax

__all__ = ["features_not_applied", "symbolic_call_counts"]

#: JSON key -> words in the text report.
FEATURE_WORDS = {"inplace": "in-place reuse", "concat_inplace": "concat in place",
                 "conv_chain": "conv chains"}


def _constant_shape(expr) -> bool:
    shape = getattr(getattr(expr, "ty", None), "shape", None)
    values = getattr(shape, "values", None)
    return values is not None and all(isinstance(v, tvm.tirx.IntImm) for v in values)


def symbolic_call_counts(mod: tvm.IRModule) -> Tuple[int, int]:
    """(``relax.concat`` calls, strided ``relax.nn.conv2d`` calls) with a non-constant output
    shape, over the Relax functions of ``mod``."""
    counts = [0, 0]

    def visit(expr):
        if not isinstance(expr, relax.Call) or not isinstance(expr.op, tvm.ir.Op):
            return
        if _constant_shape(expr):
            return
        if expr.op.name == "relax.concat":
            counts[0] += 1
        elif expr.op.name == "relax.nn.conv2d" and max(int(s) for s in expr.attrs.strides) >= 2:
            counts[1] += 1

    for _gv, func in mod.functions_items():
        if isinstance(func, relax.Function):
            relax.analysis.post_order_visit(func, visit)
    return counts[0], counts[1]


def features_not_applied(mod: tvm.IRModule, *, strategy: str, inplace: bool,
                         concat_inplace: bool, conv_chain: bool,
                         inplace_calls=None) -> Dict[str, str]:
    """Feature -> why it was not applied in a build with symbolic dims (keys of
    :data:`FEATURE_WORDS`); a feature that is off or has nothing to act on is absent.

    Parameters
    ----------
    mod : tvm.IRModule
        The imported module, dims symbolic.
    strategy : str
        The dynamic strategy (``exact``, ``upper_bound``, ``buckets``).
    inplace, concat_inplace : bool
        Whether the planner settings ask for in-place reuse and concat in place.
    conv_chain : bool
        Whether the build runs :class:`~relax_memplan.transform.fuse_conv_chain.FuseConvChain`
        (fusion on, llvm/c target, mode not ``off``).
    inplace_calls : int, optional
        Calls of ``main`` the dynamic plan writes in place (None: not computed).

    Returns
    -------
    dict of str to str
    """
    concats, strided = symbolic_call_counts(mod)
    out: Dict[str, str] = {}
    if inplace and strategy == "upper_bound":
        out["inplace"] = ("the upper_bound strategy does no in-place reuse (exact and buckets "
                          "do)")
    elif inplace and inplace_calls == 0:
        out["inplace"] = ("no kernel call's output and dying input have byte sizes provably "
                          "equal as expressions of the dims")
    if concat_inplace and concats:
        out["concat_inplace"] = (f"static shapes only (the dynamic planner does not place a "
                                 f"concatenation's inputs inside its output); {concats} "
                                 f"concatenation(s) with symbolic shapes")
    if conv_chain and strided:
        out["conv_chain"] = (f"static shapes only (FuseConvChain sizes its row tiles at compile "
                             f"time); {strided} strided convolution(s) with symbolic shapes")
    return out
