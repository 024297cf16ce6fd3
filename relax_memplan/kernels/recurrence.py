"""LSTM and GRU recurrences as one TIR PrimFunc each: the whole time loop in one kernel.

Why one kernel per recurrence
-----------------------------
ONNX ``LSTM``/``GRU`` run a loop over the sequence whose step is a small matrix-vector
product ``h_{t-1} · Rᵀ`` and a few element-wise gates.  Expressed as a Relax loop, every
step would be a handful of kernel calls and allocations.  Here the converter computes
the input projection ``X · Wᵀ + biases`` for *all* steps as one Relax ``matmul`` (the big,
well-scheduled part), and one ``call_tir`` of the kernel below runs the time loop.  The
kernel writes straight into the ONNX outputs (``Y`` holds every ``h_t``; the previous
step's ``h`` is read back from ``Y``; the cell state lives in ``Y_c``), so nothing is
allocated per step and the memory planner sees one call with fixed-size outputs.  The
final states ``Y_h`` (and ``Y_c``) come from a tiny kernel after the loop
(:func:`last_step_kernel`), one call per state, each with a single output: our
liveness analysis treats every item of a ``call_tir`` output tuple as aliasing the whole
tuple, so a state that is a function output (a streaming model's ``hn``) would pin ``Y``
out of the arena if it came out of the same call.  The only scratch (GRU with ``linear_before_reset=0``: ``r ⊙ h_{t-1}`` for one step,
``[batch, hidden]``) is an extra ``call_tir`` output, planned like any temporary.

Schedule (CPU)
--------------
Per time step, a loop over ``batch × hidden/lanes`` blocks of ``lanes`` hidden units
(parallel when ``hidden >= parallel_min_hidden``, since each step is one fork/join);
inside, ``for k: acc[g, 0:lanes] += h[k] * Rᵀ[k, g*hidden + j:j+lanes]`` with the
``lanes`` axis vectorized, then the gate non-linearities vectorized over the same lanes.
``Rᵀ`` (``[directions, hidden, gates*hidden]``) is ``R`` transposed by the converter (a
constant fold when ``R`` is an initializer).  Directions run one after the other.

Layouts (ONNX ``layout=0``): ``XW [directions, seq, batch, gates*hidden]`` (gate order
of ONNX: LSTM ``i, o, f, c``; GRU ``z, r, h``), ``Y [seq, directions, batch, hidden]``,
states ``[directions, batch, hidden]``.  ``seq`` and ``batch`` are symbolic.
Functions carry ``tirx.is_scheduled`` so that no dlight rule reschedules them, and
``op_pattern`` opaque.
Vectorized loops hold single stores, no ``let`` bindings: TVM 0.27 vectorizes a loop
with let-bound values wrongly (results were garbage; found while writing these).
"""

from __future__ import annotations

from dataclasses import dataclass

import tvm
from tvm import te
from tvm.script import tirx as T

OPAQUE = 8
"""``op_pattern`` of the kernels (TVM's ``kOpaque``): FuseOps leaves them alone, and
``AnnotateTIROpPattern``, which rejects loops outside blocks, skips them."""

__all__ = ["RecurrenceSpec", "lstm_kernel", "gru_kernel", "last_step_kernel"]


@dataclass(frozen=True)
class RecurrenceSpec:
    """Static facts a recurrence kernel is specialised to.

    Attributes
    ----------
    hidden : int
        Hidden size (elements).
    directions : str
        ``"forward"``, ``"reverse"`` or ``"bidirectional"`` (ONNX ``direction``).
    parallel_min_hidden : int
        Run a step's hidden-unit blocks in parallel from this hidden size on; below it a
        step is too little work for a fork/join per step.
    """

    hidden: int
    directions: str = "forward"
    parallel_min_hidden: int = 128

    @property
    def num_directions(self) -> int:
        return 2 if self.directions == "bidirectional" else 1

    @property
    def lanes(self) -> int:
        """Hidden units computed together (the vector width), a divisor of ``hidden``.

        16 where ``hidden`` allows: one AVX-512 register (four AVX2/SSE ones) per gate.
        On the VAD model (hidden 64, host CPU znver4) the LSTM kernel took 0.47-0.49 ms
        per 256 steps with 16 lanes and 0.59-0.60 ms with 8
        (``benchmarks/latency_bench.py --only vad-lstm``, 2 threads, shared machine).
        """
        return next(n for n in (16, 8, 4, 2, 1) if self.hidden % n == 0)

    def is_reverse(self, d):
        """PrimExpr (or bool): does direction ``d`` walk the sequence backwards."""
        if self.directions == "bidirectional":
            return d == 1
        return self.directions == "reverse"


