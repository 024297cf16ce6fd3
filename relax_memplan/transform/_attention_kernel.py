"""The CPU TIR kernel of :class:`~relax_memplan.transform.fuse_attention.FuseAttention`.

Computes a :class:`~relax_memplan.transform._attention_spec.KernelSpec` (``softmax(steps(scale
* q . k)) . v`` with every operand read where the graph has it) in streaming form over blocks
of keys, FlashAttention's recurrence (Dao et al., "FlashAttention: Fast and Memory-Efficient
Exact Attention with IO-Awareness", NeurIPS 2022, Algorithm 1): per query row a running
maximum ``m``, a running sum ``l`` and an unnormalised output ``acc``; for each block of keys,
with ``m'`` the new maximum, ``acc <- acc * exp(m - m') + sum_j exp(s_j - m') v_j`` and ``l <-
l * exp(m - m') + sum_j exp(s_j - m')``; at the end ``out = acc / l``. Only one block of scores
lives at a time (``block_keys`` values per query row of a task), never the (seq, seq) matrix.

Schedule (written in the TIR itself, the function is marked ``tirx.is_scheduled``): parallel
over the leading dims (batch x heads x windows) x blocks of ``block_queries`` query rows. A task
copies its query rows once, scaled and transposed to (head_dim, block_queries), and keeps the
state of the recurrence the same way, so every step is vectorized over the task's query rows.
Each key is read once per task (one scalar per head-dim entry, broadcast over the rows; no
transposed copy of K or V). Register tiles: the scores of 4 keys x the task's rows accumulate
over head_dim in a small local buffer with constant indices once unrolled (LLVM keeps it in
vector registers), and the P V update runs 4 head-dim entries x the rows at a time the same
way. ``exp`` is a polynomial written in the TIR (:func:`fast_exp` below): LLVM turns a vector
``llvm.exp`` into one libm call per lane. Keys past the end of the last block get score -inf
(weight 0) and read the last key; query rows past the end repeat the last row and are not
written. The score steps (bias, masks, casts) are applied to each block of scores as they are
computed, with each operand read at its own index.

Speed: ``benchmarks/attention_bench.py`` (the fused kernel against the kernels it replaces,
by sequence length and head dim, default build and our CPU schedules on the host target).
"""

from __future__ import annotations

from typing import Optional

import tvm
from tvm import tirx
from tvm.script import tirx as T

from ._attention_spec import (KernelSpec, build_prim_func, declare_buffers, float_min,
                              whole_regions)

__all__ = ["attention_kernel", "decline_reason", "tile_variants"]

#: Largest head dim the CPU kernel takes: a task keeps (head_dim x block_queries) query rows
#: and as many accumulators in its local buffers.
MAX_HEAD_DIM = 256


def decline_reason(spec: KernelSpec) -> Optional[str]:
    """Why the CPU kernel is not used for ``spec`` (``None``: it is)."""
    if max(spec.head_dim, spec.value_dim) > MAX_HEAD_DIM:
        return f"head dim {max(spec.head_dim, spec.value_dim)} above {MAX_HEAD_DIM}"
    return None


#: Work (``groups x seq_q x seq_k x (head_dim + value_dim)``) up to which one thread runs the
#: whole kernel with 8 x 8 tiles: below it TVM's parallel launch costs more than it saves
#: (12 heads of 64, host target: seq 8 5-8 us serial vs 10-13 us parallel, seq 16 15 vs 21 us,
#: seq 32 (1.5 M) 47 vs 31 us).
SERIAL_WORK = 1 << 20
#: Query rows per task of the variants for few queries (decoder steps, short inputs): 8 (or
#: 16) lanes instead of 32 rows of which all but a few repeat the last one.
FEW_QUERIES = 8


def tile_variants(spec: KernelSpec, block_keys: int, block_queries: int):
    """[(condition, block_queries, block_keys, parallel)] tried in order, the last one with
    condition ``None`` (else). Conditions are on the run-time shapes; one that the static
    shapes decide is resolved here (a fixed shape gets one variant)."""
    analyzer = tvm.sym.Analyzer()
    work = spec.groups() * spec.seq_q * spec.seq_k * (spec.head_dim + spec.value_dim)
    options = [(work <= SERIAL_WORK, FEW_QUERIES, min(block_keys, FEW_QUERIES), False),
               (spec.seq_q <= FEW_QUERIES, FEW_QUERIES, block_keys, True),
               (spec.seq_q <= 2 * FEW_QUERIES, 2 * FEW_QUERIES, block_keys, True)]
    out = []
    for cond, bq, bk, parallel in options:
        if bq >= block_queries:
            continue
        cond = analyzer.simplify(cond)
        if isinstance(cond, tirx.IntImm):
            if int(cond):
                out.append((None, bq, bk, parallel))
                return out
            continue
        out.append((cond, bq, bk, parallel))
    out.append((None, block_queries, block_keys, True))
    return out


