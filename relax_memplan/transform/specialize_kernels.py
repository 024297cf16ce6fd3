"""SpecializeKernels: shape-bucket versions of symbolic kernels, chosen at run time in the kernel.

Where it runs
-------------
In the ``legalize`` phase, right after ``FuseTIR`` and before any schedule
pass (dlight's GPU rules, our CPU schedules): it schedules the versions
itself, with the ``schedule`` function the caller gives, and marks the result
``tirx.is_scheduled`` so later schedule passes leave it alone. Reads the
``tir_var_lower_bound`` / ``tir_var_upper_bound`` attributes of the Relax
functions calling a kernel; writes ``tirx.is_scheduled`` and
``relax_memplan.buckets`` (var name -> bucket values) on each kernel it
specializes.

Design: dispatch inside one PrimFunc
------------------------------------
A kernel whose signature uses a bucketed symbolic var (a buffer dim such as
``x: (seq, 64)`` or a scalar parameter ``seq``) is rewritten, keeping its
signature, into::

    if seq == 16:   <body of the copy specialized to seq=16, scheduled>
    elif seq == 32: <body of the copy specialized to seq=32, scheduled>
    else:           <the generic body, scheduled>

Each specialized copy comes from ``PrimFunc.specialize`` (static shapes, so a
schedule may tile for the known extents), is scheduled on its own, then gets
fresh loop/block/buffer definitions (``s_tir.renew_defs``). In its branch its
static-shape parameter buffers are declared (``DeclBuffer``) on the data of
the kernel's own parameters, and its renewed scalar vars are bound to the
kernel's. The condition is wrapped in ``tvm_thread_invariant`` (it depends on
no thread index), so the GPU lowering accepts kernels inside the branches;
``SplitHostDevice`` then makes one device kernel per branch and the test on
``seq`` stays on the host.

Which kernels are specialized ("affected kernels")
--------------------------------------------------
Only kernels where a known extent can change the code a schedule makes: a
kernel is specialized when its signature uses a bucketed var **and** it has at
least one reduction block (an ``SBlock`` with a ``CommReduce`` iter var:
matmul / dense / batch matmul and their fused epilogues, softmax, layer norm,
mean...). Skipped, with a line in :attr:`SpecializeKernels.skipped`:

* kernels without a reduction -- elementwise, broadcast, injective, reshape,
  transpose, copy, gather (``take``), cast: nothing to tile for a size, and a
  reshape kernel must stay recognisable to ``RewriteDataflowReshape``, which
  turns it into a view (its ``HasReshapePattern`` check fails on any body that
  is not a single root block). The ``op_pattern`` attribute is not used: FuseTIR
  drops it on fused kernels and legalized reshapes carry ``kOpaque``;
* kernels already marked ``tirx.is_scheduled`` (a version would get the same,
  size-independent schedule) or already dispatching (``relax_memplan.buckets``);
* kernels whose body is not a single root block (not a legalized kernel).

The dispatch ``if`` itself is put in an empty root block, so the result is
still a one-block kernel to TVM's analyses (``RewriteDataflowReshape`` asks
``HasReshapePattern`` about every one-input kernel, softmax included).

Why inside the PrimFunc rather than an ``R.If`` in Relax: the Relax graph,
every tensor and its shape are the same whichever version runs, so the memory
plan made later (``finalize`` phase) is valid on every path without any
per-path reasoning; only the code executed inside one ``call_tir`` differs.

Speed: a branch runs at the static build's speed
(``benchmarks/dispatch_micro.py``: dense (8, seq, 768) x (768, 3072), host
CPU, seq 64 and 128 at 0.99-1.00 x the static build; the generic path at
~0.77 x). It needs ``noalias`` on the kernel's arguments, which the kernel
declares (``tirx.noalias``, kept by this pass) but TVM 0.27's LLVM codegen
drops from every function of a module whose alphabetically last PrimFunc
lacks it -- ``shape_func`` in any symbolic-shape build. Without it the same
branch ran at 0.40 x static; :class:`~relax_memplan.transform.annotate_no_alias.AnnotateNoAlias`
(last ``finalize`` pass of our pipeline) restores it, for the generic kernels
too. Separate static PrimFuncs per bucket (called from a dispatcher) were not
needed: with ``noalias`` back, the branch's code is the static kernel's.

Constant weights packed once for every version
----------------------------------------------
With our CPU schedules the pipeline runs ``MarkConstantWeights``
(:mod:`relax_memplan.schedules.prepack`) right before this pass, so the generic
body and each bucket version are scheduled with a root-level block packing the
constant ``B`` into ``(N / nr, K, nr)`` panels. When every version packs the
same parameters into the same shapes
(:func:`~relax_memplan.schedules.prepack.same_prepacked_layout`; the generic
matmul tile is as wide as the static one, ``GenericMatmul(wide_nr_vectors=3)``),
the generic version's packing blocks and buffers are kept at the root of the
dispatching kernel, before the ``if``, and each branch declares its packed
buffer on theirs (:func:`~relax_memplan.schedules.prepack.reuse_prepacked`).
``SplitPrepackedWeights`` then moves that one packing into its own PrimFunc
and ``FoldConstant`` runs it on the weight when compiling: one packed copy of
the weight, read by every version, no copy per call (before, every version
copied the whole ``B`` into its panels on each call: 9.4 MB for BERT-base's
768 x 3072 weight). When the layouts differ, all versions are scheduled again
without the mark (per-call panel packing, a line in :attr:`skipped`): two
packed copies would multiply the weight's bytes.

Several bucketed vars in one kernel give one branch per combination of their
bucket values (conditions joined with ``and``). A bucket value outside every
calling Relax function's declared range of the var is skipped, with a note in
:attr:`SpecializeKernels.skipped`.
"""

