"""Constant matmul weights laid out for the register tile once, at compile time.

Where it runs
-------------
Inside :class:`~relax_memplan.schedules.cpu_matmul.StaticMatmul` (after ``FuseTIR``), on a
PrimFunc whose ``B`` operand (the one carrying the column axis ``J``) is a function
parameter that :func:`mark_constant_weights` listed in the function attribute
``layout_free_buffers`` (the Relax argument is a constant: a model weight; TVM's
``AttachAttrLayoutFreeBuffers`` writes the same attribute). The pipeline
(``get_pipeline(..., schedule=True)``) runs that pass before the
schedules and :func:`split_prepacked_weights` (which also folds) after them.

What it does
------------
Without it, the kernel copies each ``K x nr`` panel of ``B`` into a contiguous buffer on
every call (BLIS's packed ``B`` micro-panel): one whole copy of the weight per call,
9.4 MB for BERT-base's 768 x 3072 feed-forward weight. Here the whole ``B`` is read
through a ``cache_read`` at the root whose buffer is given the panel layout
``(N / nr, K, nr)`` (``transform_layout``), and that copy block is annotated
``meta_schedule.layout_rewrite_preproc`` -- MetaSchedule's convention for layout-free
weights (its ``RewriteLayout`` postprocessor). :func:`split_prepacked_weights` (TVM's
``SplitLayoutRewritePreproc`` on the PrimFuncs concerned) then moves
the copy into its own PrimFunc called from Relax on the constant, and ``FoldConstant``
evaluates that call when compiling (the packing PrimFunc, then called by nothing, is removed
from the module): the kernel receives the packed weight and its
micro-kernel reads each panel contiguously, with no copy at run time.

Only plain 2-D weights whose column count is a multiple of ``nr`` are packed (no
padding of ``J``); anything else keeps the per-call panel packing.

Kernels made dispatching by ``SpecializeKernels`` (a generic body and one static version
per shape bucket) share one packed weight: :func:`same_prepacked_layout` checks that the
versions pack alike, :func:`split_root_preproc` and :func:`reuse_prepacked` keep one
packing block at the root of the dispatching kernel and let every branch read its buffer.
"""

from __future__ import annotations

from typing import List, Optional, Sequence

import tvm
from tvm import relax, s_tir, tirx

from ._fold_packing import FoldPacking, without_trivial_bindings
from .analysis import MatmulAxes

__all__ = ["LAYOUT_FREE_ATTR", "PREPROC_ANNOTATION", "mark_constant_weights",
           "split_prepacked_weights", "prepack_constant_b", "prepacked_params",
           "same_prepacked_layout", "reuse_prepacked", "split_root_preproc"]

LAYOUT_FREE_ATTR = "layout_free_buffers"
"""PrimFunc attribute (TVM's name, see ``relax.transform.AttachAttrLayoutFreeBuffers``):
indices of the parameters whose Relax arguments are constants."""

PREPROC_ANNOTATION = "meta_schedule.layout_rewrite_preproc"
"""Block annotation ``relax.transform.SplitLayoutRewritePreproc`` looks for."""


def _b_dims(sch: s_tir.Schedule, axes: MatmulAxes) -> Optional[tuple]:
    """``(j_dim, k_dim)`` of a 2-D ``B`` read at ``B[.., k, j]`` / ``B[j, k]`` by bare
    iter vars of role ``J`` and ``K``, else ``None``."""
    block = sch.get(axes.block)
    region = block.reads[axes.b_read_index].region
    if len(region) != 2:
        return None
    role_of = {iv.var: role for iv, role in zip(block.iter_vars, axes.roles)}
    roles = [role_of.get(rng.min) if isinstance(rng.min, tirx.Var) else None
             for rng in region]
    if sorted(r for r in roles if r) != ["J", "K"]:
        return None
    return roles.index("J"), roles.index("K")


def _is_layout_free_param(func: tirx.PrimFunc, buffer) -> bool:
    attrs = func.attrs
    if attrs is None or LAYOUT_FREE_ATTR not in attrs:
        return False
    for index in attrs[LAYOUT_FREE_ATTR]:
        param = func.params[int(index)]
        if param.same_as(buffer) or getattr(param, "data", None) is not None and \
                param.data.same_as(buffer.data):
            return True
    return False


