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

The loop nest itself is in :mod:`._matmul_nest`; this module holds the rules.

Kernel workspaces: the packed ``B`` panel (``K x nr`` floats per parallel
task, e.g. 48 KiB at K=768, AVX2) is allocated by the kernel at run time
(``TVMBackendAllocWorkspace``), invisible to Relax memory planning.
"""

from __future__ import annotations

from dataclasses import replace
from typing import Optional

from tvm import s_tir, tirx
from tvm.s_tir.dlight import ScheduleRule
from tvm.target import Target

from ._clamp_pad import clamp_padded_reads
from ._matmul_nest import (  # noqa: F401 -- _box_aligned, _has_fma, _try: used by cpu_conv
    TileConfig, _box_aligned, _has_fma, _product, _schedule_tiles, _try, simd_lanes)
from .analysis import MatmulAxes, match_matmul
from .prepack import _b_dims, _is_layout_free_param

__all__ = ["TileConfig", "StaticMatmul", "GenericMatmul", "simd_lanes"]

_ScheduleError = s_tir.ScheduleError
"""Raised by a schedule primitive whose precondition fails (also used by cpu_fallback)."""


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

    def adapt_to_operands(self, cfg: TileConfig, sch: s_tir.Schedule, axes: MatmulAxes,
                          func: tirx.PrimFunc, lanes: int) -> TileConfig:
        """``cfg`` adjusted to the operands once the producers are inlined (default: as is)."""
        return cfg

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
            cfg = self.adapt_to_operands(cfg, sch, axes, func, lanes)
            _schedule_tiles(sch, axes, cfg, lanes, func if self.prepack_weights else None)
        except _ScheduleError:
            # a primitive's precondition failed on an unusual variant: leave it unscheduled
            return None
        if not cfg.pad_remainders:
            return sch
        # the padded rows/columns are discarded by the guarded write-back: read them clamped
        clamped = clamp_padded_reads(sch.mod["main"], operands)
        return sch if clamped.same_as(sch.mod["main"]) else s_tir.Schedule(clamped)


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
    unroll_max_step : int
        ``pragma_auto_unroll_max_step`` of the tile loop: TVM's ``UnrollLoop`` fully
        unrolls a loop nested in it when extent x statements of its body is at most
        this. It was 256 (commit 061771c, no reason given); at 256 a one-row tile
        unrolled its 256-long loops (mnist's 1x256x10 kernel: 0.45-0.7 s of LLVM, the
        model's whole build 0.73 s), at 64 that kernel builds in 0.03 s. Every other
        matmul kernel of the shared models runs within noise at 64
        (``benchmarks/unroll_bench.py``).
    gemv_in_place : bool
        For a one-row matmul (``batch * M == 1``: a matrix-vector product) whose ``B``
        is read ``B[k, j]`` and not prepacked at compile time, read ``B`` in place
        (no per-call panel packing, remainder columns predicated instead of padded):
        each element of ``B`` is read once per call, so a per-call packed or padded
        copy only doubles the traffic (mnist's 1x256x10: 1.3-1.6 us -> 0.5 us).
    """

    def __init__(
        self,
        tiles_fma=((4, 3), (6, 2), (3, 4), (4, 2), (2, 4), (8, 1)),
        tiles_no_fma=((4, 2), (2, 4), (8, 1), (2, 3), (3, 2)),
        min_parallel_macs: int = 1 << 20,
        unroll_max_step: int = 64,
        gemv_in_place: bool = True,
    ):
        self.tiles_fma = tuple(tiles_fma)
        self.tiles_no_fma = tuple(tiles_no_fma)
        self.min_parallel_macs = min_parallel_macs
        self.unroll_max_step = unroll_max_step
        self.gemv_in_place = gemv_in_place

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
                              unroll_max_step=self.unroll_max_step, parallel=parallel,
                              nr_columns=rows)
        if best is None:  # pad the columns: the tile wasting the fewest (55 wide: 64, not 96)
            best = min(tiles, key=lambda t: (-(-n // (t[1] * lanes)) * t[1], m % t[0] != 0))
            # unless the preferred (larger) tiles waste almost nothing as well: 50257 columns
            # pad to 50304 with 48-wide tiles, 0.1 % more, for 12 accumulators instead of 8
            waste = lambda t: -(-n // (t[1] * lanes)) * t[1] * lanes / n - 1  # noqa: E731
            best = next((t for t in tiles if waste(t) <= 0.02 and m % t[0] == 0), best)
        mr, vecs = best
        return TileConfig(mr=min(mr, m), nr_vectors=vecs, mc=0, pack_b=True,
                          unroll_max_step=self.unroll_max_step, parallel=parallel)

    def adapt_to_operands(self, cfg, sch, axes, func, lanes):
        """No per-call packing or padding of ``B`` in a one-row matmul (``gemv_in_place``)."""
        if (not self.gemv_in_place or cfg.nr_columns or not cfg.pack_b
                or _product(axes.s_extents + axes.i_extents) != 1):
            return cfg
        dims = _b_dims(sch, axes)
        if dims is None or dims != (1, 0):  # B[j, k] (NT): packing gives it unit stride
            return cfg
        b = sch.get(axes.block).reads[axes.b_read_index].source
        n = b.shape[dims[0]]
        if (self.prepack_weights and _is_layout_free_param(func, b)
                and isinstance(n, tirx.IntImm) and n.value % cfg.columns(lanes) == 0):
            return cfg  # prepack_constant_b packs it at compile time: free per call
        return replace(cfg, pack_b=False, pad_remainders=False)


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
    wide_nr_vectors : int
        With FMA and a constant column extent that is a multiple of
        ``wide_nr_vectors`` vectors, the tile is that many vectors wide (12
        accumulators at ``mr = 4``, :class:`StaticMatmul`'s first FMA tile) instead of
        ``config.nr_vectors``. The generic body of a kernel that
        :class:`~relax_memplan.transform.specialize_kernels.SpecializeKernels` made
        dispatching then packs a constant weight in the same ``(N / nr, K, nr)`` panels
        as its bucket versions, so all of them read one weight prepacked at compile time.
        ``0`` keeps ``config.nr_vectors`` everywhere.
    """

    def __init__(self, config: TileConfig = TileConfig(mr=4, nr_vectors=2, mc=0, pack_b=True),
                 wide_nr_vectors: int = 3):
        self.config = config
        self.wide_nr_vectors = wide_nr_vectors

    def choose_config(self, axes, lanes, target):
        n = axes.j_extents[-1]
        wide = self.wide_nr_vectors
        cfg = self.config
        if (wide and isinstance(n, int) and n % (wide * lanes) == 0 and _has_fma(target)
                and self.config.nr_vectors != wide and not self.config.nr_columns):
            cfg = replace(self.config, nr_vectors=wide)
        if len(axes.j_extents) > 1 and not (isinstance(n, int) and n % cfg.columns(lanes) == 0):
            # several column loops (a 1x1 convolution's N x H x W map) fused and split by a
            # tile that straddles rows of W: the staged copy and the write-back get regions
            # one vector wide without a guard on W, and write past the output (a fuzzed
            # N x 3 x 8 x 8 conv: wrong values and a corrupted heap). StaticMatmul's
            # box-aligned tiles cover such maps at fixed shapes; here the rule declines.
            return None
        return cfg
