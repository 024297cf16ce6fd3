"""The recursive loop form: an ONNX ``Loop``/``Scan`` whose trip count or scan length is
known only at run time, as two Relax functions the VM runs.

Form (built by :func:`emit_recursive_loop`)
-------------------------------------------
* ``<node>_body(i, carried.., xs.., ys.., invariants..)`` -- one iteration, a dataflow
  function: row ``i`` of every scan input (``take_row`` kernel), the ONNX body converted
  by TVM's subgraph converter, the carried outputs, and row ``i`` of every scan output
  written in place into the preallocated ``ys`` (``call_tir_inplace`` of ``write_row``);
  see :mod:`relax_memplan.kernels.loop_rows`.  Returns ``(carried'.., ys..)``.
* ``<node>_loop(i, n, carried.., xs.., ys.., invariants..)`` -- the driver: ``if i < n``
  calls the body and then itself with ``i + 1``, else returns ``(carried.., ys..)``.
* ``<node>_chunks(i, n, ...)`` -- runs the driver on ``[i, min(i + 64, n))`` and then
  itself from there (:data:`CHUNK_ITERATIONS`), after checking ``n``.
* In the caller, the scan outputs ``[n, ...]`` are allocated once (``zeros``) and
  ``<node>_chunks`` is called with ``i = 0``.

Every carried output of the body is a fresh tensor (a ``copy`` kernel after the body, so
that it is never an input or a view of one), so that the body's outputs can live in two
storage slots that swap every iteration once
:class:`~relax_memplan.transform.hoist_loop_storage.HoistLoopStorage` has moved the
body's allocations out of the loop: iteration ``t`` reads slot ``t % 2`` and writes slot
``(t + 1) % 2``.  Every chunk but the last has an even length, so each chunk starts
writing the same slot.  The functions carry the attributes of
:mod:`relax_memplan.analysis.loop_form`, which that pass reads.

Recursion depth
---------------
The VM runs a Relax call as a C++ call: each level takes C++ stack.  With the default
8 MiB stack a plain recursion of 2,000 iterations ran and one of 3,000 crashed (measured
on this build).  In chunks of 64 the depth is ``n / 64 + 64``: at most 964 for
:data:`MAX_RECURSIVE_ITERATIONS`, which is checked at run time (an ``assert_op`` at the
entry of ``<node>_chunks``, a one-line error naming the node instead of a crash).
"""

from __future__ import annotations

from typing import Dict, List, Optional, Sequence

import tvm
from tvm import relax, tirx

from ...analysis.loop_form import (LOOP_BODY_ATTR, LOOP_CARRIED_ATTR, LOOP_DRIVER_ATTR,
                                   LOOP_OUTER_ATTR)
from ...kernels.loop_rows import (copy_kernel, iteration_kernel, take_row_kernel,
                                  write_row_kernel)

__all__ = ["emit_recursive_loop", "make_spec", "trip_count_var", "outer_names",
           "MAX_RECURSIVE_ITERATIONS", "CHUNK_ITERATIONS"]

CHUNK_ITERATIONS = 64
"""Iterations per call of the inner driver (even: see the module docstring)."""

MAX_RECURSIVE_ITERATIONS = CHUNK_ITERATIONS * 900
"""Largest iteration count of the recursive form (57,600), checked at run time: the
recursion is then at most 900 + 64 calls deep (see the module docstring)."""



def outer_names(graph) -> List[str]:
    """Names a body graph (and the graphs nested in it) reads from the enclosing scope."""
    defined = {v.name for v in graph.input} | {t.name for t in graph.initializer}
    used: List[str] = []
    for node in graph.node:
        names = list(node.input)
        for attr in node.attribute:
            for sub in ([attr.g] if attr.HasField("g") else []) + list(attr.graphs):
                names += outer_names(sub)
        used += [n for n in names if n and n not in defined and n not in used]
        defined.update(node.output)
    return used


def _fresh_type(ty, dims: Dict, origin: Optional[Dict] = None):
    """``ty`` with every non-constant dim a fresh var (one per distinct expression);
    ``origin`` (when given) maps each fresh var back to the expression it replaces."""
    if not isinstance(ty, relax.TensorType) or not isinstance(ty.shape, relax.ShapeExpr):
        return ty
    shape = []
    for dim in ty.shape.values:
        if isinstance(dim, tirx.IntImm):
            shape.append(dim)
            continue
        key = str(dim)
        if key not in dims:
            dims[key] = tirx.Var(f"d{len(dims)}", "int64")
            if origin is not None:
                origin[dims[key]] = dim
        shape.append(dims[key])
    return relax.TensorType(shape, ty.dtype)


