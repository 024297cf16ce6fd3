"""The CPU TIR kernel of :class:`~relax_memplan.transform.fuse_attention.FuseAttention`.

``out[b, i, h, :] = softmax_j(scale * q[b, i, h, :] . k[b, j, h, :] + mask[b?, h?, i?, j]) @ v``
computed in streaming form over blocks of keys, FlashAttention's recurrence (Dao et al.,
"FlashAttention: Fast and Memory-Efficient Exact Attention with IO-Awareness", NeurIPS 2022,
Algorithm 1): per query row a running maximum ``m``, a running sum ``l`` and an unnormalised
output ``acc``; for each block of keys, with ``m'`` the new maximum,
``acc <- acc * exp(m - m') + sum_j exp(s_j - m') v_j`` and ``l <- l * exp(m - m') + sum_j
exp(s_j - m')``; at the end ``out = acc / l``. Only one block of scores lives at a time
(``block_keys`` values per thread), never the (seq, seq) matrix.

Layout: q, k, v and out are (batch, seq, heads, head_dim), the layout of the projections
before the importer's transposes, so those transposes disappear. The mask, when given, is a
4-d additive mask whose batch, head and query dims may be 1 (broadcast). Batch and the
sequence lengths are symbolic; heads and head_dim are static.

Schedule (written in the TIR itself, the function is marked ``tirx.is_scheduled``): parallel
over batch x heads x blocks of ``block_queries`` query rows. A task copies its query rows once,
transposed to (head_dim, block_queries), and keeps the state of the recurrence the same way, so
every step is vectorized over the task's query rows. Each key is read once per task in its
natural layout (contiguous over head_dim; no transposed copy of K or V). Register tiles: the
scores of 4 keys x the task's rows accumulate over head_dim in a small local buffer with
constant indices once unrolled (LLVM keeps it in vector registers: 8 independent FMA chains
with 2 AVX-512 vectors per key), and the P V update runs 4 head-dim entries x the rows at a
time the same way. ``exp`` is a polynomial written in the TIR (:func:`fast_exp` below): LLVM
turns a vector ``llvm.exp`` into one libm call per lane. Keys past the end of the last block
get score -inf (weight 0) and read the last key; query rows past the end repeat the last row
and are not written.

Speed (``benchmarks/attention_bench.py``, BERT-base shapes: batch 8, 12 heads, head_dim 64,
mask (8, 1, 1, seq); shared 2-core znver4 machine, TVM on 1 thread): fused kernel / the
three kernels it replaces (QK^T matmul with scale and mask, softmax, PV matmul) = 0.70-0.74,
0.40-0.48, 0.41-0.47, 0.39 at seq 32, 128, 256, 512 with ``schedule=True`` on the host target
(2-5 runs; 512 one run; one outlier of 3.6 at seq 32 under heavy load), and 0.04-0.25 with
the default build (unscheduled matmuls). Before the register
tiles and the polynomial exp the same kernel took 1.06-1.27x at seq 32-128 (scheduled).
"""

from __future__ import annotations

from typing import Optional, Tuple

import numpy as np
from tvm import tirx
from tvm.script import tirx as T

__all__ = ["attention_kernel", "attention_prim_func"]


