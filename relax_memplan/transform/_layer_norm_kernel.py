"""The kernels of :class:`~relax_memplan.transform.fuse_add_layer_norm.FuseAddLayerNorm`.

``out[r, :] = layer_norm(a[r, :] + b[r, :]) * gamma + beta`` over the last (hidden) axis of
2-d tensors ``(rows, hidden)``, ``rows`` symbolic and ``hidden`` static; optionally also
``sum[r, :] = a[r, :] + b[r, :]`` when the residual sum has other readers (onnxruntime's
SkipLayerNormalization with its ``input_skip_bias_sum`` output). One kernel reads ``a`` and
``b`` once and writes ``out`` (and ``sum``) once; the (rows, hidden) sum is not a tensor of its
own unless it is read elsewhere. With ``rms`` the same kernels compute the RMS norm
``out[r, :] = s / sqrt(mean(s * s) + eps) * gamma`` of ``s = a + b`` (Llama's and T5's
residual add + RMSNorm), without beta.

CPU (:func:`add_layer_norm_cpu`, written scheduled, marked ``tirx.is_scheduled``): parallel
over rows (serial rows for fewer than ``min_parallel_elements`` elements, tested at run time); per row the sum is kept in a local row buffer (``hidden`` values), then the mean and
the variance are two vectorized passes over it (``vector`` lanes of partial sums, then a serial
sum of the lanes), then the normalized row is written in a vectorized pass. The variance is
``mean((x - mean)^2)`` (two passes over the row in registers/L1), not ``E[x^2] - E[x]^2``.

CUDA (:func:`add_layer_norm_compute`): the same computation as a plain TE compute (sum, then
:func:`tvm.topi.nn.layer_norm`) which the pipeline's dlight GPU rules schedule (the
general-reduction rule: one thread block of 256 threads per row, the mean and variance
reductions over the hidden dim as cross-thread reductions lowered to warp shuffles, the sum
recomputed from a and b in each pass). With ``write_sum`` dlight's general-reduction rule does
not apply and its fallback splits the compute into four kernels, so the pass does not use it.
"""

from __future__ import annotations

from tvm import te, tirx, topi
from tvm.script import tirx as T

__all__ = ["add_layer_norm_cpu", "add_layer_norm_compute", "vector_lanes"]


def vector_lanes(hidden: int, widest: int = 16) -> int:
    """The largest power of two <= ``widest`` dividing ``hidden`` (lanes of the CPU loops)."""
    lanes = widest
    while lanes > 1 and hidden % lanes:
        lanes //= 2
    return lanes