def prepack_constant_b(sch: s_tir.Schedule, func: tirx.PrimFunc, axes: MatmulAxes,
                       nr: int) -> bool:
    """Give a constant ``B`` the panel layout ``(N / nr, K, nr)`` in a preprocessing block.

    Call it after the producers of ``B`` are inlined and before the tiles are split.

    Parameters
    ----------
    sch : tvm.s_tir.Schedule
        The schedule of ``func`` being built.
    func : tvm.tirx.PrimFunc
        The unscheduled function (its ``layout_free_buffers`` attribute is read).
    axes : MatmulAxes
        The analysed matmul block.
    nr : int
        Columns of the register tile (elements).

    Returns
    -------
    bool
        ``True`` when ``B`` now reads the packed buffer (the caller then skips the
        per-call panel packing), ``False`` when left as is (not a constant parameter,
        not 2-D, ``N`` not a multiple of ``nr``).
    """
    dims = _b_dims(sch, axes)
    if dims is None:
        return False
    j_dim, k_dim = dims
    buffer = sch.get(axes.block).reads[axes.b_read_index].source
    if not _is_layout_free_param(func, buffer):
        return False
    n = buffer.shape[j_dim]
    if not isinstance(n, tirx.IntImm) or n.value % nr != 0:
        return False
    packed = sch.cache_read(axes.block, axes.b_read_index, "global")
    sch.annotate(packed, PREPROC_ANNOTATION, 1)

    def _panels(*index):
        return index[j_dim] // nr, index[k_dim], index[j_dim] % nr

    sch.transform_layout(axes.block, ("read", axes.b_read_index),
                         tirx.IndexMap.from_func(_panels, ndim=2))
    return True


_PACKER_SUFFIX = "_weight_prepack"
"""Name suffix SplitLayoutRewritePreproc gives the packing PrimFunc it splits off."""


def _root_preproc(func: tirx.PrimFunc):
    """``(root block, [(index in its body, packing block)])`` of the weight-packing
    blocks directly under the root block of ``func`` (the place ``prepack_constant_b``
    puts them), read from the function body (a kernel made dispatching by
    ``SpecializeKernels`` has one nested root block per version, which ``Schedule``'s
    lookup by name refuses)."""
    if not isinstance(func.body, s_tir.SBlockRealize):
        return None, []
    root = func.body.block
    stmts = list(root.body.seq) if isinstance(root.body, tirx.SeqStmt) else [root.body]
    found = []
    for k, stmt in enumerate(stmts):
        block = _preproc_in(stmt)
        if block is not None:
            found.append((k, block))
    return root, found


def _preproc_in(stmt: tirx.Stmt):
    """The packing block of a root-level statement (the block, under its loops), else None."""
    while isinstance(stmt, tirx.For):
        stmt = stmt.body
    if isinstance(stmt, s_tir.SBlockRealize) and PREPROC_ANNOTATION in stmt.block.annotations:
        return stmt.block
    return None


def _has_preproc_block(func: tirx.PrimFunc) -> bool:
    if func.attrs is None or LAYOUT_FREE_ATTR not in func.attrs:
        return False  # only marked functions are prepacked
    return bool(_root_preproc(func)[1])


def _packing(func: tirx.PrimFunc):
    """``(param index, packed shape)`` of each weight-packing block of ``func``, sorted."""
    _, found = _root_preproc(func)
    out = []
    for _, block in found:
        source, packed = block.reads[0].source, block.writes[0].source
        index = next((k for k, p in enumerate(func.params) if p.same_as(source)), None)
        out.append((index, tuple(int(d) for d in packed.shape)))
    return sorted(out, key=lambda t: (t[0] is None, t[0] or 0, t[1]))


def prepacked_params(func: tirx.PrimFunc) -> List[int]:
    """Indices of the parameters a scheduled PrimFunc packs in root-level preprocessing
    blocks (:func:`prepack_constant_b`); empty when it packs none.

    Parameters
    ----------
    func : tvm.tirx.PrimFunc
        A scheduled PrimFunc.

    Returns
    -------
    list of int
    """
    return [index for index, _shape in _packing(func) if index is not None]


def same_prepacked_layout(generic: tirx.PrimFunc, versions) -> bool:
    """Whether the bucket versions of a kernel pack the same weights into the same shapes
    as its generic version (so that one packed constant can serve every version).

    Parameters
    ----------
    generic : tvm.tirx.PrimFunc
        The scheduled generic (symbolic-shape) kernel.
    versions : sequence of tvm.tirx.PrimFunc
        Its scheduled, shape-specialized copies (same parameters, in the same order).

    Returns
    -------
    bool
        ``True`` when every version has packing blocks and each packs the same parameter
        into the same packed shape (elements) as ``generic``.
    """
    want = _packing(generic)
    return bool(want) and all(p[0] is not None for p in want) and all(
        _packing(v) == want for v in versions)