def _fresh_params(values, prefix: str, dims: Dict, origin: Dict) -> List[relax.Var]:
    return [relax.Var(f"{prefix}{k}", _fresh_type(v.ty, dims, origin))
            for k, v in enumerate(values)]


def _fresh_copy(bb, value, where: str, i):
    """A new tensor equal to ``value`` (never an input or a view of one): a ``copy`` kernel
    call (FuseOps leaves it alone; it costs one pass over the carried state per iteration)."""
    ty = value.ty
    if not isinstance(ty, relax.TensorType) or not isinstance(ty.shape, relax.ShapeExpr):
        raise NotImplementedError(f"{where}: a loop-carried value is not a tensor of known rank")
    kernel = bb.add_func(copy_kernel(str(ty.dtype), len(ty.shape.values)), "copy")
    return bb.emit(relax.call_tir(kernel, [value, relax.prim_value(i)], ty))


class _Spec:
    """What one recursive loop is made of (the values are in the caller's scope)."""

    def __init__(self, node: str, where: str, count, carried: Sequence, xs: Sequence,
                 invariants: Dict[str, relax.Expr]):
        self.node, self.where, self.count = node, where, count
        self.carried, self.xs, self.invariants = list(carried), list(xs), dict(invariants)


def emit_recursive_loop(bb, importer, spec: _Spec, convert_body, num_scan_out: int):
    """Build ``<node>_body`` and ``<node>_loop``, call the loop from ``bb``'s function.

    Parameters
    ----------
    bb : relax.BlockBuilder
        The importer's builder, inside ``main``'s dataflow block.
    importer : ONNXGraphImporter
        TVM's importer (its ``bb`` is swapped while the body is converted).
    spec : _Spec
        Node, iteration count (PrimExpr of ``main``'s dims), carried and scanned values.
    convert_body : callable
        ``convert_body(sub_bb, iteration, carried_params, rows, invariant_params)`` -> (the
        body's carried outputs, its scan-output rows), emitted into ``sub_bb``.
    num_scan_out : int
        Number of scan outputs of the body.

    Returns
    -------
    (list of relax.Expr, list of relax.Expr, list of relax.Expr, str)
        Final carried values, scan outputs ``[count, ...]``, the body's outputs (one
        iteration's tensors, for the report) and the body function's name.

    Raises
    ------
    NotImplementedError
        When the body's outputs have no known shape (the message names the node).
    """
    body_gv, rows, origin, body_outs = _emit_body(bb, importer, spec, convert_body,
                                                  num_scan_out)
    loop_gv = _emit_loop(bb, spec, _emit_loop(bb, spec, body_gv), chunk=CHUNK_ITERATIONS)
    count = tvm.te.max(spec.count, tirx.IntImm("int64", 0))
    ys = []
    back = tvm.sym.Analyzer()  # the body's dims in the caller's terms
    for fresh, dim in origin.items():
        back.bind(fresh, dim)
    for ty in rows:
        shape = [count] + [back.simplify(d) for d in ty.shape.values]
        ys.append(bb.emit(relax.op.zeros(relax.ShapeExpr(shape), ty.dtype)))
    args = ([relax.ShapeExpr([tirx.IntImm("int64", 0)]), relax.ShapeExpr([spec.count])]
            + spec.carried + spec.xs + ys + list(spec.invariants.values()))
    result = bb.emit(relax.Call(loop_gv, args))
    items = [bb.emit(relax.TupleGetItem(result, k)) for k in range(len(spec.carried) + len(ys))]
    return items[:len(spec.carried)], items[len(spec.carried):], body_outs, body_gv.name_hint