from __future__ import annotations

import itertools
from typing import Callable, Dict, List, Mapping, Optional, Sequence, Tuple, Union

import tvm
import tvm_ffi
from tvm import relax, s_tir, tirx
from tvm.target import Target

from ..analysis.dims import declared_ranges
from ..schedules.prepack import (LAYOUT_FREE_ATTR, prepacked_params, reuse_prepacked,
                                 same_prepacked_layout, split_root_preproc)
from ._args import check_buckets
from ._module_util import replace_functions

__all__ = ["SpecializeKernels", "dispatch_path", "dlight_schedule", "backend_schedule", "GENERIC",
           "BUCKETS_ATTR"]

ScheduleFn = Callable[[tirx.PrimFunc, Target], tirx.PrimFunc]

GENERIC = "generic"
"""The :func:`dispatch_path` label of the generic (symbolic) version."""

BUCKETS_ATTR = "relax_memplan.buckets"
"""PrimFunc attribute written on a specialized kernel: var name -> bucket values."""

_IS_SCHEDULED = "tirx.is_scheduled"


def dispatch_path(specialized: Mapping[str, Mapping[str, Sequence[int]]],
                  dims: Mapping[str, int]) -> Dict[str, str]:
    """Which version of each specialized kernel runs at the given dim values.

    Pure Python: mirrors the branch conditions :class:`SpecializeKernels` builds.

    Parameters
    ----------
    specialized : mapping of str to (mapping of str to sequence of int)
        :attr:`SpecializeKernels.specialized`: kernel -> var -> bucket values.
    dims : mapping of str to int
        Actual value of each bucketed var, e.g. ``{"seq": 16}``.

    Returns
    -------
    dict of str to str
        Kernel -> ``"seq=16"`` (bucketed vars in bucket order, joined by
        ``","``) or :data:`GENERIC`.

    Raises
    ------
    ValueError
        If ``dims`` has no value for a var some kernel is specialized on.
    """
    out: Dict[str, str] = {}
    for kernel, var_values in specialized.items():
        missing = [name for name in var_values if name not in dims]
        if missing:
            raise ValueError(f"dispatch_path: no value for dim(s) {', '.join(missing)} "
                             f"(kernel '{kernel}')")
        if all(int(dims[name]) in values for name, values in var_values.items()):
            out[kernel] = ",".join(f"{name}={int(dims[name])}" for name in var_values)
        else:
            out[kernel] = GENERIC
    return out