def _time_index(spec, d, t, seq):
    """The position step ``t`` of direction ``d`` reads, and the previous step's."""
    if spec.directions == "forward":
        return t, t - 1
    if spec.directions == "reverse":
        return seq - 1 - t, seq - t
    rev = spec.is_reverse(d)
    tt = T.if_then_else(rev, seq - 1 - t, t)
    return tt, T.if_then_else(rev, tt + 1, tt - 1)


def _loop_kind(spec):
    return T.parallel if spec.hidden >= spec.parallel_min_hidden else T.serial


def lstm_kernel(spec: RecurrenceSpec) -> tvm.tirx.PrimFunc:
    """The LSTM time loop (ONNX default activations sigmoid, tanh, tanh; no peepholes).

    Parameters
    ----------
    spec : RecurrenceSpec

    Returns
    -------
    tvm.tirx.PrimFunc
        ``(XW, RT, H0, C0) -> (Y, C)`` in destination-passing style:
        ``XW [D, seq, batch, 4H]`` (input projection plus both biases), ``RT [D, H, 4H]``,
        ``H0, C0 [D, batch, H]``; ``Y [seq, D, batch, H]``, ``C [1, D, batch, H]`` the
        cell state (the last step's at the end: ONNX ``Y_c`` via :func:`last_step_kernel`).
    """
    H, D, L = spec.hidden, spec.num_directions, spec.lanes
    G, JO = 4 * H, H // L
    loop = _loop_kind(spec)

    @T.macro
    def dots(RT, d, jo, acc, src, base):
        for g in range(4):
            for ji in T.vectorized(L):
                acc[g, ji] = T.float32(0)
        for k in range(H):
            for g in range(4):
                for ji in T.vectorized(L):
                    acc[g, ji] = acc[g, ji] + src[base + k] * RT[d, k, g * H + jo * L + ji]

    @T.prim_func(private=True)
    def lstm_recurrence(xw_h: T.handle, rt_h: T.handle, h0_h: T.handle, c0_h: T.handle,
                        y_h: T.handle, c_h: T.handle):
        T.func_attr({"tirx.is_scheduled": True, "tirx.noalias": True, "op_pattern": OPAQUE})
        seq = T.int64()
        batch = T.int64()
        XW = T.match_buffer(xw_h, (D, seq, batch, G), "float32")
        RT = T.match_buffer(rt_h, (D, H, G), "float32")
        H0 = T.match_buffer(h0_h, (D, batch, H), "float32")
        C0 = T.match_buffer(c0_h, (D, batch, H), "float32")
        Y = T.match_buffer(y_h, (seq, D, batch, H), "float32")
        YC = T.match_buffer(c_h, (1, D, batch, H), "float32")
        H0f = T.decl_buffer((D * batch * H,), "float32", data=H0.data)
        Yf = T.decl_buffer((seq * D * batch * H,), "float32", data=Y.data)
        for d in range(D):
            for b, j in T.grid(batch, H):
                YC[0, d, b, j] = C0[d, b, j]
            for t in range(seq):
                for bjo in loop(batch * JO):
                    acc = T.alloc_buffer((4, L), "float32", scope="local")
                    b = bjo // JO
                    jo = bjo % JO
                    tt, tp = _time_index(spec, d, t, seq)
                    if t == 0:
                        dots(RT, d, jo, acc, H0f, (d * batch + b) * H)
                    else:
                        dots(RT, d, jo, acc, Yf, ((tp * D + d) * batch + b) * H)
                    # no let-bindings inside vectorized loops: TVM 0.27 mis-vectorizes them
                    for g in range(3):
                        for ji in T.vectorized(L):
                            acc[g, ji] = T.sigmoid(XW[d, tt, b, g * H + jo * L + ji] + acc[g, ji])
                    for ji in T.vectorized(L):
                        acc[3, ji] = T.tanh(XW[d, tt, b, 3 * H + jo * L + ji] + acc[3, ji])
                    for ji in T.vectorized(L):
                        YC[0, d, b, jo * L + ji] = (acc[2, ji] * YC[0, d, b, jo * L + ji]
                                                 + acc[0, ji] * acc[3, ji])
                    for ji in T.vectorized(L):
                        Y[tt, d, b, jo * L + ji] = acc[1, ji] * T.tanh(YC[0, d, b, jo * L + ji])

    return lstm_recurrence


