"""What the report says about each loop or recurrence the converters produced.

The ``recurrent`` and ``unroll_loops`` converter steps call :func:`record_loop` for every
node they convert (while :func:`~relax_memplan.frontend.prepare.converters.corrected_converters`
is active); the importer then stores the records on ``main`` as the function attribute
``relax_memplan.loops`` (:func:`attach_loops`), and the compile report reads them back
with :func:`loops_of` and evaluates them at each measured shape (:meth:`LoopFacts.at`).

Quantities (bytes, iterations) are PrimExprs of the graph's symbolic dims or ints.
"""

from __future__ import annotations

import threading
from dataclasses import dataclass, replace
from typing import Dict, List, Mapping, Optional, Tuple, Union

import numpy as np
import tvm
from tvm import relax, tirx

from ...analysis.dims import evaluate_bytes

__all__ = ["LoopFacts", "record_loop", "collecting_loops", "attach_loops", "loops_of",
           "with_body_plans", "record_trip_counts", "LOOPS_ATTR"]

LOOPS_ATTR = "relax_memplan.loops"
"""Function attribute of ``main``: one map per loop/recurrence (see :class:`LoopFacts`)."""

_state = threading.local()

Quantity = Union[int, "tvm.ir.PrimExpr"]


@dataclass(frozen=True)
class LoopFacts:
    """One loop or recurrence of the model.

    Attributes
    ----------
    node, op : str
        ONNX node name and op type (``LSTM``, ``GRU``, ``Loop``, ``Scan``).
    form : str
        ``"kernel"`` (the time loop inside one TIR kernel), ``"unrolled"`` or
        ``"recursive"`` (a body function called once per iteration by a self-calling
        driver, see :mod:`~relax_memplan.frontend.prepare.recursive_loops`).
    iterations : int or PrimExpr
        Steps per call (a symbolic sequence length for a kernel).
    carried_state_bytes : int or PrimExpr
        Bytes of the state carried from one iteration to the next (one copy).
    body_bytes : int or PrimExpr
        Bytes one iteration works in: for a kernel its scratch output (0 when it keeps
        the step's gates in registers); unrolled or recursive, the tensors one iteration
        produces (static shapes only).
    function : str
        Recursive form: the body's Relax function ("" otherwise).
    body_arena_bytes, body_lower_bound_bytes : int
        Recursive form, after the build: the body function's arena (allocated once per
        call of the model, not per iteration) and the peak live bytes of its planned
        tensors; -1 when unknown (not built yet, or not planned by us).
    trip_input : str
        The graph input holding a run-time trip count ("" when the count is a constant, a
        shape or computed).
    trip_counts : tuple of (int, bool)
        Per measured shape row, in order: the value ``trip_input`` had in that run and
        whether it was given (``--input``) rather than drawn at random
        (:func:`record_trip_counts`).
    """

    node: str
    op: str
    form: str
    iterations: Quantity
    carried_state_bytes: Quantity
    body_bytes: Quantity
    function: str = ""
    body_arena_bytes: int = -1
    body_lower_bound_bytes: int = -1
    trip_input: str = ""
    trip_counts: Tuple[Tuple[int, bool], ...] = ()

    def at(self, dims: Mapping[str, int], row: Optional[int] = None) -> Dict[str, int]:
        """The quantities at ``dims`` (dim name -> value), as ints (-1 when a dim is missing);
        with ``row`` (index of a measured shape) a run-time trip count is the value its input
        had there (ONNX ``Loop``: ``M`` iterations, none when ``M <= 0``)."""
        out = {key: _evaluate(getattr(self, key), dims)
               for key in ("iterations", "carried_state_bytes", "body_bytes")}
        if out["iterations"] < 0 and row is not None and row < len(self.trip_counts):
            out["iterations"] = max(self.trip_counts[row][0], 0)
        return out

    def to_dict(self, shapes: List[Mapping[str, int]]) -> Dict:
        """JSON-ready: the symbolic quantities as text and their values at ``shapes``."""
        out = {"node": self.node, "op": self.op, "form": self.form}
        out.update({k: _text(getattr(self, k))
                    for k in ("iterations", "carried_state_bytes", "body_bytes")})
        if self.form == "recursive":
            out.update(function=self.function, body_arena_bytes=self.body_arena_bytes,
                       body_lower_bound_bytes=self.body_lower_bound_bytes)
        if self.trip_input:
            out["trip_input"] = self.trip_input
        out["at_shapes"] = [{"dims": dict(d), **self.at(d, k)} for k, d in enumerate(shapes)]
        for k, at in enumerate(out["at_shapes"]):
            if k < len(self.trip_counts):
                at["trip_count_given"] = self.trip_counts[k][1]
        return out


def _text(value) -> Union[int, str]:
    return int(value) if isinstance(value, (int, tirx.IntImm)) else str(value)


