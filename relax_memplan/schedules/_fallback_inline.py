"""Access analysis and inlining for :class:`~relax_memplan.schedules.SpatialFallback`.

Which accesses of a block are unit-stride in a loop variable (:func:`contiguous_in`), and which
spatial blocks writing intermediate buffers are inlined into their consumer
(:func:`inline_intermediates`; the rules and measurements are in
:mod:`relax_memplan.schedules.cpu_fallback`'s docstring).
"""

from __future__ import annotations

import tvm
from tvm import s_tir, tirx
from tvm.s_tir.dlight.analysis import get_root_block

from ._column_reduction import column_reduction_lead
from .cpu_matmul import _ScheduleError

__all__ = ["contiguous_in", "inline_intermediates", "is_spatial", "last_index",
           "unit_stride_ignoring_unit_dims", "writes_contiguous_in"]

def _uses(expr, var) -> bool:
    return any(v.same_as(var) for v in tirx.analysis.undefined_vars(expr)) \
        if not isinstance(expr, (tirx.IntImm, tirx.FloatImm)) else False


def _unit_stride_last(indices, var) -> bool:
    """``var`` absent from ``indices``, or only in the last one as ``var`` or ``var + e``."""
    *leading, last = indices
    if any(_uses(i, var) for i in leading):
        return False
    if not _uses(last, var) or (isinstance(last, tirx.Var) and last.same_as(var)):
        return True
    if isinstance(last, (tirx.Add, tirx.Sub)):
        a, b = last.a, last.b
        if isinstance(a, tirx.Var) and a.same_as(var) and not _uses(b, var):
            return True
        if isinstance(last, tirx.Add) and isinstance(b, tirx.Var) and b.same_as(var) \
                and not _uses(a, var):
            return True
    return False


def contiguous_in(block: s_tir.SBlock, var) -> bool:
    """Every region ``block`` reads or writes is one element, unit-stride (or invariant) in ``var``."""
    return _contiguous(list(block.reads) + list(block.writes), var)


def writes_contiguous_in(block: s_tir.SBlock, var) -> bool:
    """Every region ``block`` writes is one element, unit-stride (or invariant) in ``var`` (its
    reads may not be: a transpose, a nearest resize)."""
    return _contiguous(list(block.writes), var)


def _contiguous(accesses, var) -> bool:
    for access in accesses:
        region = access.region
        last = _without_unit_tail(access)
        if region and not (isinstance(region[len(last) - 1].extent, tirx.IntImm)
                           and region[len(last) - 1].extent.value == 1):
            # a range in the last dim (a data-dependent index: relax's nearest resize reads
            # ``x[n, c, 0:H, 0:W]``): its stride is unknown
            return False
        if any(_uses(rng.min, var) and not (isinstance(rng.extent, tirx.IntImm)
                                            and rng.extent.value == 1) for rng in region):
            return False
        if region and not _unit_stride_last(_without_unit_tail(access), var):
            return False
    return True


def unit_stride_ignoring_unit_dims(access, var) -> bool:
    """Whether ``access`` (one element) is unit-stride or invariant in ``var`` once its indices
    into trailing dims of extent 1 are dropped whatever they are (such an index is 0 whenever
    the access is in bounds: a 1x1 convolution reads ``pad[n, c, y + ry, x + rx]`` of a
    ``(1, C, 1, 1)`` buffer at unit stride in ``c``)."""
    if any(not (isinstance(rng.extent, tirx.IntImm) and rng.extent.value == 1)
           for rng in access.region):
        return False
    indices = [rng.min for rng in access.region]
    shape = access.source.shape
    while len(indices) > 1 and isinstance(shape[len(indices) - 1], tirx.IntImm) and \
            shape[len(indices) - 1].value == 1:
        indices.pop()
    return _unit_stride_last(indices, var)


def last_index(access):
    """The last index of ``access`` that is not a constant into a trailing dim of extent 1."""
    return _without_unit_tail(access)[-1] if access.region else None


def _without_unit_tail(access) -> list:
    """The indices of ``access`` less trailing constant ones into dims of extent 1, which do
    not change the stride of the dims before them (magika's squeeze: ``x[0, c, i, 0]`` of a
    ``(1, C, L, 1)`` buffer is unit-stride in ``i``)."""
    indices = [rng.min for rng in access.region]
    shape = access.source.shape
    while len(indices) > 1 and isinstance(indices[-1], tirx.IntImm) and \
            isinstance(shape[len(indices) - 1], tirx.IntImm) and \
            shape[len(indices) - 1].value == 1:
        indices.pop()
    return indices


def is_spatial(block: s_tir.SBlock) -> bool:
    return all(iv.iter_type == tirx.IterVar.DataPar for iv in block.iter_vars)


def _reads_one_element(consumer: s_tir.SBlock, buffer) -> bool:
    """``consumer`` reads ``buffer`` through one access of one element per iteration (not a
    window, whose elements an inlined producer would compute once per read)."""
    reads = [r for r in consumer.reads if r.source.same_as(buffer)]
    return len(reads) == 1 and all(isinstance(rng.extent, tirx.IntImm) and rng.extent.value == 1
                                   for rng in reads[0].region)