def gru_kernel(spec: RecurrenceSpec, linear_before_reset: bool) -> tvm.tirx.PrimFunc:
    """The GRU time loop (ONNX default activations sigmoid, tanh).

    Parameters
    ----------
    spec : RecurrenceSpec
    linear_before_reset : bool
        ONNX ``linear_before_reset``: ``h̃ = tanh(XWh + r ⊙ (h·Rhᵀ + Rbh))`` when true,
        ``tanh(XWh + (r ⊙ h)·Rhᵀ)`` otherwise (``Rbh`` then folded into ``XW``).

    Returns
    -------
    tvm.tirx.PrimFunc
        ``(XW, RT, RBH, H0) -> (Y, scratch)``: ``XW [D, seq, batch, 3H]`` (input
        projection plus ``Wb`` and, for ``z, r``, ``Rb``), ``RT [D, H, 3H]``, ``RBH [D, H]``
        (``Rbh``, read only with ``linear_before_reset``), ``H0 [D, batch, H]``;
        ``Y [seq, D, batch, H]``, ``scratch [batch, H]``
        (``r ⊙ h_{t-1}`` of one step, written only without ``linear_before_reset``).
    """
    H, D, L = spec.hidden, spec.num_directions, spec.lanes
    G, JO = 3 * H, H // L
    loop = _loop_kind(spec)
    lbr = bool(linear_before_reset)

    @T.macro
    def dot(RT, d, jo, acc, row, g, src, base):
        for ji in T.vectorized(L):
            acc[row, ji] = T.float32(0)
        for k in range(H):
            for ji in T.vectorized(L):
                acc[row, ji] = acc[row, ji] + src[base + k] * RT[d, k, g * H + jo * L + ji]

    @T.macro
    def step(XW, RT, RBH, Y, S, Sf, d, tt, b, jo, acc, src, base):
        dot(RT, d, jo, acc, 0, 0, src, base)  # z
        if lbr:
            dot(RT, d, jo, acc, 1, 1, src, base)  # r
            dot(RT, d, jo, acc, 2, 2, src, base)  # h·Rhᵀ
        else:
            dot(RT, d, jo, acc, 2, 2, Sf, b * H)  # (r ⊙ h)·Rhᵀ
        for ji in T.vectorized(L):
            acc[0, ji] = T.sigmoid(XW[d, tt, b, jo * L + ji] + acc[0, ji])
        if lbr:
            for ji in T.vectorized(L):
                acc[1, ji] = T.sigmoid(XW[d, tt, b, H + jo * L + ji] + acc[1, ji])
            for ji in T.vectorized(L):
                acc[2, ji] = T.tanh(XW[d, tt, b, 2 * H + jo * L + ji]
                                    + acc[1, ji] * (acc[2, ji] + RBH[d, jo * L + ji]))
        else:
            for ji in T.vectorized(L):
                acc[2, ji] = T.tanh(XW[d, tt, b, 2 * H + jo * L + ji] + acc[2, ji])
        for ji in T.vectorized(L):
            Y[tt, d, b, jo * L + ji] = ((T.float32(1) - acc[0, ji]) * acc[2, ji]
                                        + acc[0, ji] * src[base + jo * L + ji])

    @T.macro
    def reset(XW, RT, S, d, tt, b, jo, acc, src, base):
        dot(RT, d, jo, acc, 1, 1, src, base)
        for ji in T.vectorized(L):
            S[b, jo * L + ji] = (T.sigmoid(XW[d, tt, b, H + jo * L + ji] + acc[1, ji])
                                 * src[base + jo * L + ji])

    @T.prim_func(private=True)
    def gru_recurrence(xw_h: T.handle, rt_h: T.handle, rbh_h: T.handle, h0_h: T.handle,
                       y_h: T.handle, s_h: T.handle):
        T.func_attr({"tirx.is_scheduled": True, "tirx.noalias": True, "op_pattern": OPAQUE})
        seq = T.int64()
        batch = T.int64()
        XW = T.match_buffer(xw_h, (D, seq, batch, G), "float32")
        RT = T.match_buffer(rt_h, (D, H, G), "float32")
        RBH = T.match_buffer(rbh_h, (D, H), "float32")
        H0 = T.match_buffer(h0_h, (D, batch, H), "float32")
        Y = T.match_buffer(y_h, (seq, D, batch, H), "float32")
        S = T.match_buffer(s_h, (batch, H), "float32")
        H0f = T.decl_buffer((D * batch * H,), "float32", data=H0.data)
        Yf = T.decl_buffer((seq * D * batch * H,), "float32", data=Y.data)
        Sf = T.decl_buffer((batch * H,), "float32", data=S.data)
        for d in range(D):
            for t in range(seq):
                tt, tp = _time_index(spec, d, t, seq)
                if not lbr:
                    for bjo in loop(batch * JO):
                        acc = T.alloc_buffer((3, L), "float32", scope="local")
                        if t == 0:
                            reset(XW, RT, S, d, tt, bjo // JO, bjo % JO, acc, H0f,
                                  (d * batch + bjo // JO) * H)
                        else:
                            reset(XW, RT, S, d, tt, bjo // JO, bjo % JO, acc, Yf,
                                  ((tp * D + d) * batch + bjo // JO) * H)
                for bjo in loop(batch * JO):
                    acc = T.alloc_buffer((3, L), "float32", scope="local")
                    if t == 0:
                        step(XW, RT, RBH, Y, S, Sf, d, tt, bjo // JO, bjo % JO, acc, H0f,
                             (d * batch + bjo // JO) * H)
                    else:
                        step(XW, RT, RBH, Y, S, Sf, d, tt, bjo // JO, bjo % JO, acc, Yf,
                             ((tp * D + d) * batch + bjo // JO) * H)

    return gru_recurrence


def last_step_kernel(spec: RecurrenceSpec) -> tvm.tirx.PrimFunc:
    """A final state: each direction's last step of a sequence (``init`` when ``seq = 0``).

    Used for ONNX ``Y_h`` (the last step of ``Y``) and, with ``seq = 1``, ``Y_c`` (the
    LSTM kernel's cell state).  The body is one block whose value is a select, not a
    plain load, so Relax's ``RewriteDataflowReshape`` does not turn it into a view (a
    view would alias the recurrence call's output tuple again).

    Returns
    -------
    tvm.tirx.PrimFunc
        ``(Y [seq, D, batch, H], init [D, batch, H]) -> state [D, batch, H]``.
    """
    H, D = spec.hidden, spec.num_directions
    seq, batch = tvm.tirx.Var("seq", "int64"), tvm.tirx.Var("batch", "int64")
    y = te.placeholder((seq, D, batch, H), "float32", name="Y")
    init = te.placeholder((D, batch, H), "float32", name="init")

    def value(d, b, j):
        last = _time_index(spec, d, seq - 1, seq)[0]
        return tvm.tirx.if_then_else(seq == 0, init[d, b, j],
                                     y[tvm.te.max(last, tvm.tirx.const(0, "int64")), d, b, j])

    out = te.compute((D, batch, H), value, name="last_step")
    func = te.create_prim_func([y, init, out]).without_attr("global_symbol")
    return func.with_attrs({"tirx.is_scheduled": True, "tirx.noalias": True,
                            "op_pattern": OPAQUE})
