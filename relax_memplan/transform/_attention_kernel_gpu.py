"""The CUDA TIR kernel of :class:`~relax_memplan.transform.fuse_attention.FuseAttention`.

Same contract as the CPU kernel (:mod:`~relax_memplan.transform._attention_kernel`): q, k, v
and out (batch, seq, heads, head_dim), an optional 4-d additive mask whose batch, head and
query dims may be 1, symbolic batch and sequence lengths, static heads and head_dim,
accumulation in float32, the softmax in streaming form over blocks of keys (FlashAttention's
recurrence, Dao et al., NeurIPS 2022, Algorithm 1).

Schedule (written in the TIR, the function is marked ``tirx.is_scheduled`` so dlight's
``ApplyDefaultSchedule`` leaves it alone; dlight has no rule for it):

* one thread block per (batch, head, tile of ``block_queries`` query rows): ``blockIdx.x``;
* one thread per query row of the tile (``threadIdx.x``): its query row, its unnormalised
  output row (head_dim values), its running maximum and sum and the scores of one key block
  live in registers (loops over head_dim and keys are unrolled, so every index is constant);
  the recurrence needs no exchange between threads;
* per block of ``block_keys`` keys, the threads copy the K and V tiles (block_keys,
  head_dim) into shared memory together (consecutive threads read consecutive head_dim
  entries: coalesced), synchronise, and every thread reads the same shared element at the
  same time (a broadcast, no bank conflicts);
* keys past the end get score -inf (weight 0) and read the last key; query rows past the end
  repeat the last row and are not written.
"""

from __future__ import annotations

from typing import Optional, Tuple

import numpy as np
from tvm import tirx
from tvm.script import tirx as T

from ._attention_kernel import attention_prim_func

__all__ = ["attention_kernel_gpu"]


