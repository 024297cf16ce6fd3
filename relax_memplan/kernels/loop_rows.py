"""Row kernels of the recursive loop form: read row ``i`` of a sequence, write row ``i``
of a preallocated output in place, and the iteration number as a tensor.

Used by :mod:`relax_memplan.frontend.prepare.recursive_loops`, where ``i`` is the loop
function's symbolic iteration variable, passed to the kernel as a scalar argument
(``R.call_tir(take_row, (xs, R.prim_value(i)), ...)``).  Relax's ``strided_slice`` with a
symbolic ``begin`` gives a row whose shape is symbolic (``min(i + 1, T) - min(i, T)``),
which no static planner can place; these kernels keep every row's shape that of the
element.  ``write_row`` is called with ``call_tir_inplace`` so that the output sequence
``[T, ...]`` is allocated once, before the loop, and never copied (no ``stack`` at the
end, unlike the unrolled form).

All kernels take any rank, any dtype and symbolic dims, carry ``tirx.is_scheduled`` (no
schedule rule touches them) and ``op_pattern`` opaque (FuseOps leaves them alone).  The
caller guarantees ``0 <= i < T``.
"""

from __future__ import annotations

from functools import lru_cache

import tvm
from tvm.script import tirx as T  # noqa: F401  (the parsed sources refer to T)

from .recurrence import OPAQUE

__all__ = ["take_row_kernel", "write_row_kernel", "copy_kernel", "iteration_kernel"]

_ATTRS = f'T.func_attr({{"tirx.is_scheduled": True, "tirx.noalias": True, "op_pattern": {OPAQUE}}})'


def _source(name: str, params: str, dtype: str, rank: int, store: str) -> str:
    """A PrimFunc over a row ``[d0..]`` of a sequence ``[n, d0..]``: one block per element
    (``store`` uses ``ROW`` for the row index and ``SEQ`` for the sequence index)."""
    dims = [f"d{k}" for k in range(rank)]
    shape = ", ".join(dims) + ("," if rank == 1 else "")
    decls = "".join(f"    {d} = T.int64()\n" for d in dims)
    axes = [f"v{k}" for k in range(rank)]
    index = ", ".join(axes)
    row = f"[{index}]" if rank else "[()]"
    seq = f"[i, {index}]" if rank else "[i]"
    text = f"""
@T.prim_func(private=True, s_tir=True)
def {name}({params}):
    {_ATTRS}
    n = T.int64()
{decls}    SEQ_B = T.match_buffer(seq_h, (n, {", ".join(dims)}), "{dtype}")
    ROW_B = T.match_buffer(row_h, ({shape}), "{dtype}")
"""
    body = store.replace("ROW", f"ROW_B{row}").replace("SEQ", f"SEQ_B{seq}")
    if rank == 0:
        text += f"""    with T.sblock("root"):
        with T.sblock("{name}"):
            {body}
"""
        return text
    text += f"""    with T.sblock("root"):
        for {", ".join(f"j{k}" for k in range(rank))} in T.grid({", ".join(dims)}):
            with T.sblock("{name}"):
                {index} = T.axis.remap("{"S" * rank}", [{", ".join(f"j{k}" for k in range(rank))}])
                {body}
"""
    return text


def _parse(source: str) -> tvm.tirx.PrimFunc:
    return tvm.script.from_source(source)


@lru_cache(maxsize=None)
def take_row_kernel(dtype: str, rank: int) -> tvm.tirx.PrimFunc:
    """``take_row(xs [T, d0..], i, out [d0..])``: ``out = xs[i]``.

    Parameters
    ----------
    dtype : str
        Element type of both buffers.
    rank : int
        Rank of one row (``xs`` has ``rank + 1`` dims).
    """
    return _parse(_source("take_row", "seq_h: T.handle, i: T.int64, row_h: T.handle",
                          dtype, rank, "ROW = SEQ"))


@lru_cache(maxsize=None)
def write_row_kernel(dtype: str, rank: int) -> tvm.tirx.PrimFunc:
    """``write_row(ys [T, d0..], y [d0..], i)``: ``ys[i] = y``, in place on ``ys`` (call it
    with ``relax.call_tir_inplace(..., inplace_indices=[0])``); ``dtype`` and ``rank`` as
    for :func:`take_row_kernel`."""
    return _parse(_source("write_row", "seq_h: T.handle, row_h: T.handle, i: T.int64",
                          dtype, rank, "SEQ = ROW"))


@lru_cache(maxsize=None)
def copy_kernel(dtype: str, rank: int) -> tvm.tirx.PrimFunc:
    """``copy(x [d0..], i, out [d0..])``: ``out = x`` (``i`` unused).

    A loop-carried value must be a fresh tensor (see
    :mod:`relax_memplan.frontend.prepare.recursive_loops`), but TVM turns a kernel that only
    copies (``x * 1`` once simplified, too) into a view (``RewriteDataflowReshape``).  The
    kernel stores ``Select(i >= 0, x, 0)`` instead: ``i``, the iteration number, is never
    negative, and the compiler cannot prove it, so the kernel stays.
    """
    dims = [f"d{k}" for k in range(rank)]
    shape = ", ".join(dims) + ("," if rank == 1 else "")
    decls = "".join(f"    {d} = T.int64()\n" for d in dims)
    index = ", ".join(f"v{k}" for k in range(rank))
    at = f"[{index}]" if rank else "[()]"
    value = f'T.Select(i >= T.int64(0), X{{at}}, T.Cast("{dtype}", 0))'
    loops = (f"""        for {", ".join(f"j{k}" for k in range(rank))} in T.grid({", ".join(dims)}):
            with T.sblock("copy"):
                {index} = T.axis.remap("{"S" * rank}", [{", ".join(f"j{k}" for k in range(rank))}])
                OUT{at} = {value.format(at=at)}
""" if rank else f"""        with T.sblock("copy"):
            OUT[()] = {value.format(at=at)}
""")
    return _parse(f"""
@T.prim_func(private=True, s_tir=True)
def copy(x_h: T.handle, i: T.int64, out_h: T.handle):
    {_ATTRS}
{decls}    X = T.match_buffer(x_h, ({shape}), "{dtype}")
    OUT = T.match_buffer(out_h, ({shape}), "{dtype}")
    with T.sblock("root"):
{loops}""")


@lru_cache(maxsize=None)
def iteration_kernel() -> tvm.tirx.PrimFunc:
    """``iteration(i, out [] int64)``: ``out = i`` (ONNX ``Loop``'s iteration-number input)."""
    source = f"""
@T.prim_func(private=True, s_tir=True)
def iteration(i: T.int64, out_h: T.handle):
    {_ATTRS}
    OUT = T.match_buffer(out_h, (), "int64")
    with T.sblock("root"):
        with T.sblock("iteration"):
            OUT[()] = i
"""
    return _parse(source)