def dlight_schedule(*rules) -> ScheduleFn:
    """A ``schedule`` function applying dlight rules to one PrimFunc.

    Parameters
    ----------
    *rules : tvm.s_tir.dlight.ScheduleRule
        Tried in order, as ``ApplyDefaultSchedule`` does (e.g. the CUDA
        backend's ``gpu.Matmul(), gpu.GEMV(), ..., gpu.Fallback()``).

    Returns
    -------
    callable
        ``f(func, target) -> func``; ``func`` unchanged when no rule applies.
    """
    from tvm.s_tir import dlight  # pylint: disable=import-outside-toplevel

    apply = dlight.ApplyDefaultSchedule(*rules)

    def _schedule(func: tirx.PrimFunc, target: Target) -> tirx.PrimFunc:
        with target:
            return apply(tvm.IRModule({"main": func}))["main"]

    return _schedule


def backend_schedule(target: Target) -> Optional[ScheduleFn]:
    """What TVM's backend would schedule a kernel with after ``FuseTIR``, as a ``schedule``.

    Parameters
    ----------
    target : tvm.target.Target
        Compilation target.

    Returns
    -------
    callable or None
        For ``cuda``: dlight's GPU rules in the order of TVM's CUDA
        ``legalize_passes`` (Matmul, GEMV, Reduction, GeneralReduction,
        Fallback), as our pipeline runs them: a rule that fails on a kernel
        counts as not applicable (:func:`relax_memplan.schedules.gpu_schedule_rules`).
        For other kinds ``None``: TVM's CPU pipeline schedules nothing.
    """
    if target.kind.name != "cuda":
        return None
    from ..schedules.gpu import gpu_schedule_rules  # pylint: disable=import-outside-toplevel

    return dlight_schedule(*gpu_schedule_rules())


def _signature_vars(func: tirx.PrimFunc) -> Dict[str, tirx.Var]:
    """Symbolic vars of a kernel's signature: scalar params and vars in buffer shapes."""
    out: Dict[str, tirx.Var] = {}
    for p in func.params:
        if tirx.is_buffer_var(p):
            for dim in p.shape:
                for v in _free_vars(dim):
                    out.setdefault(v.name, v)
        else:
            out.setdefault(p.name, p)
    return out


def _free_vars(expr) -> List[tirx.Var]:
    if isinstance(expr, tirx.Var):
        return [expr]
    if isinstance(expr, (tirx.IntImm, int)):
        return []
    return list(tirx.analysis.undefined_vars(expr))


def _reduction_blocks(func: tirx.PrimFunc) -> List[str]:
    """Names of the blocks of ``func`` with a reduction (``CommReduce``) iter var."""
    found: List[str] = []

    def on_block(block, visitor):
        if any(iv.iter_type == tirx.IterVar.CommReduce for iv in block.iter_vars):
            found.append(block.name_hint)
        visitor.default_visit(block)

    tvm_ffi.structural_visit(func.body, [(s_tir.SBlock, on_block)])
    return found


def _skip_reason(func: tirx.PrimFunc) -> Optional[str]:
    """Why ``func`` is not worth specializing (``None``: it is an affected kernel)."""
    if func.attrs is not None and _IS_SCHEDULED in func.attrs and bool(func.attrs[_IS_SCHEDULED]):
        return "already scheduled (a version would get the same schedule)"
    if not isinstance(func.body, s_tir.SBlockRealize):
        return "its body is not a single root block (not a legalized kernel)"
    if not _reduction_blocks(func):
        return "no reduction (elementwise, broadcast, reshape, copy or gather kernel)"
    return None


def _callers(mod: tvm.IRModule) -> Dict[str, List[relax.Function]]:
    """Kernel name -> Relax functions referring to it."""
    out: Dict[str, List[relax.Function]] = {}
    for _gv, func in mod.functions_items():
        if not isinstance(func, relax.Function):
            continue
        seen = set()

        def visit(node, seen=seen):
            if isinstance(node, tvm.ir.GlobalVar):
                seen.add(node.name_hint)

        relax.analysis.post_order_visit(func.body, visit)
        for name in seen:
            out.setdefault(name, []).append(func)
    return out


