"""Padded operand reads of a matmul micro-kernel without a per-element select.

``pad_einsum`` pads the row (column) loop of a matmul to a multiple of the register tile and,
once the padded copy of ``A`` (``B``) is inlined, the micro-kernel reads
``if_then_else(i < M, A[.., i, k], 0)``: a compare and select (or a masked load) per element
of the innermost loop, which cost the symbolic-shape kernel (:class:`GenericMatmul`) about a
quarter of its speed against the static one (dense ``(8, seq, 768) x (768, 3072)``, 1 thread,
0.73-0.79 x the static build at seq 32, 48, 96).

:func:`clamp_padded_reads` rewrites such a read to ``A[.., min(i, M - 1), k]``: always in
bounds (``M >= 1`` whenever the tile loop runs), no select. The padded rows (columns) of the
accumulator then hold values computed from a repeated row (column) instead of zeros; they are
never written out (the write-back of the padded tile is guarded by ``i < M``), so the output is
unchanged. Only plain loads of the matmul's own operands under a single ``index < bound``
condition are rewritten; anything else is left as is.
"""

from __future__ import annotations

from typing import Iterable

import tvm
import tvm_ffi
from tvm import tirx

__all__ = ["clamp_padded_reads"]

_IF_THEN_ELSE = "prim.if_then_else"


def _is_zero(expr) -> bool:
    value = getattr(expr, "value", None)
    return value is not None and float(value) == 0.0


def clamp_padded_reads(func: tirx.PrimFunc, operands: Iterable) -> tirx.PrimFunc:
    """Replace ``if_then_else(i < n, X[.., i, ..], 0)`` by ``X[.., min(i, n - 1), ..]``.

    Parameters
    ----------
    func : tvm.tirx.PrimFunc
        A scheduled matmul whose padded rows/columns are discarded by a guarded write-back
        (the :func:`~relax_memplan.schedules._matmul_nest._schedule_tiles` nest).
    operands : iterable of tvm.tirx.Buffer
        The matmul's input buffers ``X`` whose padded reads may be clamped (``A`` and ``B``),
        matched by name (the schedule's copies are new objects; its own buffers get
        suffixes: ``_pad``, ``_global``, ``_local``).

    Returns
    -------
    tvm.tirx.PrimFunc
        ``func`` with those reads clamped (``func`` itself when nothing matched).
    """
    op = tvm.ir.Op.get(_IF_THEN_ELSE)
    names = {buf.name for buf in operands}  # scheduling copies the buffer objects

    def clamp(call):
        if not call.op.same_as(op) or len(call.args) != 3:
            return call
        cond, then, other = call.args
        if not isinstance(cond, tirx.LT) or not _is_zero(other):
            return call
        source = getattr(then, "source", None)
        if source is None or not hasattr(then, "indices") or source.name not in names:
            return call
        hits = [k for k, index in enumerate(then.indices)
                if tvm_ffi.structural_equal(index, cond.a)]
        if len(hits) != 1:
            return call
        indices = list(then.indices)
        indices[hits[0]] = tirx.Min(indices[hits[0]], cond.b - 1)
        return tirx.BufferLoad(source, indices)

    body = tvm_ffi.structural_map(func.body, [(tvm.ir.Call, clamp)])
    return func if body.same_as(func.body) else func.with_body(body)
