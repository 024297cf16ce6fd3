"""dlight's CPU GEMV rule, restricted to plain dot products.

Where it runs
-------------
In :func:`relax_memplan.schedules.cpu_schedule_rules`, after the matmul and
convolution rules, before dlight's ``Reduction``.

Why
---
dlight's ``GEMV`` normalises a kernel by fusing all reduction loops into one
and vectorising that fused reduction 64 or 128 lanes wide. A convolution whose
output is one pixel (``1 x 1`` feature map, or a conv1d over one position)
passes its ``is_gemv`` test; its fused reduction reads the input through
``floordiv``/``floormod`` of the fused index plus the window offsets
(``y * stride + ry``), and LLVM then spends minutes on the resulting vector
code (ppocrv4-det did not compile in 900 s, silero-vad took 18 s instead of
about 2 s). :class:`DotProductGEMV` hands the kernel to dlight only when its
reduction is a plain dot product: one reduction loop of extent > 1, and every
index of every buffer the reduction block reads is a loop variable or a
constant.
"""

from __future__ import annotations

from typing import List, Optional

from tvm import s_tir, tirx
from tvm.s_tir import dlight

__all__ = ["DotProductGEMV", "reduction_blocks", "is_plain_dot_product"]


def reduction_blocks(func: tirx.PrimFunc) -> List[s_tir.SBlock]:
    """The blocks under ``func``'s root block with a reduction (``CommReduce``) iter var.

    Parameters
    ----------
    func : tvm.tirx.PrimFunc
        A legalized (possibly fused) PrimFunc: its blocks are children of the root block.

    Returns
    -------
    list of tvm.s_tir.SBlock
    """
    sch = s_tir.Schedule(func)
    blocks = [sch.get(b) for b in sch.get_child_blocks(sch.get_sblock("root"))]
    return [b for b in blocks
            if any(iv.iter_type == tirx.IterVar.CommReduce for iv in b.iter_vars)]


def _is_plain_index(index) -> bool:
    return isinstance(index, (tirx.Var, tirx.IntImm))


def is_plain_dot_product(block: s_tir.SBlock) -> bool:
    """Whether ``block`` reduces over one non-unit loop and reads only at plain indices.

    Parameters
    ----------
    block : tvm.s_tir.SBlock
        A reduction block.

    Returns
    -------
    bool
        ``False`` for convolution-like blocks (several non-unit reduction loops,
        or reads at ``y * stride + ry``-style indices).
    """
    reduce_iters = [iv for iv in block.iter_vars if iv.iter_type == tirx.IterVar.CommReduce
                    and not (isinstance(iv.dom.extent, tirx.IntImm) and iv.dom.extent.value == 1)]
    if len(reduce_iters) > 1:
        return False
    for region in block.reads:
        for rng in region.region:
            if not _is_plain_index(rng.min):
                return False
    return True


class DotProductGEMV(dlight.ScheduleRule):
    """dlight's CPU ``GEMV``, applied only when every reduction is a plain dot product.

    Parameters
    ----------
    rule : tvm.s_tir.dlight.ScheduleRule, optional
        The GEMV rule to guard (default ``dlight.cpu.GEMV()``).
    """

    def __init__(self, rule: Optional[dlight.ScheduleRule] = None):
        self.rule = rule if rule is not None else dlight.cpu.GEMV()

    def apply(self, func, target, tunable):
        if not isinstance(func, tirx.PrimFunc):
            return None
        blocks = reduction_blocks(func)
        if not blocks or not all(is_plain_dot_product(b) for b in blocks):
            return None
        return self.rule.apply(func, target, tunable)

    def __repr__(self) -> str:
        return f"DotProductGEMV({type(self.rule).__name__})"