def _as_imm(var: tirx.Var, value: int) -> tirx.IntImm:
    return tirx.IntImm(var.ty.dtype, value)


def _specialize(func: tirx.PrimFunc,
                combo: Mapping[str, int]) -> Optional[Tuple[tirx.PrimFunc, List[int]]]:
    """``func`` with the vars of ``combo`` replaced by their values.

    Returns the specialized function and, for each of its params, the index of
    the matching param of ``func`` (``specialize`` drops specialized scalar
    params); ``None`` if a var is neither a scalar param nor a buffer dim.
    """
    param_map = {}
    covered = set()
    for p in func.params:
        if tirx.is_buffer_var(p):
            shape, changed = [], False
            for dim in p.shape:
                if isinstance(dim, tirx.Var) and dim.name in combo:
                    shape.append(_as_imm(dim, combo[dim.name]))
                    covered.add(dim.name)
                    changed = True
                else:
                    shape.append(dim)
            if changed:
                param_map[p] = tirx.decl_buffer(
                    shape, p.dtype, p.name, strides=p.strides, elem_offset=p.elem_offset,
                    scope=p.ty.storage_scope, data_alignment=p.data_alignment,
                    offset_factor=p.offset_factor)
        elif p.name in combo:
            param_map[p] = _as_imm(p, combo[p.name])
            covered.add(p.name)
    if set(combo) - covered:
        return None
    kept = [i for i, p in enumerate(func.params) if tirx.is_buffer_var(p) or p.name not in combo]
    spec = func.specialize(param_map)
    if len(spec.params) != len(kept):
        kept = list(range(len(func.params)))  # scalar params kept by this TVM build
    return spec, kept


def _branch(generic: tirx.PrimFunc, scheduled: tirx.PrimFunc, kept: List[int],
            shared_packing: bool = False) -> tirx.Stmt:
    """The scheduled specialized body, its params aliasing ``generic``'s (and, with
    ``shared_packing``, its packed weights ``generic``'s packed buffers)."""
    renewed = s_tir.renew_defs(scheduled)
    packed = set()
    if shared_packing:  # the weight itself is not read: it is a packed constant after the split
        packed = set(prepacked_params(renewed))
        renewed = reuse_prepacked(renewed, generic, kept)
    binds, decls, bound = [], [], set()
    for k, (rp, sp, gi) in enumerate(zip(renewed.params, scheduled.params, kept)):
        gp = generic.params[gi]
        if not tirx.is_buffer_var(rp):
            binds.append(tirx.Bind(rp, gp))
            continue
        if k in packed:
            continue
        for rdim, sdim in zip(rp.shape, sp.shape):
            if isinstance(rdim, tirx.Var) and not rdim.same_as(sdim) and rdim.name not in bound:
                bound.add(rdim.name)
                binds.append(tirx.Bind(rdim, sdim))
        decls.append(tirx.DeclBuffer(rp, data=tirx.buffer_data(gp)))
    return tirx.SeqStmt(binds + decls + [renewed.body])


def _root_block(body: tirx.Stmt, alloc_buffers=()) -> s_tir.SBlockRealize:
    """``body`` under an empty root block, the form TVM's analyses expect of a kernel.

    ``RewriteDataflowReshape`` asks ``HasReshapePattern`` about every one-input
    kernel (softmax included), which checks that the body is an ``SBlockRealize``.
    ``alloc_buffers``: the generic version's root buffers (its packed weights), hoisted
    so that every branch can read them.
    """
    block = s_tir.SBlock(iter_vars=[], reads=[], writes=[], name_hint="root", body=body,
                         alloc_buffers=list(alloc_buffers))
    return s_tir.SBlockRealize(iter_values=[], predicate=True, block=block)


