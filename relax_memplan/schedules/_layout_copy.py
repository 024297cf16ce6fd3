"""Run a weight-packing PrimFunc that is a pure layout copy with numpy, at compile time.

:func:`~relax_memplan.schedules.prepack.split_prepacked_weights` folds each call of a packing
PrimFunc (``<kernel>_weight_prepack``, split off by ``SplitLayoutRewritePreproc``) on a
constant weight. The packer is one copy block, ``out[g(v)] = w[h(v)]`` over a grid of loops
(``g``, ``h``: index arithmetic of the block's iter vars ``v``, e.g. the panel layout
``(j // nr, k, j % nr)``); building it with LLVM and loading the code costs ~16-25 ms per
model (vad-lstm's one packer), against well under 1 ms for numpy to evaluate ``g`` and ``h``
over the grid and copy. :func:`layout_copy` recognises that form and returns the numpy
function; anything else (a cast, arithmetic on the values, a predicate, an index it cannot
evaluate, a read out of bounds, an output element written twice or never) gives ``None`` and
the caller builds the packer with TVM. The copy moves the same elements, so the result is
bit-identical to TVM's (``tests/schedules/test_layout_copy.py`` compares both on the packers
of vad-lstm and bert-tiny).
"""

from __future__ import annotations

from typing import Callable, Optional

import numpy as np
from tvm import s_tir, tirx
from tvm.ir.expr import TensorLoad

__all__ = ["layout_copy"]

_OPS = {tirx.Add: np.add, tirx.Sub: np.subtract, tirx.Mul: np.multiply,
        tirx.FloorDiv: np.floor_divide, tirx.FloorMod: np.mod}


def _eval(expr, grid: dict):
    """``expr`` over the grid (int64 arrays broadcast over the iter vars); ``None`` when it
    is not integer arithmetic of the iter vars (or divides by a non-positive constant)."""
    if isinstance(expr, tirx.IntImm):
        return np.int64(expr.value)
    if isinstance(expr, tirx.Var):
        return grid.get(expr)
    op = _OPS.get(type(expr))
    if op is None:
        return None
    if op in (np.floor_divide, np.mod) and not (isinstance(expr.b, tirx.IntImm)
                                                 and expr.b.value > 0):
        return None
    a, b = _eval(expr.a, grid), _eval(expr.b, grid)
    return None if a is None or b is None else op(a, b)


def _copy_block(func: tirx.PrimFunc):
    """``(loops, block)`` of a function that is loops around one block, else ``None``."""
    root = func.body
    if not isinstance(root, s_tir.SBlockRealize) or root.block.alloc_buffers:
        return None
    loops, stmt = [], root.block.body
    while isinstance(stmt, tirx.For):
        if stmt.kind != tirx.ForKind.SERIAL or not isinstance(stmt.extent, tirx.IntImm) \
                or not (isinstance(stmt.min, tirx.IntImm) and stmt.min.value == 0):
            return None
        loops.append(stmt)
        stmt = stmt.body
    if not isinstance(stmt, s_tir.SBlockRealize):
        return None
    block = stmt.block
    if block.init is not None or block.alloc_buffers or block.match_buffers \
            or not (isinstance(stmt.predicate, tirx.IntImm) and stmt.predicate.value == 1):
        return None
    if len(stmt.iter_values) != len(loops) or any(
            not value.same_as(lp.loop_var) for value, lp in zip(stmt.iter_values, loops)):
        return None
    return loops, block


def layout_copy(func: tirx.PrimFunc) -> Optional[Callable[[np.ndarray], np.ndarray]]:
    """The numpy equivalent of a packing PrimFunc ``(w, out)`` that copies ``w`` into a new
    layout, or ``None`` when ``func`` is not such a copy.

    Parameters
    ----------
    func : tvm.tirx.PrimFunc
        A packer split off by ``SplitLayoutRewritePreproc``: two buffer parameters, the
        input weight and the packed output, constant shapes.

    Returns
    -------
    callable or None
        ``f(w) -> out`` (numpy arrays, ``out`` of the output buffer's shape and dtype). It
        raises ``ValueError`` naming the buffer when ``w``'s shape or dtype is not the input
        buffer's. Reads out of bounds and writes that do not cover every element of ``out``
        exactly once are found here: ``None``.
    """
    if len(func.params) != 2 or not all(tirx.is_buffer_var(p) for p in func.params):
        return None
    src, dst = func.params
    found = _copy_block(func)
    if found is None or src.dtype != dst.dtype:
        return None
    loops, block = found
    store = block.body
    if not (isinstance(store, tirx.BufferStore) and store.buffer.same_as(dst)
            and isinstance(store.value, TensorLoad) and store.value.source.same_as(src)):
        return None
    extents = [int(lp.extent.value) for lp in loops]
    shapes = [[d.value if isinstance(d, tirx.IntImm) else None for d in b.shape]
              for b in (src, dst)]
    if not loops or any(d is None for shape in shapes for d in shape) or not all(
            isinstance(iv.dom.extent, tirx.IntImm) and int(iv.dom.extent) == e
            and isinstance(iv.dom.min, tirx.IntImm) and int(iv.dom.min) == 0
            for iv, e in zip(block.iter_vars, extents)):
        return None
    grid = dict(zip((iv.var for iv in block.iter_vars),
                    np.indices(extents, dtype=np.int64, sparse=True)))
    reads = [_eval(i, grid) for i in store.value.indices]
    writes = [_eval(i, grid) for i in store.indices]
    if any(i is None for i in reads + writes):
        return None
    src_shape, dst_shape = tuple(shapes[0]), tuple(shapes[1])
    full = tuple(extents)
    try:  # flat element numbers; ravel_multi_index raises ValueError on an index out of bounds
        from_flat = np.ravel_multi_index([np.broadcast_to(i, full) for i in reads], src_shape)
        to_flat = np.ravel_multi_index([np.broadcast_to(i, full) for i in writes], dst_shape)
    except ValueError:
        return None
    size = int(np.prod(dst_shape))
    covered = np.zeros(size, dtype=bool)
    covered[to_flat.ravel()] = True
    if to_flat.size != size or not covered.all():
        return None  # some output element written twice or never

    def _run(weight: np.ndarray) -> np.ndarray:
        if weight.shape != src_shape or str(weight.dtype) != str(src.dtype):
            raise ValueError(f"layout copy of buffer {src.name}: weight {weight.dtype}"
                             f"{weight.shape}, expected {src.dtype}{src_shape}")
        out = np.empty(dst_shape, dtype=weight.dtype)
        out.reshape(-1)[to_flat.ravel()] = weight.reshape(-1)[from_flat.ravel()]
        return out

    return _run