def add_layer_norm_cpu(hidden: int, dtype: str, epsilon: float, write_sum: bool,
                       widest_vector: int = 16,
                       min_parallel_elements: int = 1 << 17, rms: bool = False) -> tirx.PrimFunc:
    """The scheduled CPU kernel.

    Parameters
    ----------
    hidden : int
        Static size of the normalized (last) axis, in elements.
    dtype : str
        Element type of every argument (float32 or float16; accumulation in float32).
    epsilon : float
        Added to the variance.
    write_sum : bool
        Also write ``a + b`` as a second output.
    widest_vector : int
        Upper limit on the vector lanes (:func:`vector_lanes`).
    min_parallel_elements : int
        Fewest elements (``rows * hidden``, tested at run time) for the row loop to run in
        parallel; smaller calls run their rows serially (bert-tiny's ``(128, 128)``: a
        parallel launch costs more than the rows, see
        :class:`~relax_memplan.schedules.cpu_reduction.VectorRowReduction`).
    rms : bool
        The RMS norm instead: ``out = s / sqrt(mean(s * s) + epsilon) * gamma`` with
        ``s = a + b`` (no mean subtracted, no beta).

    Returns
    -------
    tvm.tirx.PrimFunc
        ``(a, b, gamma, beta, out[, sum])`` (``rms``: ``(a, b, gamma, out[, sum])``) with a, b,
        out, sum of shape ``(rows, hidden)`` and gamma, beta of shape ``(hidden,)``; private,
        marked ``tirx.is_scheduled``.
    """
    H = hidden
    V = vector_lanes(H, widest_vector)
    C = H // V
    acc = "float32"
    eps = float(epsilon)
    rows = tirx.Var("rows", "int64")
    min_parallel = T.int64(min_parallel_elements)

    @T.macro
    def row(A, B, G, Be, O, S, r):
        with T.sblock("add_layer_norm"):
            T.reads(A[r, 0:H], B[r, 0:H], G[0:H])
            T.writes(O[r, 0:H])
            x = T.alloc_buffer((H,), acc, scope="local")
            part = T.alloc_buffer((V,), acc, scope="local")
            stat = T.alloc_buffer((2,), acc, scope="local")  # mean, 1 / std
            for c in range(C):
                for v in T.vectorized(V):
                    x[c * V + v] = T.Cast(acc, A[r, c * V + v]) + T.Cast(acc, B[r, c * V + v])
            if write_sum:
                for c in range(C):
                    for v in T.vectorized(V):
                        S[r, c * V + v] = T.Cast(dtype, x[c * V + v])
            stat[0] = T.float32(0)
            if not rms:
                for v in T.vectorized(V):
                    part[v] = T.float32(0)
                for c in range(C):
                    for v in T.vectorized(V):
                        part[v] = part[v] + x[c * V + v]
                for v in range(V):
                    stat[0] = stat[0] + part[v]
                stat[0] = stat[0] / T.float32(H)
            for v in T.vectorized(V):
                part[v] = T.float32(0)
            for c in range(C):
                for v in T.vectorized(V):
                    part[v] = part[v] + (x[c * V + v] - stat[0]) * (x[c * V + v] - stat[0])
            stat[1] = T.float32(0)
            for v in range(V):
                stat[1] = stat[1] + part[v]
            stat[1] = T.float32(1) / T.sqrt(stat[1] / T.float32(H) + T.float32(eps))
            if rms:
                for c in range(C):
                    for v in T.vectorized(V):
                        O[r, c * V + v] = T.Cast(dtype, x[c * V + v] * stat[1]
                                                 * T.Cast(acc, G[c * V + v]))
            else:
                for c in range(C):
                    for v in T.vectorized(V):
                        O[r, c * V + v] = T.Cast(dtype, (x[c * V + v] - stat[0]) * stat[1]
                                                 * T.Cast(acc, G[c * V + v])
                                                 + T.Cast(acc, Be[c * V + v]))

    @T.macro
    def body(A, B, G, Be, O, S):
        if rows * H >= min_parallel:
            for r in T.parallel(rows):
                row(A, B, G, Be, O, S, r)
        else:
            for r in range(rows):
                row(A, B, G, Be, O, S, r)

    if rms and write_sum:
        @T.prim_func(private=True, s_tir=True)
        def add_rms_norm_sum(a: T.handle, b: T.handle, g: T.handle, out: T.handle, s: T.handle):
            T.func_attr({"tirx.noalias": True, "tirx.is_scheduled": True})
            A = T.match_buffer(a, (rows, H), dtype)
            B = T.match_buffer(b, (rows, H), dtype)
            G = T.match_buffer(g, (H,), dtype)
            O = T.match_buffer(out, (rows, H), dtype)
            S = T.match_buffer(s, (rows, H), dtype)
            body(A, B, G, None, O, S)
        return add_rms_norm_sum

    if rms:
        @T.prim_func(private=True, s_tir=True)
        def add_rms_norm(a: T.handle, b: T.handle, g: T.handle, out: T.handle):
            T.func_attr({"tirx.noalias": True, "tirx.is_scheduled": True})
            A = T.match_buffer(a, (rows, H), dtype)
            B = T.match_buffer(b, (rows, H), dtype)
            G = T.match_buffer(g, (H,), dtype)
            O = T.match_buffer(out, (rows, H), dtype)
            body(A, B, G, None, O, None)
        return add_rms_norm

    if write_sum:
        @T.prim_func(private=True, s_tir=True)
        def add_layer_norm_sum(a: T.handle, b: T.handle, g: T.handle, be: T.handle,
                               out: T.handle, s: T.handle):
            T.func_attr({"tirx.noalias": True, "tirx.is_scheduled": True})
            A = T.match_buffer(a, (rows, H), dtype)
            B = T.match_buffer(b, (rows, H), dtype)
            G = T.match_buffer(g, (H,), dtype)
            Be = T.match_buffer(be, (H,), dtype)
            O = T.match_buffer(out, (rows, H), dtype)
            S = T.match_buffer(s, (rows, H), dtype)
            body(A, B, G, Be, O, S)
        return add_layer_norm_sum

    @T.prim_func(private=True, s_tir=True)
    def add_layer_norm(a: T.handle, b: T.handle, g: T.handle, be: T.handle, out: T.handle):
        T.func_attr({"tirx.noalias": True, "tirx.is_scheduled": True})
        A = T.match_buffer(a, (rows, H), dtype)
        B = T.match_buffer(b, (rows, H), dtype)
        G = T.match_buffer(g, (H,), dtype)
        Be = T.match_buffer(be, (H,), dtype)
        O = T.match_buffer(out, (rows, H), dtype)
        body(A, B, G, Be, O, None)
    return add_layer_norm


def add_layer_norm_compute(hidden: int, dtype: str, epsilon: float,
                           write_sum: bool, rms: bool = False) -> tirx.PrimFunc:
    """The unscheduled kernel (same arguments and result as :func:`add_layer_norm_cpu`), for
    targets whose default schedule rules (dlight on CUDA) schedule reductions."""
    rows = tirx.Var("rows", "int64")
    a = te.placeholder((rows, hidden), dtype, name="a")
    b = te.placeholder((rows, hidden), dtype, name="b")
    gamma = te.placeholder((hidden,), dtype, name="gamma")
    total = te.compute((rows, hidden), lambda i, j: a[i, j] + b[i, j], name="residual_sum")
    if rms:
        out = topi.nn.rms_norm(total, gamma, axis=[-1], epsilon=epsilon)
        return te.create_prim_func([a, b, gamma, out] + ([total] if write_sum else []))
    beta = te.placeholder((hidden,), dtype, name="beta")
    out = topi.nn.layer_norm(total, gamma, beta, axis=[-1], epsilon=epsilon)
    args = [a, b, gamma, beta, out] + ([total] if write_sum else [])
    return te.create_prim_func(args)