def _emit_body(bb, importer, spec: _Spec, convert_body, num_scan_out: int):
    dims: Dict = {}
    origin: Dict = {}
    i = tirx.Var("i", "int64")
    i_param = relax.Var("i", relax.ShapeType([i]))
    carried = _fresh_params(spec.carried, "carried", dims, origin)
    xs = _fresh_params(spec.xs, "xs", dims, origin)
    inv = _fresh_params(list(spec.invariants.values()), "outer", dims, origin)
    sub = relax.BlockBuilder(bb.get())
    saved = importer.bb
    importer.bb = sub
    try:
        with sub.function(f"{_identifier(spec.node)}_body", private=True,
                          attrs={LOOP_BODY_ATTR: spec.node,
                                 LOOP_CARRIED_ATTR: len(spec.carried)}):
            with sub.dataflow():
                rows = [_take_row(sub, x, i) for x in xs]
                it = sub.emit(relax.call_tir(sub.add_func(iteration_kernel(), "iteration"),
                                             [relax.prim_value(i)],
                                             relax.TensorType([], "int64")))
                new_carried, rows_out = convert_body(sub, it, carried, rows,
                                                     dict(zip(spec.invariants, inv)))
                if len(rows_out) != num_scan_out or len(new_carried) != len(carried):
                    raise NotImplementedError(f"{spec.where}: the body's outputs do not match "
                                              "its loop-carried inputs")
                fresh = [sub.match_cast(_fresh_copy(sub, v, spec.where, i), p.ty)
                         for v, p in zip(new_carried, carried)]
                row_types = [_row_type(r, spec.where) for r in rows_out]
                ys_params = [relax.Var(f"ys{k}", relax.TensorType(
                    [tirx.Var(f"n{k}", "int64")] + list(ty.shape.values), ty.dtype))
                    for k, ty in enumerate(row_types)]
                written = [_write_row(sub, y, r, ty, i)
                           for y, r, ty in zip(ys_params, rows_out, row_types)]
                out = sub.emit_output(relax.Tuple(fresh + written))
            sub.emit_func_output(out, params=[i_param] + carried + xs + ys_params + inv)
    finally:
        importer.bb = saved
    body_gv = _merge(bb, sub.get(), spec.node)
    return body_gv, row_types, origin, list(new_carried) + list(rows_out)


def _take_row(sub, x, i):
    kernel = sub.add_func(take_row_kernel(str(x.ty.dtype), x.ty.ndim - 1), "take_row")
    row_ty = relax.TensorType(list(x.ty.shape.values)[1:], x.ty.dtype)
    return sub.emit(relax.call_tir(kernel, [x, relax.prim_value(i)], row_ty))


def _write_row(sub, ys, row, ty, i):
    kernel = sub.add_func(write_row_kernel(str(ty.dtype), len(ty.shape.values)), "write_row")
    return sub.emit(relax.call_tir_inplace(kernel, [ys, row, relax.prim_value(i)], [0], ys.ty))


def _row_type(row, where: str) -> relax.TensorType:
    ty = row.ty
    if not isinstance(ty, relax.TensorType) or not isinstance(ty.shape, relax.ShapeExpr):
        raise NotImplementedError(f"{where}: a scan output of the body has no known shape")
    return ty


def _identifier(node: str) -> str:
    name = "".join(c if c.isalnum() else "_" for c in node) or "loop"
    return name if not name[0].isdigit() else f"n{name}"


def _merge(bb, mod: tvm.IRModule, node: str):
    """Put the functions ``mod`` added into ``bb``'s module; the body's GlobalVar."""
    known = {gv.name_hint for gv in bb.get().get_global_vars()}
    target = None
    for gv, func in mod.functions_items():
        if gv.name_hint in known:
            continue
        attrs = func.attrs if isinstance(func, relax.Function) else None
        if attrs is not None and LOOP_BODY_ATTR in attrs and str(attrs[LOOP_BODY_ATTR]) == node:
            target = gv
        bb.update_func(gv, func)
    if target is None:
        raise NotImplementedError(f"{node}: the loop body function was not built")
    return target