def attention_kernel(spec: KernelSpec, block_keys: int = 32,
                     block_queries: int = 32) -> tirx.PrimFunc:
    """Build the fused attention PrimFunc for the CPU.

    Parameters
    ----------
    spec : KernelSpec
        What to compute and where its operands are.
    block_keys, block_queries : int
        Keys per block of the recurrence; query rows per parallel task. Small problems and
        few queries get smaller tiles (:func:`tile_variants`), chosen at run time where the
        shapes are symbolic.

    Returns
    -------
    tvm.tirx.PrimFunc
        ``(inputs..., params..., out)``, private, marked ``tirx.is_scheduled``.
    """
    bufs, out = declare_buffers(spec)
    variants = tile_variants(spec, block_keys, block_queries)
    runs = [_variant(spec, bufs, out, bq, bk, parallel) for _, bq, bk, parallel in variants]
    conds = [c for c, *_ in variants]
    n = len(runs)
    r0, r1, r2, r3 = (runs + [None] * 3)[:4]
    c0, c1, c2 = (conds + [None] * 2)[:3]

    @T.prim_func(private=True, s_tir=True, check_well_formed=False)
    def attention():
        if n == 1:
            r0()
        elif n == 2:
            if c0:
                r0()
            else:
                r1()
        elif n == 3:
            if c0:
                r0()
            elif c1:
                r1()
            else:
                r2()
        else:
            if c0:
                r0()
            elif c1:
                r1()
            elif c2:
                r2()
            else:
                r3()

    return build_prim_func(spec, attention, bufs, out)


