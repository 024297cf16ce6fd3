"""Row reductions (softmax, layer norm, RMS norm) with vectorized partial sums.

The loop nest of :class:`~relax_memplan.schedules.cpu_reduction.VectorRowReduction`; see there.
"""

from __future__ import annotations

from typing import Optional

from tvm import s_tir, tirx
from tvm.s_tir.dlight.analysis import normalize_prim_func

LOCAL_ROW_LIMIT_BYTES = 16384
"""Largest per-row intermediate (bytes) moved to a ``local`` (stack) buffer."""


def _is_sum(block: s_tir.SBlock) -> bool:
    """Whether the reduction block's update is ``acc = acc + value``."""
    return isinstance(block.body, tirx.BufferStore) and isinstance(block.body.value, tirx.Add)


def row_blocks(sch: s_tir.Schedule) -> Optional[tuple]:
    """``(infos, rows)`` when ``sch`` is a chain of row sums and element-wise blocks.

    Every reduction block is a sum over one innermost axis after the ``rows`` leading
    spatial axes (``S..SR``; a max, as in softmax, is not taken: there the vectorized
    ``exp`` dominates and the rule measured slower than dlight's), every other block is ``S..S`` or ``S..SS`` over the same leading axes, and the
    last block is element-wise over a row (``S..SS``). Returns ``None`` otherwise.
    """
    infos = normalize_prim_func(sch)
    if infos is None or len(infos) < 2:
        return None
    kinds = [bi.dom_kind() for bi in infos]
    reductions = [k for k in kinds if "R" in k]
    if not reductions:
        return None
    rows = len(reductions[0]) - 1
    if rows < 1 or any(k != "S" * rows + "R" for k in reductions):
        return None
    if not all(_is_sum(sch.get(bi.block_rv)) for bi in infos if not bi.is_injective()):
        return None
    if kinds[-1] != "S" * (rows + 1):
        return None
    if any("R" not in k and k not in ("S" * rows, "S" * (rows + 1)) for k in kinds):
        return None
    return infos, rows


def static_elements(sch: s_tir.Schedule, block) -> Optional[int]:
    """Elements ``block`` writes when its extents are constant, else ``None``."""
    total = 1
    for iv in sch.get(block).iter_vars:
        if not isinstance(iv.dom.extent, tirx.IntImm):
            return None
        total *= iv.dom.extent.value
    return total


def partial_lanes(extent, widest: int) -> int:
    """Lanes of partial sums for a reduction of ``extent`` elements: the largest power of two
    <= ``widest`` dividing it at least twice, 0 for a symbolic extent or fewer than 4 lanes."""
    if not isinstance(extent, (int, tirx.IntImm)):
        return 0
    extent = int(extent)
    lanes = widest
    while lanes >= 4 and (extent % lanes or extent <= lanes):
        lanes //= 2
    return lanes if lanes >= 4 else 0


def _vectorize_inner(sch: s_tir.Schedule, block, lanes: int) -> None:
    inner = sch.get_loops(block)[-1]
    extent = sch.get(inner).extent
    if isinstance(extent, tirx.IntImm) and extent.value <= lanes:
        if extent.value >= 2:
            sch.vectorize(inner)
        return
    _, vec = sch.split(inner, factors=[None, lanes])
    sch.vectorize(vec)


def _rfactor_all(sch: s_tir.Schedule, infos, lanes: int) -> tuple:
    """Split every static-extent reduction into ``lanes`` partial sums (``rfactor``), at the
    root, before anything is moved (``rfactor`` needs the block first under its loop)."""
    partials, serial = [], []
    for bi in infos:
        if bi.is_injective():
            continue
        r = sch.get_loops(bi.block_rv)[-1]
        width = partial_lanes(sch.get(r).extent, lanes)
        if not width:
            serial.append(bi.block_rv)
            continue
        _, ki = sch.split(r, factors=[None, width])
        partials.append((sch.rfactor(ki, factor_axis=0), width))
    return partials, serial


def _schedule_partial(sch: s_tir.Schedule, rf, width: int) -> None:
    """The partial-sum block under the row loop: ``ko`` (reduction) outside, the ``width``
    lanes inside and vectorized, its ``width``-element buffer on the stack."""
    block = sch.get(rf)
    loops = sch.get_loops(rf)[-len(block.iter_vars):]
    ko = [lp for lp, iv in zip(loops, block.iter_vars) if iv.iter_type == tirx.IterVar.CommReduce]
    ki = [lp for lp, iv in zip(loops, block.iter_vars)
          if iv.iter_type == tirx.IterVar.DataPar and isinstance(iv.dom.extent, tirx.IntImm)
          and iv.dom.extent.value == width]
    if len(ko) != 1 or not ki:
        raise s_tir.ScheduleError("partial-sum block without one reduction and one lane loop")
    sch.reorder(ko[0], ki[0])
    sch.vectorize(ki[0])
    init = sch.decompose_reduction(rf, ko[0])
    sch.vectorize(sch.get_loops(init)[-1])
    sch.set_scope(rf, 0, "local")


def _row_bytes(sch: s_tir.Schedule, block, rows: int) -> Optional[int]:
    buf = sch.get(block).writes[0].source
    size = 1
    for dim in buf.shape[rows:]:
        if not isinstance(dim, tirx.IntImm):
            return None
        size *= dim.value
    return size * buf.dtype.bits // 8


def schedule_rows(sch: s_tir.Schedule, infos, rows: int, lanes: int,
                  parallel: bool = True) -> s_tir.Schedule:
    """Row loop parallel (unless ``parallel`` is false), every block computed under it,
    partial sums vectorized."""
    partials, serial = _rfactor_all(sch, infos, lanes)
    blocks = list(sch.get_child_blocks(sch.get_sblock("root")))
    last = blocks[-1]
    loops = sch.get_loops(last)
    spatial = sch.fuse(*loops[:rows]) if rows > 1 else loops[0]
    if parallel:
        sch.parallel(spatial)
    _vectorize_inner(sch, last, lanes)
    for block in reversed(blocks[:-1]):
        sch.compute_at(block, spatial, preserve_unit_loops=True)
    rf_names = {sch.get(rf).name_hint for rf, _ in partials}
    serial_names = {sch.get(b).name_hint for b in serial}
    for rf, width in partials:
        _schedule_partial(sch, rf, width)
    for block in sch.get_child_blocks(spatial):
        stmt = sch.get(block)
        if stmt.name_hint in rf_names or stmt.same_as(sch.get(last)) or not stmt.writes:
            continue
        if stmt.name_hint.endswith("_init"):
            continue
        size = _row_bytes(sch, block, rows)
        if size is not None and size <= LOCAL_ROW_LIMIT_BYTES:
            sch.set_scope(block, 0, "local")
        reduces = any(iv.iter_type == tirx.IterVar.CommReduce for iv in stmt.iter_vars)
        if not reduces and len(stmt.iter_vars) > rows:
            _vectorize_inner(sch, block, lanes)
        elif stmt.name_hint in serial_names:
            inner = sch.get_loops(block)[-1]
            ext = sch.get(inner).extent
            if not (isinstance(ext, tirx.IntImm) and ext.value <= lanes):
                _, inner = sch.split(inner, factors=[None, lanes])
                sch.annotate(inner, "pragma_auto_unroll_max_step", lanes)
                sch.annotate(inner, "pragma_unroll_explicit", 1)
    return sch

