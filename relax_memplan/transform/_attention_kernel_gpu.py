"""The CUDA TIR kernel of :class:`~relax_memplan.transform.fuse_attention.FuseAttention`.

Same contract as the CPU kernel (:mod:`~relax_memplan.transform._attention_kernel`): it
computes a :class:`~relax_memplan.transform._attention_spec.KernelSpec` (every matched form:
any leading dims, operands read through their index maps, the score steps, the isnan guard,
different query and key lengths), accumulation in float32, the softmax in streaming form over
blocks of keys (FlashAttention's recurrence, Dao et al., NeurIPS 2022, Algorithm 1).

Schedule (written in the TIR, the function is marked ``tirx.is_scheduled`` so dlight's
``ApplyDefaultSchedule`` leaves it alone; dlight has no rule for it):

* one thread block per (leading index, tile of ``block_queries`` query rows): ``blockIdx.x``;
* one thread per query row of the tile (``threadIdx.x``): its query row (scaled), its
  unnormalised output row, its running maximum and sum and the scores of one key block live in
  registers (loops over head dims and keys are unrolled, so every index is constant); the
  recurrence needs no exchange between threads;
* per block of ``block_keys`` keys, the threads copy the K (block_keys, head_dim) and V
  (block_keys, value_dim) tiles into shared memory together (consecutive threads read
  consecutive entries of a key), synchronise, and every thread reads the same shared element
  at the same time (a broadcast, no bank conflicts);
* keys past the end get score -inf (weight 0) and read the last key; query rows past the end
  repeat the last row and are not written.
"""

from __future__ import annotations

from typing import Optional

from tvm import tirx
from tvm.script import tirx as T

from ._attention_kernel import _normalized
from ._attention_spec import (KernelSpec, build_prim_func, declare_buffers, float_min,
                              whole_regions)

__all__ = ["attention_kernel_gpu", "decline_reason"]

#: Largest head dim the CUDA kernel takes: each thread keeps its query row and its output row
#: in registers.
MAX_HEAD_DIM = 256


def decline_reason(spec: KernelSpec) -> Optional[str]:
    """Why the CUDA kernel is not used for ``spec`` (``None``: it is)."""
    if max(spec.head_dim, spec.value_dim) > MAX_HEAD_DIM:
        return f"head dim {max(spec.head_dim, spec.value_dim)} above {MAX_HEAD_DIM}"
    return None


def attention_kernel_gpu(spec: KernelSpec, block_keys: int = 16,
                         block_queries: int = 32) -> tirx.PrimFunc:
    """Build the fused attention PrimFunc with its CUDA thread bindings.

    Parameters
    ----------
    spec : KernelSpec
        What to compute and where its operands are.
    block_keys : int
        Keys per shared-memory tile (shared memory: ``block_keys * (head_dim + value_dim)
        * 4`` bytes).
    block_queries : int
        Query rows per thread block = threads per block.

    Returns
    -------
    tvm.tirx.PrimFunc
        ``(inputs..., params..., out)``, private, marked ``tirx.is_scheduled``.
    """
    D, E, BK, BQ = spec.head_dim, spec.value_dim, block_keys, block_queries
    k_per_thread = (BK * D + BQ - 1) // BQ
    v_per_thread = (BK * E + BQ - 1) // BQ
    acc_t = "float32"
    scale_c = float(spec.scale)
    lowest, neg_inf = float_min, float("-inf")
    sq, sk = spec.seq_q, spec.seq_k
    nqb = (sq + BQ - 1) // BQ
    blocks = spec.groups() * nqb
    bufs, out = declare_buffers(spec)
    reads, writes = whole_regions(bufs), whole_regions([out])
    guard = spec.guard

    def lead(bx):
        return spec.lead_values(bx // nqb)

    def q_at(bx, row, d):
        return spec.value_of(bufs, spec.q, lead(bx), i=row, d=d)

    def k_at(bx, key, d):
        return spec.value_of(bufs, spec.k, lead(bx), j=key, d=d)

    def v_at(bx, key, e):
        return spec.value_of(bufs, spec.v, lead(bx), j=key, e=e)

    def score(bx, s, row, key):
        return spec.epilogue(bufs, s, lead(bx), row, key)

    @T.macro
    def load_tiles(Ks, Vs, bx, kb, tx):
        for it in T.unroll(k_per_thread):
            if it * BQ + tx < BK * D:
                Ks[(it * BQ + tx) // D, (it * BQ + tx) % D] = k_at(
                    bx, T.min(kb * BK + (it * BQ + tx) // D, sk - 1), (it * BQ + tx) % D)
        for it in T.unroll(v_per_thread):
            if it * BQ + tx < BK * E:
                Vs[(it * BQ + tx) // E, (it * BQ + tx) % E] = v_at(
                    bx, T.min(kb * BK + (it * BQ + tx) // E, sk - 1), (it * BQ + tx) % E)

    @T.macro
    def block_scores(sc, qr, Ks, bx, row, kb):
        for j in T.unroll(BK):
            sc[j] = T.float32(0)
            for d in T.unroll(D):
                sc[j] = sc[j] + qr[d] * Ks[j, d]
            sc[j] = T.Select(kb * BK + j < sk,
                             score(bx, sc[j], row, T.min(kb * BK + j, sk - 1)),
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
        for e in T.unroll(E):
            acc[e] = acc[e] * st[3]
            for j in T.unroll(BK):
                acc[e] = acc[e] + sc[j] * Vs[j, e]

    @T.prim_func(private=True, s_tir=True, check_well_formed=False)
    def attention():
        for bx in T.thread_binding(blocks, thread="blockIdx.x"):
            for tx in T.thread_binding(BQ, thread="threadIdx.x"):
                with T.sblock("attention"):
                    T.reads(reads)
                    T.writes(writes)
                    Ks = T.alloc_buffer((BK, D), acc_t, scope="shared")
                    Vs = T.alloc_buffer((BK, E), acc_t, scope="shared")
                    qr = T.alloc_buffer((D,), acc_t, scope="local")
                    acc = T.alloc_buffer((E,), acc_t, scope="local")
                    sc = T.alloc_buffer((BK,), acc_t, scope="local")
                    st = T.alloc_buffer((4,), acc_t, scope="local")
                    q0 = bx % nqb * BQ
                    row = T.min(q0 + tx, sq - 1)  # rows past the end repeat the last one
                    for d in T.unroll(D):
                        qr[d] = q_at(bx, row, d) * T.float32(scale_c)
                    for e in T.unroll(E):
                        acc[e] = T.float32(0)
                    st[0] = T.float32(lowest)
                    st[1] = T.float32(0)
                    for kb in range((sk + BK - 1) // BK):
                        T.tvm_storage_sync("shared")
                        load_tiles(Ks, Vs, bx, kb, tx)
                        T.tvm_storage_sync("shared")
                        block_scores(sc, qr, Ks, bx, row, kb)
                        update(sc, st, acc, Vs)
                    if q0 + tx < sq:
                        for e in T.unroll(E):
                            out[tuple(spec.out_index(lead(bx), q0 + tx, e))] = T.Cast(
                                spec.out_dtype, _normalized(acc[e], st[1], guard))

    return build_prim_func(spec, attention, bufs, out)