def reuse_prepacked(version: tirx.PrimFunc, generic: tirx.PrimFunc,
                    kept: Optional[Sequence[int]] = None) -> tirx.PrimFunc:
    """``version`` without its weight-packing blocks, reading ``generic``'s packed buffers.

    Each packed buffer the version allocated is declared instead (``DeclBuffer``) on the
    data of the buffer ``generic`` packs the same parameter into, so the version's body is
    meant to run inside ``generic`` after its packing blocks (the shared dispatch of
    ``SpecializeKernels``). Call only when :func:`same_prepacked_layout` holds.

    Parameters
    ----------
    version : tvm.tirx.PrimFunc
        A scheduled shape-specialized copy of the kernel.
    generic : tvm.tirx.PrimFunc
        The scheduled generic kernel.
    kept : sequence of int, optional
        For each parameter of ``version``, the index of the matching parameter of
        ``generic`` (default: the same index).

    Returns
    -------
    tvm.tirx.PrimFunc
        ``version`` with its root block changed.
    """
    _, shared = _root_preproc(generic)
    by_param = {}
    for _, block in shared:
        source = block.reads[0].source
        index = next(k for k, p in enumerate(generic.params) if p.same_as(source))
        by_param[index] = block.writes[0].source
    root, own = _root_preproc(version)
    stmts = list(root.body.seq) if isinstance(root.body, tirx.SeqStmt) else [root.body]
    drop = {k for k, _ in own}
    decls, packed = [], set()
    for _, block in own:
        source, buffer = block.reads[0].source, block.writes[0].source
        index = next(k for k, p in enumerate(version.params) if p.same_as(source))
        index = kept[index] if kept is not None else index
        decls.append(tirx.DeclBuffer(buffer, data=tirx.buffer_data(by_param[index])))
        packed.add(buffer)
    body = tirx.SeqStmt(decls + [stmt for k, stmt in enumerate(stmts) if k not in drop])
    new_root = s_tir.SBlock(root.iter_vars, root.reads, root.writes, root.name_hint, body,
                            root.init, [b for b in root.alloc_buffers if b not in packed],
                            root.match_buffers, root.annotations)
    realize = version.body
    return version.with_body(s_tir.SBlockRealize(realize.iter_values, realize.predicate,
                                                 new_root))


def split_root_preproc(func: tirx.PrimFunc):
    """``(alloc_buffers, packing stmts, other stmts)`` of the root block of ``func``: the
    pieces ``SpecializeKernels`` puts around its dispatch so that the packing blocks stay at
    the root, where ``SplitLayoutRewritePreproc`` looks for them.

    Parameters
    ----------
    func : tvm.tirx.PrimFunc
        A scheduled kernel whose body is one root block.

    Returns
    -------
    tuple of (list of Buffer, list of Stmt, list of Stmt)
    """
    root, found = _root_preproc(func)
    stmts = list(root.body.seq) if isinstance(root.body, tirx.SeqStmt) else [root.body]
    drop = {k for k, _ in found}
    return (list(root.alloc_buffers), [stmts[k] for k in sorted(drop)],
            [stmt for k, stmt in enumerate(stmts) if k not in drop])


def mark_constant_weights() -> tvm.transform.Pass:
    """Write ``layout_free_buffers`` on each PrimFunc: the parameters that receive a Relax
    constant at every ``call_tir`` site, a constant no other kernel reads (a packed copy of a
    constant shared with another kernel would be a second copy of its bytes).

    Our replacement for ``relax.transform.AttachAttrLayoutFreeBuffers``, which breaks
    PrimFuncs with symbolic buffer shapes (our index checks then fail to build: "variables
    (d0, d1, n0, n1) are used, but are not passed in as API arguments"). Runs after
    ``FuseTIR``, before the CPU schedules; the attribute is read by
    :func:`prepack_constant_b` and removed again by :func:`split_prepacked_weights`.

    Returns
    -------
    tvm.transform.Pass
        Module pass ``MarkConstantWeights``.
    """
    call_tir = tvm.ir.Op.get("relax.call_tir")

    @tvm.transform.module_pass(opt_level=0, name="MarkConstantWeights")
    def _pass(mod: tvm.IRModule, _ctx) -> tvm.IRModule:
        sites = []  # (kernel, {parameter index: constant})
        readers = {}  # constant -> the (kernel, parameter index) pairs reading it

        def _visit(node):
            if not (isinstance(node, relax.Call) and node.op.same_as(call_tir)):
                return
            args = node.args[1].fields if hasattr(node.args[1], "fields") else [node.args[1]]
            found = {k: arg for k, arg in enumerate(args) if isinstance(arg, tvm.ir.GenericConst)}
            sites.append((node.args[0], found))
            for k, arg in found.items():
                readers.setdefault(arg, set()).add((node.args[0], k))

        for _, func in mod.functions_items():
            if isinstance(func, relax.Function):
                relax.analysis.post_order_visit(func.body, _visit)
        constant = {}
        for gv, found in sites:
            # a constant another kernel reads too (a tied embedding: the gather and the LM
            # head) stays unpacked: packing it for one kernel would store the weight twice;
            # calls of one kernel share one packed copy
            alone = {k for k, arg in found.items() if len(readers[arg]) == 1}
            constant[gv] = constant[gv] & alone if gv in constant else alone
        for gv, indices in constant.items():
            func = mod[gv] if gv in mod.get_global_vars() else None
            if isinstance(func, tirx.PrimFunc) and indices:
                mod.update_func(gv, func.with_attr(LAYOUT_FREE_ATTR, sorted(indices)))
        return mod

    return _pass


