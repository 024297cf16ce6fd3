"""Dlight-style CPU (llvm) schedule rules for matmul, batch-matmul and dense.

Where it runs
-------------
After ``FuseTIR`` at the end of the ``legalize`` phase (see
:func:`relax_memplan.schedules.cpu_schedule_pass`), on PrimFuncs made by
LegalizeOps of ``relax.matmul`` / ``relax.linear`` and of ONNX ``MatMul`` /
``Gemm`` (NN and NT layouts, batched or not), with the producers (transpose,
cast) and epilogues (bias add, relu, gelu...) that FuseOps/FuseTIR put in the
same PrimFunc. Functions carrying ``tirx.is_scheduled`` are skipped by
``ApplyDefaultSchedule`` and marked with it once scheduled.

Algorithm
---------
The GotoBLAS/BLIS decomposition (Goto & van de Geijn, "Anatomy of
high-performance matrix multiplication", TOMS 2008; Van Zee & van de Geijn,
"BLIS", TOMS 2015), expressed with TensorIR schedule primitives as in TVM's
"How to optimize GEMM on CPU" tutorial:

* the column axis ``J`` is split into ``nr``-wide panels, and the row axis
  ``I`` into ``mr``-high micro-tiles; an ``mr x nr`` accumulator tile is kept
  in registers (``cache_write`` to a ``local`` buffer, inner loops unrolled and
  the ``nr`` axis vectorised with the target's SIMD width) while the full
  ``K`` reduction streams through it -- the BLIS micro-kernel;
* for each column panel, the ``K x nr`` slice of ``B`` is packed contiguously
  (``cache_read`` + ``compute_at``; BLIS's packed ``B`` micro-panel), which
  also turns the strided NT (``B[j, k]``) layout into unit stride;
* batch and panel loops are fused and parallelised (one panel per task),
  unless the matmul has fewer than ``min_parallel_macs`` multiply-adds
  (silero-vad's small matmuls: at 2 threads the parallel launches made the
  model 2.6 ms, serially 0.2 ms), when everything runs serially;
* the epilogue is ``reverse_compute_inline``-d into the write-back of the
  tile, so bias/activation run on data still in cache.

Two rules share that skeleton:

* :class:`StaticMatmul` -- every loop extent is a constant (also after
  ``PrimFunc.specialize`` / ``BindSymbolicVars`` of a shape var): the
  register tile is chosen to divide the extents (no remainder code) and, with
  FMA, uses 12 accumulators;
* :class:`GenericMatmul` -- some extents symbolic (``M = batch * seq``):
  one fixed 4 x 2-vector tile; rows/columns not provably divisible are
  ``pad_einsum``-ed (the micro-kernel reads ``A`` through a zero-filling
  select, the write-back is guarded), so every extent, 1 included, is correct.

Kernel workspaces: the packed ``B`` panel (``K x nr`` floats per parallel
task, e.g. 48 KiB at K=768, AVX2) is allocated by the kernel at run time
(``TVMBackendAllocWorkspace``), invisible to Relax memory planning.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import List, Optional

import tvm
from tvm import DataType, s_tir, tirx
from tvm.s_tir.dlight import ScheduleRule
from tvm.target import Target
from tvm.target.codegen import llvm_cpu_has_features

from .analysis import MatmulAxes, match_matmul
from ._clamp_pad import clamp_padded_reads
from .prepack import prepack_constant_b

__all__ = ["TileConfig", "StaticMatmul", "GenericMatmul", "simd_lanes"]

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


def _inline_neighbours(sch: s_tir.Schedule, axes: MatmulAxes) -> None:
    """Inline spatial producers into the matmul and epilogue intermediates forward."""
    for info in axes.producers:
        _try(sch.compute_inline, info.block_rv)
    # all but the last epilogue block: the last one writes the function output
    for info in axes.consumers[:-1]:
        _try(sch.compute_inline, info.block_rv)


def _out_dtype(sch: s_tir.Schedule, block) -> str:
    return str(sch.get(block).writes[0].source.dtype)


class _CPUMatmulBase(ScheduleRule):
    """Shared skeleton of the two rules; subclasses pick the tiles.

    ``prepack_weights``: a constant ``B`` (``layout_free_buffers``) is given the panel
    layout at compile time (:mod:`relax_memplan.schedules.prepack`) instead of packed on
    every call.
    """

    prepack_weights: bool = True

    def is_target_available(self, target: Target) -> bool:
        return target is not None and target.kind.name == "llvm"

    def choose_config(self, axes: MatmulAxes, lanes: int, target: Target) -> Optional[TileConfig]:
        """Tile sizes for this matmul, or ``None`` when the rule does not apply."""
        raise NotImplementedError

    def apply(self, func: tirx.PrimFunc, target: Target, _tunable: bool):
        if not isinstance(func, tirx.PrimFunc) or not self.is_target_available(target):
            return None
        sch = s_tir.Schedule(func)
        axes = match_matmul(sch)
        if axes is None:
            return None
        lanes = simd_lanes(target, _out_dtype(sch, axes.block))
        cfg = self.choose_config(axes, lanes, target)
        if cfg is None:
            return None
        operands = [region.source for k, region in enumerate(sch.get(axes.block).reads)]
        try:
            _inline_neighbours(sch, axes)
            _schedule_tiles(sch, axes, cfg, lanes, func if self.prepack_weights else None)
        except _ScheduleError:
            # a primitive's precondition failed on an unusual variant: leave it unscheduled
            return None
        if not cfg.pad_remainders:
            return sch
        # the padded rows/columns are discarded by the guarded write-back: read them clamped
        clamped = clamp_padded_reads(sch.mod["main"], operands)
        return sch if clamped.same_as(sch.mod["main"]) else s_tir.Schedule(clamped)


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
        packed = sch.cache_read(block, axes.b_read_index, "global")
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


class StaticMatmul(_CPUMatmulBase):
    """Matmul rule for constant extents: a register tile chosen for the shape.

    Applies only when every loop extent of the matmul block is an ``IntImm``
    (a specialised copy of a symbolic kernel qualifies). The first
    ``(mr, nr_vectors)`` of the preference list that divides the innermost
    row and column extents (``seq``, not ``batch * seq``, for a 3-D input) is
    used, so the micro-kernel has no remainder; otherwise remainders are
    padded. With FMA the tile may use 12 accumulator registers (BLIS's
    Haswell kernel keeps 12 of 16), without FMA (plain x86-64 SSE2) 8, since
    each multiply-add needs a temporary register.

    Parameters
    ----------
    tiles_fma, tiles_no_fma : tuple of (int, int)
        ``(mr, nr_vectors)`` preferences, best first.
    min_parallel_macs : int
        Fewest multiply-adds (``batch * M * N * K``) for the panel loop to be
        parallel; below it the kernel runs serially (as :class:`DirectConv`'s
        threshold of the same name).
    """

    def __init__(
        self,
        tiles_fma=((4, 3), (6, 2), (3, 4), (4, 2), (2, 4), (8, 1)),
        tiles_no_fma=((4, 2), (2, 4), (8, 1), (2, 3), (3, 2)),
        min_parallel_macs: int = 1 << 20,
    ):
        self.tiles_fma = tuple(tiles_fma)
        self.tiles_no_fma = tuple(tiles_no_fma)
        self.min_parallel_macs = min_parallel_macs

    def choose_config(self, axes, lanes, target):
        if not axes.all_static():
            return None
        # the innermost row/column loop must divide the tile (see _pad_remainders)
        m = axes.i_extents[-1] if axes.i_extents else 1
        n = axes.j_extents[-1]
        tiles = self.tiles_fma if _has_fma(target) else self.tiles_no_fma
        best = next(((mr, v) for mr, v in tiles if m % mr == 0 and n % (v * lanes) == 0), None)
        if best is None:
            best = next(((mr, v) for mr, v in tiles if n % (v * lanes) == 0), None)
        macs = _product(axes.s_extents + axes.i_extents + axes.j_extents + axes.k_extents)
        parallel = macs >= self.min_parallel_macs
        budget = max(mr * v for mr, v in tiles)
        rows = _row_tile(axes.j_extents, lanes, budget // 2) if best is None else 0
        if rows:
            vecs = -(-rows // lanes)
            fits = [mr for mr, _ in tiles if mr * vecs <= budget] or [1]
            mr = max((r for r in fits if m % r == 0), default=max(fits))
            return TileConfig(mr=min(mr, m), nr_vectors=vecs, mc=0, pack_b=True,
                              unroll_max_step=256, parallel=parallel, nr_columns=rows)
        if best is None:  # pad the columns: the tile wasting the fewest (55 wide: 64, not 96)
            best = min(tiles, key=lambda t: (-(-n // (t[1] * lanes)) * t[1], m % t[0] != 0))
        mr, vecs = best
        return TileConfig(mr=min(mr, m), nr_vectors=vecs, mc=0, pack_b=True,
                          unroll_max_step=256, parallel=parallel)


def _row_tile(j_extents, lanes: int, max_vectors: int) -> int:
    """Columns of a box-aligned register tile over several constant column loops, or 0.

    For ``J = (.., H, W)`` (a 1x1 convolution's output map) with ``W`` not a multiple of
    one vector: ``t * W`` whole rows (``t`` dividing ``H``) with the best lane use, the
    widest among equals (12-wide rows on 16 lanes: 48 = 4 rows in 3 full vectors, instead
    of each row padded to 48). The width is whole vectors, or less than one vector: LLVM
    scalarises a loop-carried accumulator of a wider odd width through the stack
    (``<27 x float>``, ``<48 x float>``: 10-20x slower, measured on znver4).
    Returns 0 when ``J`` is one loop or nothing fits.
    """
    if len(j_extents) < 2 or not all(isinstance(e, int) for e in j_extents[-2:]):
        return 0
    height, width = j_extents[-2], j_extents[-1]
    options = [t * width for t in range(1, height + 1)
               if height % t == 0 and t * width <= max_vectors * lanes
               and (t * width % lanes == 0 or t * width < lanes)]
    if not options:
        return 0
    return max(options, key=lambda nr: (nr / (-(-nr // lanes) * lanes), nr))


class GenericMatmul(_CPUMatmulBase):
    """Matmul rule for symbolic extents: fixed tiles with guarded remainders.

    Parameters
    ----------
    config : TileConfig
        The fixed tiles; splits are by factor, so any extent (1 included) is
        handled by the predicates TVM inserts. The work is not known when
        compiling, so the panel loop stays parallel (``config.parallel``);
        a copy specialised to a shape (``schedule_prim_func``) gets
        :class:`StaticMatmul`'s threshold.
    """

    def __init__(self, config: TileConfig = TileConfig(mr=4, nr_vectors=2, mc=0, pack_b=True)):
        self.config = config

    def choose_config(self, axes, lanes, target):
        return self.config