def _evaluate(value, dims: Mapping[str, int]) -> int:
    if isinstance(value, int):
        return value
    try:
        return evaluate_bytes(value, dims)
    except ValueError:
        return -1


def tensor_bytes(expr) -> Quantity:
    """Bytes of a Relax tensor value from its type (0 when unknown)."""
    ty = getattr(expr, "ty", None)
    if not isinstance(ty, relax.TensorType) or not isinstance(ty.shape, relax.ShapeExpr):
        return 0
    dtype = tvm.runtime.DataType(str(ty.dtype))
    size = tirx.IntImm("int64", (dtype.bits * dtype.lanes + 7) // 8)
    for dim in ty.shape.values:
        size = size * dim
    return tvm.sym.Analyzer().simplify(size)


def record_loop(**facts) -> None:
    """Record one converted loop (the fields of :class:`LoopFacts`); no-op outside
    :func:`collecting_loops`."""
    records = getattr(_state, "records", None)
    if records is not None:
        records.append(LoopFacts(**facts))


class collecting_loops:  # noqa: N801 -- a context manager
    """Collect :func:`record_loop` calls into the list it yields."""

    def __enter__(self) -> List[LoopFacts]:
        self._saved = getattr(_state, "records", None)
        _state.records = []
        return _state.records

    def __exit__(self, *exc):
        _state.records = self._saved
        return False


def attach_loops(mod: tvm.IRModule, records: List[LoopFacts]) -> tvm.IRModule:
    """``mod`` with ``main`` carrying :data:`LOOPS_ATTR` (unchanged when no record)."""
    if not records or "main" not in [gv.name_hint for gv in mod.get_global_vars()]:
        return mod
    value = [{"node": r.node, "op": r.op, "form": r.form, "function": r.function,
              "iterations": _as_expr(r.iterations),
              "carried_state_bytes": _as_expr(r.carried_state_bytes),
              "body_bytes": _as_expr(r.body_bytes), "trip_input": r.trip_input}
             for r in records]
    mod = mod.shallow_copy() if hasattr(mod, "shallow_copy") else mod
    mod["main"] = mod["main"].with_attr(LOOPS_ATTR, value)
    return mod


def _as_expr(value):
    return tirx.IntImm("int64", value) if isinstance(value, int) else value


def loops_of(mod: tvm.IRModule) -> List[LoopFacts]:
    """The records :func:`attach_loops` stored on ``main`` (empty when none)."""
    try:
        attrs = mod["main"].attrs
    except (KeyError, tvm.TVMError, ValueError):
        return []
    if attrs is None or LOOPS_ATTR not in attrs:
        return []
    out = []
    for entry in attrs[LOOPS_ATTR]:
        quantities = {k: _simplified(entry[k])
                      for k in ("iterations", "carried_state_bytes", "body_bytes")}
        out.append(LoopFacts(node=str(entry["node"]), op=str(entry["op"]),
                             form=str(entry["form"]), function=str(entry.get("function", "")),
                             trip_input=str(entry.get("trip_input", "")), **quantities))
    return out


def with_body_plans(loops: List[LoopFacts], plans: Mapping) -> List[LoopFacts]:
    """``loops`` with each recursive loop's body arena and lower bound filled from our
    static planner's plans (``PlanStaticMemory.plans``: function name -> plan with
    ``arena_bytes`` and ``lower_bound_bytes``)."""
    out = []
    for loop in loops:
        plan = plans.get(loop.function) if loop.form == "recursive" else None
        if plan is not None and plan.arenas:
            loop = replace(loop, body_arena_bytes=int(plan.arena_bytes),
                           body_lower_bound_bytes=int(plan.lower_bound_bytes))
        out.append(loop)
    return out


def _simplified(expr):
    return int(expr) if isinstance(expr, tirx.IntImm) else expr


def record_trip_counts(loops: List[LoopFacts], feed: Mapping, given: Mapping) -> List[str]:
    """Append to each loop with a run-time trip count input (``trip_input`` in ``feed``, the
    arrays of one run) the value it had, in place in ``loops``; return one note per loop
    whose count was drawn at random (not in ``given``, the ``--input`` values): a random
    count of 0 runs the loop zero times, which the output alone does not show."""
    notes = []
    for k, loop in enumerate(loops):
        if not loop.trip_input or loop.trip_input not in feed:
            continue
        value = int(np.asarray(feed[loop.trip_input]).reshape(-1)[0])
        is_given = loop.trip_input in given
        loops[k] = replace(loop, trip_counts=loop.trip_counts + ((value, is_given),))
        if not is_given:
            notes.append(f"{loop.op} '{loop.node}': trip count input {loop.trip_input} was "
                         f"random, {loop.trip_input}={value} ({max(value, 0)} iterations); "
                         f"--input {loop.trip_input}=N sets it")
    return notes