def _called_globals(funcs) -> set:
    """The GlobalVars the Relax functions among ``funcs`` refer to."""
    called = set()

    def visit(expr):
        if isinstance(expr, tvm.ir.GlobalVar):
            called.add(expr)

    for func in funcs:
        if isinstance(func, relax.Function):
            relax.analysis.post_order_visit(func, visit)
    return called


def split_prepacked_weights() -> tvm.transform.Pass:
    """Move the weight-packing blocks into their own PrimFuncs, called on the constants.

    TVM's ``relax.transform.SplitLayoutRewritePreproc`` restricted to the PrimFuncs that
    have a ``meta_schedule.layout_rewrite_preproc`` block (and the Relax functions calling
    them): on the whole module it fails on a PrimFunc whose root holds no compute block
    (our index checks: "There should be a compute block if there is only one subtree
    under the root"). ``layout_free_buffers`` is removed from the other PrimFuncs. The
    packing calls on constants are then evaluated, each packing PrimFunc built once
    (:class:`~relax_memplan.schedules._fold_packing.FoldPacking`; ``FoldConstant`` on the
    whole module would also build our index-check kernels standalone, which fails on their
    symbolic buffer shapes), a weight read at several call sites packed once, and the
    PrimFuncs of the split that nothing calls any more (folded packers, the kernels their
    split versions replace) are removed, so that the build does not compile them. Runs after
    the CPU schedules.

    Returns
    -------
    tvm.transform.Pass
        Module pass ``SplitPrepackedWeights``.
    """

    @tvm.transform.module_pass(opt_level=0, name="SplitPrepackedWeights")
    def _pass(mod: tvm.IRModule, _ctx) -> tvm.IRModule:
        funcs, marked = {}, {}
        for gv, func in mod.functions_items():
            if isinstance(func, tirx.PrimFunc) and _has_preproc_block(func):
                marked[gv] = func
            elif (isinstance(func, tirx.PrimFunc) and func.attrs is not None
                  and LAYOUT_FREE_ATTR in func.attrs):
                func = func.without_attr(LAYOUT_FREE_ATTR)
            funcs[gv] = func
        if not marked:
            return tvm.IRModule(funcs, attrs=mod.attrs, global_infos=mod.global_infos)
        callers = {gv: f for gv, f in funcs.items() if not isinstance(f, tirx.PrimFunc)}
        split = dict(relax.transform.SplitLayoutRewritePreproc()(
            tvm.IRModule({**callers, **marked}, attrs=mod.attrs)).functions_items())
        # fold the packing calls on the constants; FoldConstant sees only these PrimFuncs
        packers = {gv: f for gv, f in split.items()
                   if gv.name_hint.endswith(_PACKER_SUFFIX) and isinstance(f, tirx.PrimFunc)}
        folder = FoldPacking(tvm.IRModule(split, attrs=mod.attrs), packers)
        for gv in marked:
            funcs.pop(gv)
        funcs.update(split)
        funcs.update({gv: without_trivial_bindings(folder.visit_expr(f))
                      for gv, f in split.items() if isinstance(f, relax.Function)})
        # the PrimFuncs of the split that no function calls any more (the packers whose calls
        # were folded, the marked kernels replaced by their split versions) would only be
        # compiled for nothing: LLVM builds each one (bert-tiny: 9 of 25 PrimFuncs, 0.2 CPU s)
        called = _called_globals(funcs.values())
        for gv in list(split) + list(marked):
            if isinstance(funcs.get(gv), tirx.PrimFunc) and gv not in called:
                funcs.pop(gv)
        return tvm.IRModule(funcs, attrs=mod.attrs, global_infos=mod.global_infos)

    return _pass