def _variant(spec: KernelSpec, bufs, out, BQ: int, BK: int, parallel: bool):
    """The kernel's loop nest with ``BQ`` query rows and ``BK`` keys per tile, as a macro."""
    D, E = spec.head_dim, spec.value_dim
    KU = next(u for u in (4, 2, 1) if BK % u == 0)  # keys per register tile (scores)
    EU = next(u for u in (4, 2, 1) if E % u == 0)  # value entries per register tile (P V)
    acc_t = "float32"
    scale_c = float(spec.scale)
    lowest, neg_inf = float_min, float("-inf")
    sq, sk = spec.seq_q, spec.seq_k
    nqb = (sq + BQ - 1) // BQ
    tasks = spec.groups() * nqb
    reads, writes = whole_regions(bufs), whole_regions([out])
    guard = spec.guard

    def lead(task):
        return spec.lead_values(task // nqb)

    def q_at(task, row, d):
        return spec.value_of(bufs, spec.q, lead(task), i=row, d=d)

    def k_at(task, key, d):
        return spec.value_of(bufs, spec.k, lead(task), j=key, d=d)

    def v_at(task, key, e):
        return spec.value_of(bufs, spec.v, lead(task), j=key, e=e)

    def score(task, s, row, key):
        return spec.epilogue(bufs, s, lead(task), row, key)

    def out_index(task, row, e):
        return spec.out_index(lead(task), row, e)

    @T.macro
    def fast_exp(buf, i, j, t):
        # buf[i, j] = exp(buf[i, j]) in vector-friendly form (LLVM turns a vector exp into one
        # libm call per lane): 2^n * p(r), n = round(x / ln 2), r = x - n ln 2 (ln 2 split in
        # two for exactness), p Cephes' degree-7 polynomial for expf (S. Moshier, Cephes
        # Mathematical Library, expf.c), relative error ~1e-7; x < -87 (exp underflows,
        # also -inf) gives 0. n and r go through the scratch buffer t (2, BQ): a let binding
        # inside a vectorized loop computes wrong values in TVM 0.27.
        t[0, j] = T.floor(T.max(buf[i, j], T.float32(-87.0)) * T.float32(1.44269504088896341)
                          + T.float32(0.5))
        t[1, j] = (T.max(buf[i, j], T.float32(-87.0)) - t[0, j] * T.float32(0.693359375)
                   + t[0, j] * T.float32(2.12194440e-4))
        buf[i, j] = T.Select(
            buf[i, j] < T.float32(-87.0), T.float32(0),
            ((((((T.float32(1.9875691500e-4) * t[1, j] + T.float32(1.3981999507e-3)) * t[1, j]
                 + T.float32(8.3334519073e-3)) * t[1, j] + T.float32(4.1665795894e-2)) * t[1, j]
               + T.float32(1.6666665459e-1)) * t[1, j] + T.float32(5.0000001201e-1))
             * t[1, j] * t[1, j] + t[1, j] + T.float32(1))
            * T.reinterpret("float32", T.shift_left(T.Cast("int32", t[0, j]) + 127, 23)))

    @T.macro
    def scores(sc, qt, reg, task, q0, kb):
        # sc[j, :] = steps(q . k_j) for the block's BQ query rows (vector over rows), one
        # scalar of k per head-dim entry broadcast over the rows; KU keys at a time accumulate
        # in registers (reg: constant indices once unrolled)
        for j0 in range(BK // KU):
            for jj in T.unroll(KU):
                for qi in T.vectorized(BQ):
                    reg[jj, qi] = T.float32(0)
            for d in range(D):
                for jj in T.unroll(KU):
                    for qi in T.vectorized(BQ):
                        reg[jj, qi] = reg[jj, qi] + k_at(
                            task, T.min(kb * BK + j0 * KU + jj, sk - 1), d) * qt[d, qi]
            # keys past the end get -inf (weight 0 even when every real key is masked to lowest)
            for jj in T.unroll(KU):
                for qi in T.vectorized(BQ):
                    sc[j0 * KU + jj, qi] = T.Select(
                        kb * BK + j0 * KU + jj < sk,
                        score(task, reg[jj, qi], T.min(q0 + qi, sq - 1),
                              T.min(kb * BK + j0 * KU + jj, sk - 1)),
                        T.float32(neg_inf))

    @T.macro
    def update_output(acc, reg, sc, stat, task, kb):
        # acc[e, :] = acc[e, :] * alpha + sum_j p_j v_j[e], EU value entries at a time in
        # registers; keys past the end have weight 0 and read the last key's (finite) values
        for e0 in range(E // EU):
            for ee in T.unroll(EU):
                for qi in T.vectorized(BQ):
                    reg[ee, qi] = acc[e0 * EU + ee, qi] * stat[3, qi]
            for j in range(BK):
                for ee in T.unroll(EU):
                    for qi in T.vectorized(BQ):
                        reg[ee, qi] = reg[ee, qi] + v_at(
                            task, T.min(kb * BK + j, sk - 1), e0 * EU + ee) * sc[j, qi]
            for ee in T.unroll(EU):
                for qi in T.vectorized(BQ):
                    acc[e0 * EU + ee, qi] = reg[ee, qi]

    @T.macro
    def run():
        for task in (T.parallel(tasks) if parallel else T.serial(tasks)):
            with T.sblock("attention"):
                T.reads(reads)
                T.writes(writes)
                qt = T.alloc_buffer((D, BQ), acc_t, scope="local")  # the task's rows, transposed
                sc = T.alloc_buffer((BK, BQ), acc_t, scope="local")  # scores of a block of keys
                acc = T.alloc_buffer((E, BQ), acc_t, scope="local")  # unnormalised output
                stat = T.alloc_buffer((4, BQ), acc_t, scope="local")  # m, l, new m, alpha
                reg = T.alloc_buffer((max(KU, EU), BQ), acc_t, scope="local")  # register tile
                tmp = T.alloc_buffer((2, BQ), acc_t, scope="local")  # scratch of fast_exp
                q0 = task % nqb * BQ
                for d in range(D):
                    for qi in range(BQ):  # rows past the end repeat the last one (not written)
                        qt[d, qi] = q_at(task, T.min(q0 + qi, sq - 1), d) * T.float32(scale_c)
                for qi in T.vectorized(BQ):
                    stat[0, qi] = T.float32(lowest)
                for qi in T.vectorized(BQ):
                    stat[1, qi] = T.float32(0)
                for e in range(E):
                    for qi in T.vectorized(BQ):
                        acc[e, qi] = T.float32(0)
                for kb in range((sk + BK - 1) // BK):
                    scores(sc, qt, reg, task, q0, kb)
                    for qi in T.vectorized(BQ):
                        stat[2, qi] = stat[0, qi]
                    for j in range(BK):
                        for qi in T.vectorized(BQ):
                            stat[2, qi] = T.max(stat[2, qi], sc[j, qi])
                    for j in range(BK):
                        for qi in T.vectorized(BQ):
                            sc[j, qi] = sc[j, qi] - stat[2, qi]
                            fast_exp(sc, j, qi, tmp)
                    for qi in T.vectorized(BQ):
                        stat[3, qi] = stat[0, qi] - stat[2, qi]
                        fast_exp(stat, 3, qi, tmp)
                    for qi in T.vectorized(BQ):
                        stat[1, qi] = stat[1, qi] * stat[3, qi]
                    for qi in T.vectorized(BQ):
                        stat[0, qi] = stat[2, qi]
                    for j in range(BK):
                        for qi in T.vectorized(BQ):
                            stat[1, qi] = stat[1, qi] + sc[j, qi]
                    update_output(acc, reg, sc, stat, task, kb)
                for qi in range(BQ):
                    if q0 + qi < sq:
                        for e in range(E):
                            T.buffer_store(out, T.Cast(spec.out_dtype, _normalized(
                                acc[e, qi], stat[1, qi], guard)), out_index(task, q0 + qi, e))

    return run



def _normalized(acc, total, guard: bool):
    """``acc / total``; with ``guard`` 0 where ``total`` is 0 (no key with a finite score)."""
    if guard:
        return tirx.Select(total > tirx.FloatImm("float32", 0.0), acc / total,
                           tirx.FloatImm("float32", 0.0))
    return acc / total