def attention_kernel(heads: int, head_dim: int, dtype: str, scale: float,
                     mask_broadcast: Optional[Tuple[bool, bool, bool]],
                     block_keys: int = 32, block_queries: int = 32) -> tirx.PrimFunc:
    """Build the fused attention PrimFunc.

    Parameters
    ----------
    heads, head_dim : int
        Static number of heads and size of a head.
    dtype : str
        Element type of q, k, v, mask and out (float32 or float16; accumulation in float32).
    scale : float
        Multiplies ``q . k`` before the mask is added.
    mask_broadcast : (bool, bool, bool) or None
        ``None``: no mask argument. Else, for the mask's batch, head and query dims, whether
        that dim is 1 (broadcast) rather than the full extent.
    block_keys, block_queries : int
        Keys per block of the recurrence; query rows per parallel task.

    Returns
    -------
    tvm.tirx.PrimFunc
        ``(q, k, v[, mask], out)``, private, marked ``tirx.is_scheduled``.
    """
    H, D, BK, BQ = heads, head_dim, block_keys, block_queries
    KU = next(u for u in (4, 2, 1) if BK % u == 0)  # keys per register tile (scores)
    DU = next(u for u in (4, 2, 1) if D % u == 0)  # head-dim entries per register tile (P V)
    acc_t = "float32"
    scale_c = float(scale)
    lowest = float(np.finfo(np.float32).min)
    neg_inf = float("-inf")
    b = tirx.Var("batch", "int64")
    sq = tirx.Var("seq_q", "int64")
    sk = tirx.Var("seq_k", "int64")
    one = tirx.IntImm("int64", 1)
    has_mask = mask_broadcast is not None
    mb, mh, mq = mask_broadcast if has_mask else (True, True, True)
    mask_shape = (one if mb else b, one if mh else tirx.IntImm("int64", H),
                  one if mq else sq, sk)

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
    def scores(sc, qt, reg, K, M, bi, hi, q0, kb):
        # sc[j, :] = scale * q . k_j + mask for the block's BQ query rows (vector over rows),
        # K read in its natural layout (one key row, contiguous over head_dim); KU keys at a
        # time accumulate in registers (reg: constant indices once unrolled)
        for j0 in range(BK // KU):
            for jj in T.unroll(KU):
                for qi in T.vectorized(BQ):
                    reg[jj, qi] = T.float32(0)
            for d in range(D):
                for jj in T.unroll(KU):
                    for qi in T.vectorized(BQ):
                        reg[jj, qi] = reg[jj, qi] + T.Cast(
                            acc_t, K[bi, T.min(kb * BK + j0 * KU + jj, sk - 1), hi, d]) * qt[d, qi]
            # keys past the end get -inf (weight 0 even when every real key is masked to lowest)
            for jj in T.unroll(KU):
                for qi in T.vectorized(BQ):
                    if has_mask:
                        sc[j0 * KU + jj, qi] = T.Select(
                            kb * BK + j0 * KU + jj < sk, reg[jj, qi] * T.float32(scale_c) + T.Cast(
                                acc_t, M[0 if mb else bi, 0 if mh else hi,
                                         0 if mq else T.min(q0 + qi, sq - 1),
                                         T.min(kb * BK + j0 * KU + jj, sk - 1)]),
                            T.float32(neg_inf))
                    else:
                        sc[j0 * KU + jj, qi] = T.Select(kb * BK + j0 * KU + jj < sk,
                                                        reg[jj, qi] * T.float32(scale_c),
                                                        T.float32(neg_inf))

    @T.macro
    def update_output(acc, reg, sc, stat, V, bi, hi, kb):
        # acc[d, :] = acc[d, :] * alpha + sum_j p_j v_j[d], DU head-dim entries at a time in
        # registers; keys past the end have weight 0 and read the last key's (finite) values
        for d0 in range(D // DU):
            for dd in T.unroll(DU):
                for qi in T.vectorized(BQ):
                    reg[dd, qi] = acc[d0 * DU + dd, qi] * stat[3, qi]
            for j in range(BK):
                for dd in T.unroll(DU):
                    for qi in T.vectorized(BQ):
                        reg[dd, qi] = reg[dd, qi] + T.Cast(
                            acc_t, V[bi, T.min(kb * BK + j, sk - 1), hi, d0 * DU + dd]) * sc[j, qi]
            for dd in T.unroll(DU):
                for qi in T.vectorized(BQ):
                    acc[d0 * DU + dd, qi] = reg[dd, qi]

    @T.macro
    def body(Q, K, V, M, O):
        for task in T.parallel(b * H * T.ceildiv(sq, BQ)):
            with T.sblock("attention"):
                T.reads(Q[0:b, 0:sq, 0:H, 0:D], K[0:b, 0:sk, 0:H, 0:D], V[0:b, 0:sk, 0:H, 0:D])
                T.writes(O[0:b, 0:sq, 0:H, 0:D])
                qt = T.alloc_buffer((D, BQ), acc_t, scope="local")  # the task's rows, transposed
                sc = T.alloc_buffer((BK, BQ), acc_t, scope="local")  # scores of a block of keys
                acc = T.alloc_buffer((D, BQ), acc_t, scope="local")  # unnormalised output
                stat = T.alloc_buffer((4, BQ), acc_t, scope="local")  # m, l, new m, alpha
                reg = T.alloc_buffer((max(KU, DU), BQ), acc_t, scope="local")  # register tile
                tmp = T.alloc_buffer((2, BQ), acc_t, scope="local")  # scratch of fast_exp
                bi = task // (H * T.ceildiv(sq, BQ))
                hi = task // T.ceildiv(sq, BQ) % H
                q0 = task % T.ceildiv(sq, BQ) * BQ
                for d in range(D):
                    for qi in range(BQ):  # rows past the end repeat the last one (not written)
                        qt[d, qi] = T.Cast(acc_t, Q[bi, T.min(q0 + qi, sq - 1), hi, d])
                for qi in T.vectorized(BQ):
                    stat[0, qi] = T.float32(lowest)
                for qi in T.vectorized(BQ):
                    stat[1, qi] = T.float32(0)
                for d in range(D):
                    for qi in T.vectorized(BQ):
                        acc[d, qi] = T.float32(0)
                for kb in range(T.ceildiv(sk, BK)):
                    scores(sc, qt, reg, K, M, bi, hi, q0, kb)
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
                    update_output(acc, reg, sc, stat, V, bi, hi, kb)
                for qi in range(BQ):
                    if q0 + qi < sq:
                        for d in range(D):
                            O[bi, q0 + qi, hi, d] = T.Cast(dtype, acc[d, qi] / stat[1, qi])

    return attention_prim_func(body, dtype, H, D, (b, sq, sk), mask_shape if has_mask else None)


def attention_prim_func(body, dtype: str, heads: int, head_dim: int, dims,
                        mask_shape) -> tirx.PrimFunc:
    """The PrimFunc ``(q, k, v[, mask], out)`` around the macro ``body(Q, K, V, M, O)``.

    Shared by the CPU and CUDA kernels: q and out are (batch, seq_q, heads, head_dim), k and
    v (batch, seq_k, heads, head_dim) with ``dims = (batch, seq_q, seq_k)``; the mask argument
    exists when ``mask_shape`` is given. Private, marked ``tirx.noalias`` and
    ``tirx.is_scheduled``.
    """
    H, D = heads, head_dim
    b, sq, sk = dims
    if mask_shape is not None:
        @T.prim_func(private=True, s_tir=True)
        def attention(q: T.handle, k: T.handle, v: T.handle, mask: T.handle, out: T.handle):
            T.func_attr({"tirx.noalias": True, "tirx.is_scheduled": True})
            Q = T.match_buffer(q, (b, sq, H, D), dtype)
            K = T.match_buffer(k, (b, sk, H, D), dtype)
            V = T.match_buffer(v, (b, sk, H, D), dtype)
            M = T.match_buffer(mask, mask_shape, dtype)
            O = T.match_buffer(out, (b, sq, H, D), dtype)
            body(Q, K, V, M, O)
        return attention

    @T.prim_func(private=True, s_tir=True)
    def attention_nomask(q: T.handle, k: T.handle, v: T.handle, out: T.handle):
        T.func_attr({"tirx.noalias": True, "tirx.is_scheduled": True})
        Q = T.match_buffer(q, (b, sq, H, D), dtype)
        K = T.match_buffer(k, (b, sk, H, D), dtype)
        V = T.match_buffer(v, (b, sk, H, D), dtype)
        O = T.match_buffer(out, (b, sq, H, D), dtype)
        body(Q, K, V, None, O)
    return attention_nomask
