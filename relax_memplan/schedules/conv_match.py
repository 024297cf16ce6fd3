"""Recognising a direct convolution block in a PrimFunc (for :class:`~relax_memplan.schedules.
DirectConv`).

A PrimFunc that LegalizeOps makes of ``relax.nn.conv1d``/``conv2d`` (TOPI ``conv*_nchw``,
grouped, depthwise) has one reduction block
``out[n, f, y, x] += pad[n, c(f, rc), y * sh + ry * dh, x * sw + rx * dw] * w[f, rc, ry, rx]``;
:func:`match_conv` finds it and returns its extents and the blocks around it.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import List, Optional

from tvm import s_tir, tirx
from tvm.s_tir.dlight.analysis import get_root_block

__all__ = ["ConvAxes", "match_conv"]


@dataclass
class ConvAxes:
    """The convolution block of a PrimFunc and what the schedule needs to know.

    Attributes
    ----------
    block : SBlockRV
        The reduction block.
    spatial_extents : list of int
        ``(n, f, [y,] x)`` output extents.
    reduce_extents : list of int
        ``(rc, [ry,] rx)`` extents.
    depthwise : bool
        The input channel read depends on the output channel (grouped or depthwise).
    producers, consumers : list of SBlockRV
        Blocks before / after the reduction block, in program order.
    """

    block: object
    spatial_extents: List[int]
    reduce_extents: List[int]
    depthwise: bool
    producers: list
    consumers: list


def _uses(expr, var) -> bool:
    if isinstance(expr, tirx.IntImm):
        return False
    return any(v.same_as(var) for v in tirx.analysis.undefined_vars(expr))


def _static(extent) -> Optional[int]:
    return extent.value if isinstance(extent, tirx.IntImm) else None


def match_conv(sch: s_tir.Schedule) -> Optional[ConvAxes]:
    """Find the direct-convolution block of the function in ``sch``.

    Parameters
    ----------
    sch : tvm.s_tir.Schedule

    Returns
    -------
    ConvAxes or None
        ``None`` unless the function has exactly one reduction block, a sum of
        products of two buffers written at its spatial iter vars ``(n, f, [y,] x)``
        in order, with at least two reduction iter vars (or one reading the
        input at a ``x * stride + rx`` index), ``x`` indexing only the last dim
        of one operand (the input) and not the other (the weights), and every
        extent constant.
    """
    blocks = sch.get_child_blocks(get_root_block(sch))
    reductions = [b for b in blocks if any(iv.iter_type == tirx.IterVar.CommReduce
                                           for iv in sch.get(b).iter_vars)]
    if len(reductions) != 1:
        return None
    block_rv = reductions[0]
    block = sch.get(block_rv)
    spatial = [iv for iv in block.iter_vars if iv.iter_type == tirx.IterVar.DataPar]
    reduce = [iv for iv in block.iter_vars if iv.iter_type == tirx.IterVar.CommReduce]
    if len(spatial) + len(reduce) != len(block.iter_vars) or len(spatial) not in (3, 4):
        return None
    if len(reduce) != len(spatial) - 1:
        return None
    extents = [_static(iv.dom.extent) for iv in block.iter_vars]
    if any(e is None for e in extents):
        return None
    # loops in iter-var order (S.. then R..), one loop per iter var
    loops = sch.get_loops(block_rv)
    if len(loops) != len(block.iter_vars):
        return None
    for lp, iv in zip(loops, block.iter_vars):
        binding = sch.get(lp)
        if _static(binding.extent) != _static(iv.dom.extent):
            return None
    if len(block.writes) != 1 or len(block.reads) != 2:
        return None
    out_idx = [r.min for r in block.writes[0].region]
    if len(out_idx) != len(spatial) or not all(
            isinstance(i, tirx.Var) and i.same_as(iv.var) for i, iv in zip(out_idx, spatial)):
        return None
    store = block.body
    if not isinstance(store, tirx.BufferStore) or not isinstance(store.value, tirx.Add):
        return None
    x_var, f_var = spatial[-1].var, spatial[1].var
    data = [r for r in block.reads if _uses(r.region[-1].min, x_var)]
    weights = [r for r in block.reads if not any(_uses(rng.min, x_var) for rng in r.region)]
    if len(data) != 1 or len(weights) != 1:
        return None
    if any(not (isinstance(rng.extent, tirx.IntImm) and rng.extent.value == 1)
           for r in block.reads for rng in r.region):
        return None
    depthwise = any(_uses(rng.min, f_var) for rng in data[0].region)
    pos = [sch.get(b).same_as(block) for b in blocks].index(True)
    return ConvAxes(block=block_rv,
                    spatial_extents=[_static(iv.dom.extent) for iv in spatial],
                    reduce_extents=[_static(iv.dom.extent) for iv in reduce],
                    depthwise=depthwise,
                    producers=list(blocks[:pos]), consumers=list(blocks[pos + 1:]))
