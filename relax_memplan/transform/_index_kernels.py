"""The ops :class:`CheckIndexBounds` guards and the TIR kernel that checks their indices.

A check kernel takes the indexed tensor (only its shape is read) and the indices, asserts that
every index lies in its valid range and copies the indices to its output, which the guarded op
then reads: the op cannot run before the check and dead-code elimination cannot drop it.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import List, Optional, Tuple

from tvm import relax, tirx
from tvm.ir import StringImm
from tvm.s_tir import SBlock, SBlockRealize

__all__ = ["GuardedOp", "GUARDED_OPS", "index_axes", "check_kernel", "dtype_name"]


@dataclass(frozen=True)
class GuardedOp:
    """A Relax op whose memory access depends on the values of one of its arguments.

    Attributes
    ----------
    onnx_name : str
        The ONNX operator it comes from, for messages.
    indices_arg : int
        Position of the indices among the call's arguments (the indexed tensor is argument 0).
    wraps_negative : bool
        The kernel itself maps ``-s..-1`` to ``0..s-1`` (valid ``[-s, s-1]``); otherwise only
        ``[0, s-1]`` is safe (TVM's ONNX importer maps negative indices before these ops).
    coordinates : bool
        The last axis of the indices holds one coordinate per data axis (GatherND, ScatterND).
    """

    onnx_name: str
    indices_arg: int = 1
    wraps_negative: bool = False
    coordinates: bool = False


GUARDED_OPS = {
    # topi.take in mode "fast" (the ONNX importer's) loads data[idx] unchecked
    "relax.take": GuardedOp("Gather"),
    "relax.gather_elements": GuardedOp("GatherElements"),
    "relax.gather_nd": GuardedOp("GatherND", coordinates=True),
    # topi.scatter_elements adds s to a negative index, then stores unchecked
    "relax.scatter_elements": GuardedOp("ScatterElements", wraps_negative=True),
    "relax.scatter_nd": GuardedOp("ScatterND", coordinates=True),
}
"""Guarded ops by Relax op name. Not guarded, because their kernels cannot leave the tensor:
``take`` in mode ``clip``/``wrap``; ``one_hot`` (compares each index with ``0..depth-1``);
``dynamic_strided_slice`` (clamps begin and end to the axis); ``strided_slice`` with constant
bounds (checked at import). ``strided_slice`` with symbolic bounds and ``assume_inbound`` is
checked at compile time against the declared dim ranges (:mod:`._index_bounds`)."""


def index_axes(op_name: str, call: relax.Call) -> Optional[List[int]]:
    """Data axes the indices address: one axis, or one per coordinate (GatherND/ScatterND);
    ``None`` when the ranks are unknown or ``take`` flattens the data (no axis)."""
    data_ty, idx_ty = call.args[0].ty, call.args[GUARDED_OPS[op_name].indices_arg].ty
    rank = getattr(data_ty, "ndim", -1)
    if rank is None or rank < 0:
        return None
    if GUARDED_OPS[op_name].coordinates:
        shape = getattr(idx_ty, "shape", None)
        if shape is None or not isinstance(shape[-1], tirx.IntImm):
            return None
        first = int(call.attrs.batch_dims) if op_name == "relax.gather_nd" else 0
        return [first + j for j in range(int(shape[-1]))]
    axis = call.attrs.axis
    if axis is None:
        return None
    return [int(axis) % rank]


_OPAQUE = 8
"""``relay.op.OpPattern.OPAQUE``: never fused."""


def dtype_name(ty) -> str:
    """``"int64"`` for a ``relax.TensorType`` (its ``dtype`` is a PrimType in TVM 0.27)."""
    dtype = ty.dtype
    return str(getattr(dtype, "dtype", dtype))


def _bounds(extent, dtype: str, wraps_negative: bool) -> Tuple[tirx.PrimExpr, tirx.PrimExpr]:
    s = extent if dtype == "int64" else tirx.Cast(dtype, extent)
    return (-s if wraps_negative else tirx.const(0, dtype)), s - tirx.const(1, dtype)


def check_kernel(data_ty, idx_ty, axes: List[int], coordinates: bool, wraps_negative: bool,
                 message: str) -> tirx.PrimFunc:
    """A PrimFunc ``(data, indices) -> copy of indices`` asserting every index is in range.

    Parameters
    ----------
    data_ty, idx_ty : relax.TensorType
        Types of the indexed tensor (known rank) and of the indices (known rank, int dtype).
    axes : list of int
        Data axis of the index (one) or of each coordinate (``coordinates``).
    coordinates : bool
        The last indices axis holds coordinates: coordinate ``j`` is checked against
        ``data.shape[axes[j]]``.
    wraps_negative : bool
        Accept ``[-s, s-1]`` instead of ``[0, s-1]``.
    message : str
        The assertion message (the VM raises it as an ``IndexError``).
    """
    dtype = dtype_name(idx_ty)
    data_shape = [tirx.Var(f"d{i}", "int64") for i in range(data_ty.ndim)]
    idx_shape = [tirx.Var(f"n{i}", "int64") for i in range(idx_ty.ndim)]
    if coordinates:
        idx_shape[-1] = tirx.IntImm("int64", len(axes))
    data = tirx.decl_buffer(data_shape, dtype_name(data_ty), "data")
    idx = tirx.decl_buffer(idx_shape, dtype, "indices")
    out = tirx.decl_buffer(idx_shape, dtype, "checked")
    loops = [tirx.Var(f"i{k}", "int64") for k in range(len(idx_shape) - (1 if coordinates else 0))]
    stmts = []
    for j, axis in enumerate(axes):
        at = loops + [tirx.IntImm("int64", j)] if coordinates else loops
        value = tirx.BufferLoad(idx, at)
        lo, hi = _bounds(data_shape[axis], dtype, wraps_negative)
        # TVM 0.27's Python AssertStmt passes its arguments positionally to a constructor
        # taking (condition, kind, message_parts), whatever its signature says.
        stmts.append(tirx.AssertStmt(tirx.all(value >= lo, value <= hi), StringImm("IndexError"),
                                     [StringImm(message)]))
        stmts.append(tirx.BufferStore(out, value, at))
    body = tirx.SeqStmt(stmts) if len(stmts) > 1 else stmts[0]
    for var, extent in reversed(list(zip(loops, idx_shape))):
        body = tirx.For(var, tirx.IntImm("int64", 0), extent, tirx.ForKind.SERIAL, body)
    # TVM 0.27: buffers are the PrimFunc's parameters (no separate buffer map). Opaque
    # (op_pattern 8, kept by AnnotateTIROpPattern): FuseOps leaves it alone, since FuseTIR
    # cannot merge a kernel without blocks.
    # Relax passes (RewriteDataflowReshape) expect a root block around the body.
    root = SBlockRealize([], True, SBlock([], [], [], "root", body))
    return tirx.PrimFunc([data, idx, out], root).with_attrs(
        {"tir.noalias": True, "op_pattern": _OPAQUE})
