"""Private helper of :class:`~relax_memplan.transform.plan_static_memory.PlanStaticMemory`:
which concatenations are written in place.

A concatenation kernel (:mod:`relax_memplan.analysis.concat`) along an axis before which
every dim is 1 has each input as one contiguous byte range of its output. Placing input
``i`` at ``offset(output) + prefix_bytes(i)`` lets the producers write straight into the
output; the concat call is then dropped (its output is the ``alloc_tensor`` of the whole
range). The idea is "concat in place" of TensorFlow's and MXNet's graph memory planners.

Conditions (each refusal is counted under its reason, :data:`REASONS` order): the kernel is a
plain concatenation (a kernel named after ``R.concat`` but fused or scheduled is counted as
refused, :data:`NOT_PLAIN`, so that every concatenation call has a count); every input is
the whole storage of a tensor this planner places (not a function parameter, constant,
view/alias of other storage, nor in a tuple used otherwise than through ``TupleGetItem``);
inputs and output have one dtype, device and scope; each input appears once, in one
concatenation only; every dim before the axis is 1; each prefix is a multiple of the
alignment (``ensure_zero_offset`` would copy a misaligned view); the output is first used and
only written by the concat call; no call after the concat writes an input; no input nor the
output is overwritten by in-place reuse (an input written over later while the output,
which holds its bytes, is still read is the trap); the call's result is unused.

A concatenation is applied only if the per-step live bytes sorted from high to low get
lexicographically smaller: the peak never rises, and at an equal peak (a tie with another
step) the next highest step drops. The merged live range is from the first definition of a
member to the last use of any (:func:`~._inplace_plan.merged_buffers`).
"""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass, field
from typing import Dict, List, Optional, Tuple

import numpy as np
from tvm import relax

from ..planner import Buffer, live_bytes_profile
from ._inplace_plan import merged_buffers

__all__ = ["ConcatPlan", "plan_concats", "step_live_bytes"]


@dataclass
class ConcatPlan:
    """The concatenations of one function written in place, and the refused ones.

    Attributes
    ----------
    nested : dict of str to (str, int)
        Member uid -> (parent uid, delta in bytes): the in-place chains given plus each
        applied concatenation's inputs inside its output.
    applied : list of ConcatSite
        The concat calls dropped (their inputs written in place).
    refusals : collections.Counter
        Reason -> number of concat calls refused for it.
    """

    nested: Dict[str, Tuple[str, int]]
    applied: List = field(default_factory=list)
    refusals: Counter = field(default_factory=Counter)


def step_live_bytes(buffers: List[Buffer], num_steps: int) -> np.ndarray:
    """Live bytes at each step ``0 .. num_steps`` (int64 array of ``num_steps + 1``)."""
    live = np.zeros(num_steps + 1, dtype=np.int64)
    events = live_bytes_profile(buffers)
    for (step, value), nxt in zip(events, events[1:] + [(num_steps + 1, 0)]):
        live[step:nxt[0]] = value
    return live


def _sorted_profile(buffers: List[Buffer], num_steps: int) -> np.ndarray:
    """Live bytes at every step, sorted from high to low."""
    return np.sort(step_live_bytes(buffers, num_steps))[::-1]


def _lower(new: np.ndarray, old: np.ndarray) -> bool:
    diff = np.nonzero(new != old)[0]
    return bool(diff.size) and new[diff[0]] < old[diff[0]]


def _dims_before_axis_one(tensors, axis: int) -> bool:
    return all(all(d == 1 for d in t.shape[:axis]) for t in tensors)


#: Refusal of a concatenation kernel fused with other ops or scheduled (its calls still count).
NOT_PLAIN = "kernel not a plain concatenation (fused with other ops or scheduled)"