@tvm.transform.module_pass(opt_level=0, name="SpecializeKernels")
class SpecializeKernels:
    """Specialize symbolic kernels to shape buckets, dispatching inside each kernel.

    See the module docstring for where it runs, how the dispatch is built and which
    kernels are specialized (those with a reduction block; never pure reshape/copy,
    elementwise or gather kernels, nor already scheduled ones).

    Parameters
    ----------
    buckets : mapping of str to sequence of int
        Symbolic var name -> bucket values, e.g. ``{"seq": [64, 128]}``.
    schedule : callable, optional
        ``schedule(func, target) -> func`` schedules one PrimFunc; it is called
        on every specialized copy (static shapes) and on the generic kernel
        (symbolic shapes), e.g. ``relax_memplan.schedules.schedule_prim_func``
        or :func:`dlight_schedule`. It must keep the function's parameters.
        ``None`` leaves the versions unscheduled (fine on llvm; on CUDA they
        would have no thread binding).
    target : tvm.target.Target, optional
        Given to ``schedule``; default: the kernel's ``target`` attribute, else
        the current target (``with target:``).

    Attributes
    ----------
    specialized : dict of str to (dict of str to list of int)
        Filled (anew) each time the pass runs: kernel name -> var name -> bucket values it
        has a version for (one branch per combination of the values).
    skipped : list of str
        One line per bucket value or kernel left out, with the reason
        (``"<kernel>: not specialized: no reduction (...)"``, ...).

    Raises
    ------
    TypeError
        ``buckets`` is not a mapping of names to sequences of ints.
    ValueError
        A bucket value is not positive or a var's list is empty (at
        construction); when run, a bucket var is a symbolic var of no function
        of the module, no target is known for ``schedule``, or ``schedule``
        changed a kernel's parameters.
    """

    def __init__(self, buckets: Mapping[str, Sequence[int]], schedule: Optional[ScheduleFn] = None,
                 target: Union[str, dict, Target, None] = None):
        self.buckets = check_buckets(buckets)
        if schedule is not None and not callable(schedule):
            raise TypeError(f"schedule must be callable, got {schedule!r}")
        self.schedule = schedule
        self.target = Target(target) if isinstance(target, (str, dict)) else target
        self.specialized: Dict[str, Dict[str, List[int]]] = {}
        self.skipped: List[str] = []

    # -- helpers ---------------------------------------------------------------------------
    def _check_known(self, mod: tvm.IRModule) -> None:
        known = set()
        for _gv, func in mod.functions_items():
            if isinstance(func, relax.Function):
                known.update(declared_ranges(func))
            elif isinstance(func, tirx.PrimFunc):
                known.update(_signature_vars(func))
        unknown = [name for name in self.buckets if name not in known]
        if unknown:
            raise ValueError(
                f"bucket var(s) {', '.join(repr(n) for n in unknown)} are not symbolic dims of any "
                f"function in the module; known: {', '.join(sorted(known)) or 'none'}")

    def _values(self, kernel: str, name: str, callers: List[relax.Function]) -> List[int]:
        ranges = [declared_ranges(f)[name] for f in callers if name in declared_ranges(f)]
        kept = []
        for value in self.buckets[name]:
            if not ranges or any(value in r for r in ranges):
                kept.append(value)
            else:
                self.skipped.append(
                    f"{kernel}: {name}={value} is outside the declared range "
                    f"{' / '.join(str(r) for r in ranges)} of its callers")
        return kept

    def _target(self, func: tirx.PrimFunc) -> Target:
        if self.target is not None:
            return self.target
        if func.attrs is not None and "target" in func.attrs:
            return func.attrs["target"]
        current = Target.current(allow_none=True)
        if current is None:
            raise ValueError("SpecializeKernels: no target for the schedule function; pass "
                             "target= or run the pass under `with target:`")
        return current

    def _scheduled(self, name: str, func: tirx.PrimFunc) -> tirx.PrimFunc:
        if self.schedule is None:
            return func
        out = self.schedule(func, self._target(func))
        if len(out.params) != len(func.params) or not all(
                a.same_as(b) for a, b in zip(out.params, func.params)):
            raise ValueError(f"SpecializeKernels: the schedule function changed the parameters "
                             f"of kernel '{name}'")
        return out

    def _versions(self, name: str, func: tirx.PrimFunc, made):
        """The scheduled generic kernel and bucket versions, and whether they share one
        prepacked weight (same panel layout everywhere); when their layouts differ, all
        are scheduled again without ``layout_free_buffers`` (the weight packed per call,
        as before prepacking: one packed copy per layout would multiply the weight's
        bytes)."""
        def schedule_all(strip: bool):
            base = func.without_attr(LAYOUT_FREE_ATTR) if strip else func
            specs = []
            for _combo, spec, kept in made:
                if strip or len(kept) != len(func.params):  # indices of the attr shifted
                    spec = spec.without_attr(LAYOUT_FREE_ATTR)
                specs.append(self._scheduled(name, spec))
            return self._scheduled(name, base), specs

        generic, versions = schedule_all(strip=False)
        packed = [bool(prepacked_params(f)) for f in [generic] + versions]
        if not any(packed):
            return generic, versions, False
        if all(packed) and same_prepacked_layout(generic, versions):
            return generic, versions, True
        self.skipped.append(f"{name}: constant weight packed per call: the versions' panel "
                            "layouts differ")
        generic, versions = schedule_all(strip=True)
        return generic, versions, False

    def _rewrite(self, name: str, func: tirx.PrimFunc, var_values: Dict[str, List[int]]):
        names = list(var_values)
        sig = _signature_vars(func)
        made = []
        for values in itertools.product(*(var_values[n] for n in names)):
            combo = dict(zip(names, values))
            spec = _specialize(func, combo)
            if spec is None:
                self.skipped.append(f"{name}: {combo} is not a buffer dim or scalar parameter")
                return None
            made.append((combo, *spec))
        generic, versions, shared = self._versions(name, func, made)
        branches = []
        for (combo, _spec, kept), scheduled in zip(made, versions):
            cond = None
            for n, v in combo.items():
                term = tirx.EQ(sig[n], _as_imm(sig[n], v))
                cond = term if cond is None else tirx.And(cond, term)
            branches.append((tirx.op.tvm_thread_invariant(cond),
                             _branch(generic, scheduled, kept, shared)))
        allocs, packing, body = [], [], generic.body
        if shared:  # the generic version's packing blocks stay at the root, before the dispatch
            allocs, packing, rest = split_root_preproc(generic)
            body = tirx.SeqStmt(rest) if len(rest) > 1 else rest[0]
        for cond, stmt in reversed(branches):
            body = tirx.IfThenElse(cond, stmt, body)
        body = _root_block(tirx.SeqStmt(packing + [body]) if packing else body, allocs)
        attr = {n: [int(v) for v in var_values[n]] for n in names}
        return (generic.with_body(body)
                .with_attr(_IS_SCHEDULED, True)
                .with_attr(BUCKETS_ATTR, attr))

    # -- pass ------------------------------------------------------------------------------
    def transform_module(self, mod: tvm.IRModule, _ctx) -> tvm.IRModule:
        self.specialized, self.skipped = {}, []
        self._check_known(mod)
        callers = _callers(mod)
        updates = {}
        for gv, func in mod.functions_items():
            if not isinstance(func, tirx.PrimFunc):
                continue
            if func.attrs is not None and BUCKETS_ATTR in func.attrs:
                continue  # already dispatches
            name = gv.name_hint
            sig = _signature_vars(func)
            used = [n for n in self.buckets if n in sig]
            if not used:
                continue
            reason = _skip_reason(func)
            if reason is not None:
                self.skipped.append(f"{name}: not specialized: {reason}")
                continue
            var_values = {}
            for n in used:
                values = self._values(name, n, callers.get(name, []))
                if values:
                    var_values[n] = values
            if not var_values:
                continue
            new = self._rewrite(name, func, var_values)
            if new is not None:
                updates[gv] = new
                self.specialized[name] = {n: list(v) for n, v in var_values.items()}
        return replace_functions(mod, updates)
