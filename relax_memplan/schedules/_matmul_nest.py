"""The BLIS-style loop nest shared by the CPU matmul rules (:mod:`.cpu_matmul`).

Tile sizes (:class:`TileConfig`), the target's SIMD width (:func:`simd_lanes`) and
:func:`_schedule_tiles`, which builds the register-tile nest on an analysed matmul block:
padding of remainders, weight prepacking or per-call panel packing, parallel panel loop,
register tile with the epilogue in its write-back. The algorithm and its sources are described
in :mod:`relax_memplan.schedules.cpu_matmul`.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import List, Optional

import tvm
from tvm import DataType, s_tir, tirx
from tvm.target import Target
from tvm.target.codegen import llvm_cpu_has_features

from .analysis import MatmulAxes
from .prepack import prepack_constant_b

__all__ = ["TileConfig", "simd_lanes"]

_ScheduleError = s_tir.ScheduleError

@dataclass(frozen=True)
class TileConfig:
    """Tile sizes of the matmul schedule (in elements, not bytes).

    Attributes
    ----------
    mr : int
        Rows of the register tile (micro-kernel height).
    nr_vectors : int
        Columns of the register tile, in SIMD vectors (``nr = nr_vectors * lanes``).
    mc : int
        Rows computed per packed ``B`` panel visit (``mc % mr == 0``); the
        ``mc x K`` block of ``A`` is reused from L2 across the panel's
        micro-tiles. ``0`` means no ``M`` blocking.
    pack_b : bool
        Pack the ``K x nr`` panel of ``B`` into a contiguous buffer.
    unroll_max_step : int
        ``pragma_auto_unroll_max_step`` on the tile loop.
    pad_remainders : bool
        ``pad_einsum`` rows/columns not provably divisible by ``mr``/``nr``
        (else the split inserts predicates inside the micro-kernel).
    parallel : bool
        Parallelise the panel loop (and the copies outside the tile); ``False``
        for matmuls too small to pay for a parallel launch.
    nr_columns : int
        Columns of the register tile in elements when they are not whole vectors
        (``0``: ``nr_vectors * lanes``). Set by :class:`StaticMatmul` for a
        column axis made of several loops whose innermost extent has no divisor of
        one vector (a 1x1 convolution's ``(y, x)`` on a 14-wide map): the tile is
        ``t`` whole rows (``nr_columns = t * W``, ``t`` dividing the next loop's
        extent), a box of the output that is also contiguous, vectorised as whole
        vectors (or one vector narrower than ``lanes``) instead of padding each row.
    """

    mr: int = 4
    nr_vectors: int = 2
    mc: int = 0
    pack_b: bool = True
    unroll_max_step: int = 64
    pad_remainders: bool = True
    parallel: bool = True
    nr_columns: int = 0

    def columns(self, lanes: int) -> int:
        """Columns of the register tile in elements (``nr``)."""
        return self.nr_columns or self.nr_vectors * lanes


def simd_lanes(target: Target, dtype: str = "float32") -> int:
    """SIMD lanes of ``dtype`` for an llvm target (from its ``mcpu``/``mattr`` features).

    Parameters
    ----------
    target : tvm.target.Target
        An llvm target; plain ``llvm`` on x86-64 means SSE2 (128-bit vectors).
    dtype : str
        Element type.

    Returns
    -------
    int
        Elements per vector register.
    """
    bits = 128
    try:
        if llvm_cpu_has_features("avx512f", target):
            bits = 512
        elif llvm_cpu_has_features("avx", target):
            bits = 256
    except Exception:  # noqa: BLE001 -- non-x86 triples lack the feature names
        bits = 128
    elem_bits = DataType(dtype).bits
    return max(1, bits // max(8, elem_bits))


def _has_fma(target: Target) -> bool:
    try:
        return bool(llvm_cpu_has_features("fma", target))
    except Exception:  # noqa: BLE001 -- non-x86 triples lack the feature name
        return False


def _fuse(sch: s_tir.Schedule, loops: List) -> Optional[s_tir.schedule.LoopRV]:
    if not loops:
        return None
    return loops[0] if len(loops) == 1 else sch.fuse(*loops)


def _try(prim, block) -> bool:
    try:
        prim(block)
    except _ScheduleError:
        return False
    return True


def _loops_by_role(sch: s_tir.Schedule, axes: MatmulAxes):
    loops = sch.get_loops(axes.block)[-len(axes.roles):]
    return {r: [lp for lp, role in zip(loops, axes.roles) if role == r] for r in "SIJK"}


def _product(extents):
    out = 1
    for e in extents:
        out = e * out
    return out


def _pad_remainders(sch: s_tir.Schedule, axes: MatmulAxes, mr: int, nr: int) -> None:
    """``pad_einsum`` the innermost row/column loop to ``mr``/``nr`` when not provably divisible.

    Padding moves the remainder out of the micro-kernel: ``A`` (and ``B``) get
    zero-padded copies, ``C`` a padded tile, and only the epilogue is guarded.

    The test is on the innermost loop of the role, not on the product of its
    loops: with rows ``(batch, seq)`` a tile must not straddle two ``batch``
    iterations (``M = 2 * 17`` is even, but a 2-row tile over the fused rows is
    not a box of ``(batch, seq)``: the write-back region becomes a bounding
    box, and its stores read stale accumulators or, with symbolic ``seq``,
    land out of bounds). See :func:`_split_fusable`.
    """
    analyzer = tvm.sym.Analyzer()
    padding = [1] * len(axes.roles)
    for role, tile in (("I", mr), ("J", nr)):
        if role not in axes.roles:
            continue
        extents = getattr(axes, f"{role.lower()}_extents")
        total = extents[-1]
        if role == "J" and _box_aligned(extents, tile):
            divisible = True
        elif isinstance(total, int):
            divisible = total % tile == 0
        else:
            divisible = analyzer.can_prove_equal(tirx.floormod(total, tile), 0)
        if not divisible:
            padding[axes.roles.rindex(role)] = tile
    if any(p != 1 for p in padding):
        sch.pad_einsum(axes.block, padding)


def _box_aligned(extents, tile: int) -> bool:
    """Whether ``tile`` consecutive elements of the fused loops ``extents`` are always a box:
    ``tile`` divides the innermost extent ``W``, or is ``t * W`` with ``t`` dividing the
    next extent (whole rows)."""
    if not extents or not all(isinstance(e, int) for e in extents[-2:]):
        return False
    inner = extents[-1]
    if inner % tile == 0:
        return True
    return (len(extents) >= 2 and tile % inner == 0
            and extents[-2] % (tile // inner) == 0)


def _split_fusable(sch: s_tir.Schedule, loops: List):
    """Split ``loops`` (outer to inner) into ``(separate, fusable)``.

    ``fusable`` is the longest suffix whose loops, all but its first, have
    constant extents. The innermost extent is a multiple of the tile (padded
    if need be, :func:`_pad_remainders`), so each tile of the fused loop lies
    in one iteration of the outer ones and the regions stay exact boxes. With
    a symbolic inner extent the analyzer cannot see that: the loops before it
    stay separate.
    """
    t = len(loops) - 1
    while t > 0 and isinstance(sch.get(loops[t]).extent, tirx.IntImm):
        t -= 1
    return list(loops[:t]), list(loops[t:])


def _nt_b_rank(sch: s_tir.Schedule, axes: MatmulAxes) -> int:
    """The rank of ``B`` when its last two indices are bare iter vars of roles ``J`` then
    ``K`` (``B[.., j, k]``, the NT layout), else 0."""
    block = sch.get(axes.block)
    region = block.reads[axes.b_read_index].region
    if len(region) < 2:
        return 0
    role_of = {iv.var: role for iv, role in zip(block.iter_vars, axes.roles)}
    last = [role_of.get(rng.min) if isinstance(rng.min, tirx.Var) and
            isinstance(rng.extent, tirx.IntImm) and rng.extent.value == 1 else None
            for rng in region[-2:]]
    return len(region) if last == ["J", "K"] else 0


def _schedule_tiles(sch: s_tir.Schedule, axes: MatmulAxes, cfg: TileConfig, lanes: int,
                    func: Optional[tirx.PrimFunc] = None) -> None:
    """The BLIS-style loop nest on the (already analysed) matmul block.

    With ``func`` (the unscheduled function), a constant ``B`` is packed at compile time
    (:func:`~relax_memplan.schedules.prepack.prepack_constant_b`), not per call.
    """
    block = axes.block
    nr = cfg.columns(lanes)
    if cfg.pad_remainders:
        _pad_remainders(sch, axes, cfg.mr, nr)
    prepacked = (func is not None and cfg.pack_b and not cfg.nr_columns
                 and prepack_constant_b(sch, func, axes, nr))
    padded = [p for p in sch.get_producers(block) if sch.get(p).name_hint.endswith("_pad")]
    groups = _loops_by_role(sch, axes)
    # Several row (or column) loops are fused into one M (N) axis only where the
    # inner extents are constant; with a symbolic inner extent (``seq`` of a
    # ``(batch, seq, K)`` input, padded or not) a tile of the fused axis can
    # straddle two outer iterations as far as the analyzer knows, and the
    # write-back region becomes a loose bounding box (negative and repeated
    # indices: out-of-bounds stores). The outer loops are then kept separate.
    i_sep, i_fused = _split_fusable(sch, groups["I"])
    j_sep, j_fused = _split_fusable(sch, groups["J"])
    sch.reorder(*groups["S"], *j_sep, *i_sep, *i_fused, *j_fused, *groups["K"])
    s = _fuse(sch, groups["S"])
    i = _fuse(sch, i_fused)
    j = _fuse(sch, j_fused)
    k = _fuse(sch, groups["K"])

    if cfg.nr_columns % lanes:  # rows of a box-aligned tile: one vector of nr_columns lanes
        jo, jl = sch.split(j, factors=[None, nr])
        jv = None
    else:
        jo, jv, jl = sch.split(j, factors=[None, nr // lanes, lanes])
    outer = [lp for lp in (s,) if lp is not None] + j_sep
    if i is None:  # one row: the tile is 1 x nr
        io = ii = None
    elif cfg.mc:
        ic, io, ii = sch.split(i, factors=[None, cfg.mc // cfg.mr, cfg.mr])
        outer.append(ic)
    else:
        io, ii = sch.split(i, factors=[None, cfg.mr])
    outer.append(jo)
    # separate row loops run serially inside a task, reusing its packed B panel
    sch.reorder(*outer, *i_sep, *[lp for lp in (io, k, ii, jv) if lp is not None], jl)
    par = sch.fuse(*outer) if len(outer) > 1 else outer[0]
    if cfg.parallel:
        sch.parallel(par)
    tile = io if io is not None else par

    if cfg.pack_b and not prepacked:
        nt_rank = _nt_b_rank(sch, axes)
        packed = sch.cache_read(block, axes.b_read_index, "global")
        if nt_rank:
            # B read B[.., j, k] (NT: a tied LM head, K of attention): the panel is stored
            # k-major, so the micro-kernel's nr columns are one contiguous vector load per
            # k, not a gather of nr rows K apart (GPT-2's 128 x 768 x 50257 LM head:
            # 168 -> 62 ms at 2 threads on rocketlake)
            sch.transform_layout(packed, ("write", 0),
                                 lambda *idx: (*idx[:-2], idx[-1], idx[-2]))
        sch.compute_at(packed, par, preserve_unit_loops=True)
        _vectorize_columns(sch, packed, lanes, cfg.nr_columns)
    for pad in padded:
        # zero-padded copies of A / B: inline into the packing or keep as a parallel copy
        if not _try(sch.compute_inline, pad):
            _parallel_copy(sch, pad, lanes, cfg.parallel)

    # register tile: accumulate in a local mr x nr buffer, write back once
    write_back = sch.cache_write(block, 0, "local")
    sch.reverse_compute_at(write_back, tile, preserve_unit_loops=True)
    _vectorize_columns(sch, write_back, lanes, cfg.nr_columns)
    tail = write_back
    pending = sch.get_consumers(tail)
    while pending:
        consumer = pending.pop(0)
        if _try(sch.reverse_compute_inline, consumer):
            pending = sch.get_consumers(tail)
            continue
        # e.g. an epilogue the write-back cannot absorb: run it per tile, after it
        try:
            sch.reverse_compute_at(consumer, tile, preserve_unit_loops=True)
        except _ScheduleError:
            _parallel_copy(sch, consumer, lanes, cfg.parallel)
            continue
        _vectorize_columns(sch, consumer, lanes, cfg.nr_columns)
        tail = consumer
        pending = sch.get_consumers(tail)

    if ii is not None:
        sch.unroll(ii)
    if jv is not None:
        sch.unroll(jv)
    sch.vectorize(jl)
    init = sch.decompose_reduction(block, k)
    sch.vectorize(sch.get_loops(init)[-1])
    sch.annotate(tile, "pragma_auto_unroll_max_step", cfg.unroll_max_step)
    sch.annotate(tile, "pragma_unroll_explicit", 1)
    _keep_heavy_write_back_rolled(sch, tile, tail)


HEAVY_EPILOGUE_CHARS = 5000
"""A write-back whose statement prints longer than this (characters of TVMScript) is not
unrolled by the tile's ``pragma_auto_unroll_max_step``: magika's tanh-GELU epilogue (9.2k
characters) unrolled 8 times took LLVM 82-93 ms, rolled 50-54 ms, and the kernel runs at the
same speed (650.6 vs 656.0 us best of 7, bit-identical output); gpt2-tiny's (6.0k) 58 -> 41
ms, 91.5 vs 91.4 us. bert-tiny's erf GELU (3.7k) and yolov8n's SiLU (4.1k) stay unrolled
(1-thread timings within 1.6 % but not clearly equal on a loaded machine)."""


def _keep_heavy_write_back_rolled(sch: s_tir.Schedule, tile, tail) -> None:
    """``pragma_auto_unroll_max_step = 0`` on the loop of the write-back ``tail`` just below
    ``tile`` when its epilogue is heavy (:data:`HEAVY_EPILOGUE_CHARS`): TVM's ``UnrollLoop``
    takes the innermost such pragma, so the register tile's loops stay unrolled."""
    if len(sch.get(tail).body.script()) <= HEAVY_EPILOGUE_CHARS:
        return
    loops = [sch.get(lp) for lp in sch.get_loops(tail)]
    below = [k for k, lp in enumerate(loops) if lp.same_as(sch.get(tile))]
    if below and below[0] + 1 < len(loops):
        sch.annotate(sch.get_loops(tail)[below[0] + 1], "pragma_auto_unroll_max_step", 0)


def _vectorize_inner(sch: s_tir.Schedule, block, lanes: int) -> None:
    """Split the innermost loop of ``block`` by ``lanes`` and vectorise it."""
    inner = sch.get_loops(block)[-1]
    _, vec = sch.split(inner, factors=[None, lanes])
    sch.vectorize(vec)


def _vectorize_columns(sch: s_tir.Schedule, block, lanes: int, nr_columns: int) -> None:
    """Vectorise the whole rows of a box-aligned tile as one ``nr_columns``-wide loop.

    The innermost loops of ``block`` whose extents multiply to ``nr_columns`` (rows x
    width of the tile, contiguous in memory) are fused and vectorised; without
    ``nr_columns``, or when they do not multiply to it, as :func:`_vectorize_inner`
    (a 12-wide row split by 16 lanes is a predicated, scalarised loop).
    """
    loops = sch.get_loops(block)
    if nr_columns:
        width, first = 1, len(loops)
        while first > 0 and width < nr_columns:
            extent = sch.get(loops[first - 1]).extent
            if not isinstance(extent, tirx.IntImm):
                break
            width *= int(extent.value)
            first -= 1
        if width == nr_columns:
            sch.vectorize(_fuse(sch, loops[first:]))
            return
    _vectorize_inner(sch, block, lanes)


def _parallel_copy(sch: s_tir.Schedule, block, lanes: int, parallel: bool = True) -> None:
    """A spatial block left at the root: parallel outer loops, vectorised inner loop."""
    loops = sch.get_loops(block)
    if len(loops) > 1 and parallel:
        sch.parallel(sch.fuse(*loops[:-1]))
    _vectorize_inner(sch, block, lanes)