def attention_kernel_gpu(heads: int, head_dim: int, dtype: str, scale: float,
                         mask_broadcast: Optional[Tuple[bool, bool, bool]],
                         block_keys: int = 16, block_queries: int = 32,
                         extents: Optional[Tuple[int, int, int]] = None) -> tirx.PrimFunc:
    """Build the fused attention PrimFunc with its CUDA thread bindings.

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
    block_keys : int
        Keys per shared-memory tile (shared memory: ``2 * block_keys * head_dim * 4`` bytes).
    block_queries : int
        Query rows per thread block = threads per block.
    extents : (int, int, int), optional
        Fixed (batch, seq_q, seq_k) instead of symbolic ones (e.g. to check the launch
        against a device's limits with ``VerifyGPUCode``, which needs constant extents).

    Returns
    -------
    tvm.tirx.PrimFunc
        ``(q, k, v[, mask], out)``, private, marked ``tirx.is_scheduled``.

    Raises
    ------
    ValueError
        If ``block_keys * head_dim`` is not a multiple of ``block_queries`` (the tile copy
        gives every thread the same number of elements).
    """
    H, D, BK, BQ = heads, head_dim, block_keys, block_queries
    if (BK * D) % BQ:
        raise ValueError(f"block_keys * head_dim ({BK} * {D}) must be a multiple of "
                         f"block_queries ({BQ})")
    per_thread = BK * D // BQ
    acc_t = "float32"
    scale_c = float(scale)
    lowest = float(np.finfo(np.float32).min)
    neg_inf = float("-inf")
    b, sq, sk = ((tirx.Var(n, "int64") for n in ("batch", "seq_q", "seq_k")) if extents is None
                 else (tirx.IntImm("int64", int(e)) for e in extents))
    one = tirx.IntImm("int64", 1)
    has_mask = mask_broadcast is not None
    mb, mh, mq = mask_broadcast if has_mask else (True, True, True)
    mask_shape = (one if mb else b, one if mh else tirx.IntImm("int64", H),
                  one if mq else sq, sk)

    @T.macro
    def load_tiles(Ks, Vs, K, V, bi, hi, kb, tx):
        for it in T.unroll(per_thread):
            Ks[(it * BQ + tx) // D, (it * BQ + tx) % D] = T.Cast(acc_t, K[
                bi, T.min(kb * BK + (it * BQ + tx) // D, sk - 1), hi, (it * BQ + tx) % D])
            Vs[(it * BQ + tx) // D, (it * BQ + tx) % D] = T.Cast(acc_t, V[
                bi, T.min(kb * BK + (it * BQ + tx) // D, sk - 1), hi, (it * BQ + tx) % D])

    @T.macro
    def block_scores(sc, qr, Ks, M, bi, hi, row, kb):
        for j in T.unroll(BK):
            sc[j] = T.float32(0)
            for d in T.unroll(D):
                sc[j] = sc[j] + qr[d] * Ks[j, d]
            if has_mask:
                sc[j] = T.Select(kb * BK + j < sk, sc[j] * T.float32(scale_c) + T.Cast(
                    acc_t, M[0 if mb else bi, 0 if mh else hi, 0 if mq else row,
                             T.min(kb * BK + j, sk - 1)]), T.float32(neg_inf))
            else:
                sc[j] = T.Select(kb * BK + j < sk, sc[j] * T.float32(scale_c),
                                 T.float32(neg_inf))

    @T.macro
    def update(sc, st, acc, Vs):
        # st: running max, running sum, new max, alpha
        st[2] = st[0]
        for j in T.unroll(BK):
            st[2] = T.max(st[2], sc[j])
        st[3] = T.exp(st[0] - st[2])
        st[1] = st[1] * st[3]
        st[0] = st[2]
        for j in T.unroll(BK):
            sc[j] = T.exp(sc[j] - st[2])
            st[1] = st[1] + sc[j]
        for d in T.unroll(D):
            acc[d] = acc[d] * st[3]
            for j in T.unroll(BK):
                acc[d] = acc[d] + sc[j] * Vs[j, d]

    @T.macro
    def body(Q, K, V, M, O):
        for bx in T.thread_binding(b * H * T.ceildiv(sq, BQ), thread="blockIdx.x"):
            for tx in T.thread_binding(BQ, thread="threadIdx.x"):
                with T.sblock("attention"):
                    T.reads(Q[0:b, 0:sq, 0:H, 0:D], K[0:b, 0:sk, 0:H, 0:D],
                            V[0:b, 0:sk, 0:H, 0:D])
                    T.writes(O[0:b, 0:sq, 0:H, 0:D])
                    Ks = T.alloc_buffer((BK, D), acc_t, scope="shared")
                    Vs = T.alloc_buffer((BK, D), acc_t, scope="shared")
                    qr = T.alloc_buffer((D,), acc_t, scope="local")
                    acc = T.alloc_buffer((D,), acc_t, scope="local")
                    sc = T.alloc_buffer((BK,), acc_t, scope="local")
                    st = T.alloc_buffer((4,), acc_t, scope="local")
                    bi = bx // (H * T.ceildiv(sq, BQ))
                    hi = bx // T.ceildiv(sq, BQ) % H
                    q0 = bx % T.ceildiv(sq, BQ) * BQ
                    row = T.min(q0 + tx, sq - 1)  # rows past the end repeat the last one
                    for d in T.unroll(D):
                        qr[d] = T.Cast(acc_t, Q[bi, row, hi, d])
                        acc[d] = T.float32(0)
                    st[0] = T.float32(lowest)
                    st[1] = T.float32(0)
                    for kb in range(T.ceildiv(sk, BK)):
                        T.tvm_storage_sync("shared")
                        load_tiles(Ks, Vs, K, V, bi, hi, kb, tx)
                        T.tvm_storage_sync("shared")
                        block_scores(sc, qr, Ks, M, bi, hi, row, kb)
                        update(sc, st, acc, Vs)
                    if q0 + tx < sq:
                        for d in T.unroll(D):
                            O[bi, q0 + tx, hi, d] = T.Cast(dtype, acc[d] / st[1])

    return attention_prim_func(body, dtype, H, D, (b, sq, sk), mask_shape if has_mask else None)
