"""Static storage summary of a Relax function after memory planning.

Counts what the VM will allocate for one call, read off the IR between the
static planner(s) and ``LowerAllocTensor``:

* ``R.memory.alloc_storage`` -- planned storage (our arenas and TVM's storage
  tokens), bytes from its constant size;
* ``R.builtin.alloc_tensor`` -- tensors no planner took (function outputs,
  tensors a callee may retain, symbolic sizes); each becomes its own
  ``alloc_storage`` of the tensor's bytes when lowered.

Both pipelines are summarised by the same code, so the comparison between our
planner and TVM's ``StaticPlanBlockMemory`` is like for like.
"""

from __future__ import annotations

from dataclasses import dataclass

import tvm
from tvm import relax, tirx

from .liveness import dtype_size_bytes

__all__ = ["StorageSummary", "summarize_storage"]


@dataclass(frozen=True)
class StorageSummary:
    """Bytes a function allocates per call, by kind (all sizes in bytes).

    Attributes
    ----------
    planned_bytes : int
        Sum of constant ``alloc_storage`` sizes (arenas and storage tokens).
    num_planned_storages : int
        Number of such ``alloc_storage`` calls.
    unplanned_bytes : int
        Sum of the bytes of constant-shape tensors left as ``builtin.alloc_tensor``.
    num_unplanned : int
        Number of those tensors.
    num_symbolic : int
        Allocations whose size is only known at run time (not in the sums).
    """

    planned_bytes: int
    num_planned_storages: int
    unplanned_bytes: int
    num_unplanned: int
    num_symbolic: int

    @property
    def static_total_bytes(self) -> int:
        """Bytes the VM allocates per call for the constant-size allocations."""
        return self.planned_bytes + self.unplanned_bytes


def _zero():
    return {"planned": 0, "n_planned": 0, "unplanned": 0, "n_unplanned": 0, "symbolic": 0}


def _static_bytes(shape_expr, dtype: str):
    if not isinstance(shape_expr, relax.ShapeExpr):
        return None
    n = 1
    for d in shape_expr.values:
        if not isinstance(d, tirx.IntImm):
            return None
        n *= int(d)
    return dtype_size_bytes(dtype, n)


def _count_call(call, counts) -> None:
    if not isinstance(call, tvm.ir.Call) or not isinstance(call.op, tvm.ir.Op):
        return
    name = call.op.name
    if name == "relax.memory.alloc_storage":
        # The size of an alloc_storage is in bytes whatever its dtype hint (the
        # VM lowers the hint to uint8).
        key, nbytes = "planned", _static_bytes(call.args[0], "uint8")
    elif name == "relax.builtin.alloc_tensor":
        key, nbytes = "unplanned", _static_bytes(call.args[0], str(call.args[1].value))
    else:
        return
    if nbytes is None:
        counts["symbolic"] += 1
    else:
        counts[key] += nbytes
        counts["n_" + key] += 1


def _summarize_seq(seq: relax.SeqExpr):
    counts = _zero()
    for block in seq.blocks:
        for binding in block.bindings:
            value = binding.value
            if isinstance(value, relax.If):
                branches = [_summarize_seq(value.true_branch), _summarize_seq(value.false_branch)]
                worst = max(branches, key=lambda c: c["planned"] + c["unplanned"])
                for k in counts:
                    counts[k] += worst[k]
            else:
                _count_call(value, counts)
    return counts


def summarize_storage(func: relax.Function) -> StorageSummary:
    """Summarise the allocations of ``func`` (after static planning).

    Parameters
    ----------
    func : relax.Function
        A function between ``StaticPlanBlockMemory`` and ``LowerAllocTensor``.

    Returns
    -------
    StorageSummary
        Allocation counts and bytes. For an ``R.If`` the branch with more
        constant bytes is counted (the larger of the two run-time paths).
    """
    counts = _summarize_seq(func.body) if isinstance(func.body, relax.SeqExpr) else _zero()
    return StorageSummary(
        planned_bytes=counts["planned"],
        num_planned_storages=counts["n_planned"],
        unplanned_bytes=counts["unplanned"],
        num_unplanned=counts["n_unplanned"],
        num_symbolic=counts["symbolic"],
    )
