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
over batch x heads x blocks of ``block_queries`` query rows; each block of keys is copied
transposed into a (head_dim, block_keys) buffer once per task, so the scores of a row are
vectorized over keys and the output update over head_dim. Keys past the end of the last block
get score -inf (weight 0).
"""

from __future__ import annotations

from typing import Optional, Tuple

import numpy as np
import tvm
from tvm import tirx
from tvm.script import tirx as T

__all__ = ["attention_kernel"]


def attention_kernel(heads: int, head_dim: int, dtype: str, scale: float,
                     mask_broadcast: Optional[Tuple[bool, bool, bool]],
                     block_keys: int = 64, block_queries: int = 16) -> tirx.PrimFunc:
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
    def masked(s, M, bi, hi, i, kb):
        # keys past the end get -inf (weight 0 even when every real key is masked to lowest)
        for j in T.vectorized(BK):
            if has_mask:
                s[j] = T.Select(kb * BK + j < sk, s[j] * T.float32(scale_c) + T.Cast(
                    acc_t, M[0 if mb else bi, 0 if mh else hi, 0 if mq else i,
                             T.min(kb * BK + j, sk - 1)]), T.float32(neg_inf))
            else:
                s[j] = T.Select(kb * BK + j < sk, s[j] * T.float32(scale_c), T.float32(neg_inf))

    @T.macro
    def body(Q, K, V, M, O):
        for task in T.parallel(b * H * T.ceildiv(sq, BQ)):
            with T.sblock("attention"):
                T.reads(Q[0:b, 0:sq, 0:H, 0:D], K[0:b, 0:sk, 0:H, 0:D], V[0:b, 0:sk, 0:H, 0:D])
                T.writes(O[0:b, 0:sq, 0:H, 0:D])
                k_t = T.alloc_buffer((D, BK), acc_t, scope="local")  # a block of keys, transposed
                s = T.alloc_buffer((BK,), acc_t, scope="local")  # one row of scores
                acc = T.alloc_buffer((BQ, D), acc_t, scope="local")
                stat = T.alloc_buffer((BQ, 3), acc_t, scope="local")  # m, l, new m per row
                bi = task // (H * T.ceildiv(sq, BQ))
                hi = task // T.ceildiv(sq, BQ) % H
                q0 = task % T.ceildiv(sq, BQ) * BQ
                for qi in range(BQ):
                    stat[qi, 0] = T.float32(lowest)
                    stat[qi, 1] = T.float32(0)
                    for d in T.vectorized(D):
                        acc[qi, d] = T.float32(0)
                for kb in range(T.ceildiv(sk, BK)):
                    for j in range(BK):
                        for d in range(D):
                            k_t[d, j] = T.Cast(acc_t, K[bi, T.min(kb * BK + j, sk - 1), hi, d])
                    for qi in range(BQ):
                        if q0 + qi < sq:
                            for j in T.vectorized(BK):
                                s[j] = T.float32(0)
                            for d in range(D):
                                for j in T.vectorized(BK):
                                    s[j] = s[j] + T.Cast(acc_t, Q[bi, q0 + qi, hi, d]) * k_t[d, j]
                            masked(s, M, bi, hi, q0 + qi, kb)
                            stat[qi, 2] = stat[qi, 0]
                            for j in range(BK):
                                stat[qi, 2] = T.max(stat[qi, 2], s[j])
                            for j in range(BK):
                                s[j] = T.exp(s[j] - stat[qi, 2])
                            alpha = T.exp(stat[qi, 0] - stat[qi, 2])
                            stat[qi, 1] = stat[qi, 1] * alpha
                            for j in range(BK):
                                stat[qi, 1] = stat[qi, 1] + s[j]
                            for d in T.vectorized(D):
                                acc[qi, d] = acc[qi, d] * alpha
                            for j in range(T.min(BK, sk - kb * BK)):
                                for d in T.vectorized(D):
                                    acc[qi, d] = acc[qi, d] + s[j] * T.Cast(
                                        acc_t, V[bi, kb * BK + j, hi, d])
                            stat[qi, 0] = stat[qi, 2]
                for qi in range(BQ):
                    if q0 + qi < sq:
                        for d in T.vectorized(D):
                            O[bi, q0 + qi, hi, d] = T.Cast(dtype, acc[qi, d] / stat[qi, 1])

    if has_mask:
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