def _emit_loop(bb, spec: _Spec, callee_gv, chunk: Optional[int] = None):
    """A self-calling driver ``f(i, n, state..)``: ``if i < n`` run ``callee`` and call
    itself on the rest.

    Without ``chunk`` (the inner driver), ``callee`` is the body, run for iteration ``i``;
    the driver calls itself with ``i + 1``.  With ``chunk`` (the outer driver), ``callee``
    is the inner driver, run for iterations ``[i, min(i + chunk, n))``; the driver calls
    itself with ``min(i + chunk, n)`` and checks ``n`` against
    :data:`MAX_RECURSIVE_ITERATIONS` first.
    """
    callee = bb.get()[callee_gv]
    skip = 1 if chunk is None else 2
    dims: Dict = {}
    i, n = tirx.Var("i", "int64"), tirx.Var("n", "int64")
    state = [relax.Var(p.name, _fresh_type(p.ty, dims)) for p in list(callee.params)[skip:]]
    head = [relax.Var("i", relax.ShapeType([i])), relax.Var("n", relax.ShapeType([n]))]
    num_carried, num_xs = len(spec.carried), len(spec.xs)
    num_out = len(callee.ret_ty.fields)
    positions = list(range(num_carried)) + list(
        range(num_carried + num_xs, num_carried + num_xs + num_out - num_carried))
    ret_ty = relax.TupleType([state[k].ty for k in positions])
    # a placeholder gives the GlobalVar its type, so that the driver can call itself
    holder_params = [relax.Var(v.name, v.ty) for v in head + state]
    holder = relax.Function(holder_params, relax.Tuple([holder_params[2 + k] for k in positions]),
                            ret_ty)
    suffix = "loop" if chunk is None else "chunks"
    loop_gv = bb.add_func(holder, f"{_identifier(spec.node)}_{suffix}")
    following = i + 1 if chunk is None else tvm.te.min(i + chunk, n)
    args = [head[0]] + ([] if chunk is None else [relax.ShapeExpr([following])])
    call = bb.normalize(relax.Call(callee_gv, args + state))
    step = relax.Var("step", call.ty)
    steps = [relax.VarBinding(step, call)]
    nxt = list(state)
    for j, k in enumerate(positions):
        item = relax.Var(f"next{j}", call.ty.fields[j])
        steps.append(relax.VarBinding(item, relax.TupleGetItem(step, j)))
        nxt[k] = item
    rec_call = bb.normalize(relax.Call(loop_gv, [relax.ShapeExpr([following]), head[1]] + nxt))
    rec = relax.Var("rec", rec_call.ty)
    steps.append(relax.VarBinding(rec, rec_call))
    then = relax.SeqExpr([relax.BindingBlock(steps)], rec)
    done = relax.Var("done", ret_ty)
    els = relax.SeqExpr([relax.BindingBlock([relax.VarBinding(
        done, relax.Tuple([state[k] for k in positions]))])], done)
    res = relax.Var("res", ret_ty)
    bindings = [relax.VarBinding(res, relax.If(i < n, then, els))]
    if chunk is not None:
        message = (f"{spec.where}: {{}} iterations are above the recursive loop limit "
                   f"{MAX_RECURSIVE_ITERATIONS}")
        bindings.insert(0, relax.VarBinding(relax.Var("check", relax.TupleType([])),
                                            relax.op.assert_op(
            relax.prim_value(n <= MAX_RECURSIVE_ITERATIONS), [relax.prim_value(n)], message)))
    func = relax.Function(head + state, relax.SeqExpr([relax.BindingBlock(bindings)], res),
                          ret_ty)
    attr = LOOP_DRIVER_ATTR if chunk is None else LOOP_OUTER_ATTR
    func = func.with_attrs({attr: callee_gv.name_hint, "relax.force_pure": True})
    bb.update_func(loop_gv, bb.normalize(func))
    return loop_gv


def make_spec(node: str, where: str, count, carried, xs, invariants) -> _Spec:
    """The description :func:`emit_recursive_loop` builds from."""
    return _Spec(node, where, count, carried, xs, invariants)


def trip_count_var(bb, trip, where: str):
    """A run-time trip count as a PrimExpr of ``bb``'s function: a shape expression as it
    is (TVM's importer computes ``Shape(x)[0]`` as one), an int64 tensor of one element
    through ``tensor_to_shape`` and a ``match_cast`` defining a new var."""
    ty = trip.ty
    if isinstance(ty, tvm.ir.PrimType):
        return trip if str(ty.dtype) == "int64" else tirx.Cast("int64", trip)
    if not isinstance(ty, relax.TensorType) or str(ty.dtype) != "int64":
        raise NotImplementedError(f"{where}: the trip count is not an int64 scalar ({ty})")
    flat = bb.emit(relax.op.reshape(trip, relax.ShapeExpr([1])))
    shape = bb.emit(relax.op.tensor_to_shape(flat))
    m = tirx.Var("trip_count", "int64")
    bb.match_cast(shape, relax.ShapeType([m]))
    return m