def _site_refusal(site, tensors, overwritten, in_pairs, alignment_bytes) -> Optional[str]:
    """Why ``site`` may not be written in place, ``None`` if it may (module docstring)."""
    if site.axis is None:
        return NOT_PLAIN
    facts = list(site.inputs) + [site.output]
    if any(isinstance(f, str) for f in facts):
        return next(f for f in facts if isinstance(f, str))
    ins, out = [tensors[i] for i in site.inputs], tensors[site.output]
    checks = [
        (not all(t.plannable for t in ins + [out]), "tensor not planned"),
        (len(set(site.inputs)) != len(site.inputs), "input repeated"),
        (any(t.in_escaping_tuple for t in ins + [out]), "tuple member"),
        (any((t.dtype, t.device_index, t.storage_scope)
             != (out.dtype, out.device_index, out.storage_scope) for t in ins),
         "dtype, device or scope differs"),
        (not _dims_before_axis_one(ins + [out], site.axis), "dims before the axis are not 1"),
        (out.first_use != site.step or out.write_steps != [site.step],
         "output used or written by another call"),
        (any(s >= site.step for t in ins for s in t.write_steps), "input written after the concat"),
        (any(t.uid in overwritten for t in ins + [out]) or out.uid in in_pairs,
         "overwritten by in-place reuse"),
        (any(p % alignment_bytes for p in _prefixes(ins)), "offset not aligned"),
        (not _unused_result(site.binding_var), "call result used"),
    ]
    return next((why for bad, why in checks if bad), None)


def _prefixes(ins) -> List[int]:
    out, acc = [], 0
    for t in ins:
        out.append(acc)
        acc += t.size_bytes
    return out


def _unused_result(var) -> bool:
    ty = getattr(var, "ty", None)
    return isinstance(ty, relax.TupleType) and len(ty.fields) == 0


def plan_concats(liveness, buffers: List[Buffer], nested: Dict[str, Tuple[str, int]],
                 alignment_bytes: int, owns_unplaced: bool = True) -> ConcatPlan:
    """Choose the concatenations of one function to write in place.

    Parameters
    ----------
    liveness : FunctionLiveness
        With :attr:`~relax_memplan.analysis.liveness.FunctionLiveness.concat_sites` (from
        ``analyze_liveness(..., concat_table=...)``).
    buffers : list of Buffer
        The planned tensors of one arena (sizes rounded to ``alignment_bytes``).
    nested : dict of str to (str, int)
        The in-place chains already decided (member -> (first of its chain, 0)).
    alignment_bytes : int
        Offset alignment; every prefix must be a multiple of it.
    owns_unplaced : bool
        Count the refusals of the sites whose output is in no arena (the first arena of a
        function does, so that each refusal is counted once); a site whose output is in
        another arena is that arena's.

    Returns
    -------
    ConcatPlan
        ``nested`` extended with the applied concatenations, and the refusals per reason.
    """
    plan = ConcatPlan(nested=dict(nested))
    tensors = liveness.tensors
    planned = {b.id for b in buffers}
    overwritten = {u.in_uid for u in liveness.inplace}
    in_pairs = overwritten | {u.out_uid for u in liveness.inplace}
    taken = set()
    current = _sorted_profile(merged_buffers(buffers, plan.nested), liveness.num_steps)
    placed_anywhere = {t.uid for t in liveness.plannable}
    for site in liveness.concat_sites:
        out_uid = tensors[site.output].uid if isinstance(site.output, int) else None
        if out_uid not in planned and (out_uid in placed_anywhere or not owns_unplaced):
            continue
        why = _site_refusal(site, tensors, overwritten, in_pairs, alignment_bytes)
        members = [tensors[i].uid for i in site.inputs] + [tensors[site.output].uid] \
            if why is None else []
        if why is None and not all(m in planned for m in members):
            why = "tensor not planned"
        if why is None and taken.intersection(members):
            why = "in another concatenation"
        if why is None:
            with_site = dict(plan.nested)
            ins = [tensors[i] for i in site.inputs]
            for t, prefix in zip(ins, _prefixes(ins)):
                with_site[_chain_root(t.uid, plan.nested)] = (members[-1], prefix)
            profile = _sorted_profile(merged_buffers(buffers, with_site), liveness.num_steps)
            if _lower(profile, current):
                plan.nested, current = with_site, profile
                plan.applied.append(site)
                taken.update(members)
                continue
            why = "does not lower the live bytes"
        plan.refusals[why] += 1
    return plan


def _chain_root(uid: str, nested: Dict[str, Tuple[str, int]]) -> str:
    """The first tensor of ``uid``'s in-place chain (delta-0 parents), ``uid`` if none."""
    while uid in nested and nested[uid][1] == 0:
        uid = nested[uid][0]
    return uid