def _reads_each_element_once(consumer: s_tir.SBlock, buffer) -> bool:
    """``consumer`` reads ``buffer`` through one access whose indices are distinct iter vars of
    ``consumer`` (or constants), every iter var of extent > 1 among them: each element once
    over all iterations, so a producer inlined into it -- a reduction included -- computes
    every element once."""
    reads = [r for r in consumer.reads if r.source.same_as(buffer)]
    if len(reads) != 1 or not _reads_one_element(consumer, buffer):
        return False
    iter_vars = [iv.var for iv in consumer.iter_vars]
    seen = []
    for rng in reads[0].region:
        index = rng.min
        if isinstance(index, tirx.IntImm):
            continue
        if not (isinstance(index, tirx.Var) and any(index.same_as(v) for v in iter_vars)) \
                or any(index.same_as(v) for v in seen):
            return False
        seen.append(index)
    # an iter var the index leaves out (a broadcast) reads each element once per its value
    return all(any(iv.var.same_as(v) for v in seen) for iv in consumer.iter_vars
               if not (isinstance(iv.dom.extent, tirx.IntImm) and iv.dom.extent.value == 1))


_CHILDREN = ("a", "b", "value", "args", "condition", "true_value", "false_value")


def _selects(block: s_tir.SBlock) -> bool:
    """``block`` picks between values (``if_then_else``, ``Select``: a concat, padding).
    (TVM 0.27's Python API has no TIR expression visitor: a walk over the operand fields.)"""
    stack = [block.body]
    while stack:
        node = stack.pop()
        if isinstance(node, tirx.Select) or (isinstance(node, tvm.ir.Call) and str(
                getattr(node.op, "name", "")).endswith("if_then_else")):
            return True
        for field in _CHILDREN:
            child = getattr(node, field, None)
            if isinstance(child, (list, tuple)) or type(child).__name__ == "Array":
                stack.extend(child)
            elif isinstance(child, tvm.ir.expr.Expr):
                stack.append(child)
    return False


def _may_inline_into(sch: s_tir.Schedule, consumer, buffer) -> bool:
    """A producer of ``buffer`` may be inlined into ``consumer``: a spatial block reading one
    element per iteration, or a column reduction (:mod:`._column_reduction`) reading each
    element once (magika's ``sum(x * x)``: the square computed in the vector loop)."""
    node = sch.get(consumer)
    if is_spatial(node):
        return _reads_one_element(node, buffer)
    return _reads_each_element_once(node, buffer) and \
        column_reduction_lead(sch, consumer, contiguous_in) is not None


def inline_intermediates(sch: s_tir.Schedule, blocks):
    """``compute_inline`` every spatial block writing a root-allocated buffer that one spatial
    consumer reads one element at a time; (whether any was, names of the blocks kept because
    several consumers read them).

    A chain like inference batch-norm (``(x - mean) / sqrt(var + eps) * gamma + beta``,
    then relu) is legalized as one full-size intermediate buffer per step; inlined, the
    last block reads ``x`` once and writes once, as TOPI's injective schedule does. A block
    read by several consumers, or through a window, stays: inlined it would be recomputed.
    Repeated until nothing changes, for a block left with one consumer that reads it at plain
    distinct indices (each element once) when the block itself reads its inputs unit-stride
    (element-wise, no layout arithmetic): magika's tanh-GELU reads ``x + b`` from five blocks
    that become one (2.0 -> 0.44 ms, one thread); yolov8n's concat of reshaped maps read by
    a split stays (inlined too, its div/mod indices ran 1.3-1.6x slower than TVM's loops).
    """
    changed, shared = _inline_pass(sch, blocks)
    any_changed = changed
    while changed:
        changed, shared = _inline_pass(sch, sch.get_child_blocks(get_root_block(sch)),
                                       plain_reads_only=True)
    return any_changed, shared


def _inline_pass(sch: s_tir.Schedule, blocks, plain_reads_only: bool = False):
    """One pass of :func:`inline_intermediates` over ``blocks`` in program order
    (``plain_reads_only``: only into a consumer reading each element once, at plain indices)."""
    local = list(sch.get(get_root_block(sch)).alloc_buffers)
    changed = False
    shared = []
    for block in blocks:
        node = sch.get(block)
        if not is_spatial(node):
            continue
        if not all(any(buf.same_as(w.source) for buf in local) for w in node.writes):
            continue
        consumers = sch.get_consumers(block)  # none: a dead block, inlining removes it
        if len(consumers) > 1:
            # inlined, it would be computed once per consumer: ultraface's box decoding (a
            # concat of transposes read by two slices, an exp read by four) took 0.117 ms all
            # inlined, 0.032 ms with shared producers kept, 0.042 ms unscheduled (CPU time,
            # one thread); softmax's exp feeds two reductions
            shared.append(node.name_hint)
            continue
        if consumers and not all(_may_inline_into(sch, consumers[0], w.source)
                                 for w in node.writes):
            continue  # a window would compute each element several times; row reductions stay
        if plain_reads_only and not (contiguous_in(node, node.iter_vars[-1].var) and all(
                _reads_each_element_once(sch.get(c), w.source) and not _selects(sch.get(c))
                for c in consumers for w in node.writes)):
            # layout arithmetic inlined: 1.3-1.6x slower than TVM's loops (yolov8n's head);
            # into a concat's branches: computed once per branch (ultraface's exp)
            continue
        try:
            sch.compute_inline(block)
        except _ScheduleError:
            continue
        changed = True
    return changed, shared
