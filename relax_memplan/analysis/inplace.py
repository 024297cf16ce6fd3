"""Memory-behaviour table: which output of a kernel may be written into which input's storage.

Where it runs
-------------
On the PrimFuncs of a module after ``FuseTIR`` and after any schedule, i.e. on the
TIR that will be compiled (the static planner reads it right after ``CallTIRRewrite``).
It only reads the TIR; :func:`inplace_kernel` builds the in-place variant of a kernel.

The rule
--------
An output parameter ``out`` may share storage with an input parameter ``in`` when

1. both are buffers of the same dtype and the same shape (so the same byte size and,
   the buffers being compact, the same element at the same byte offset);
2. exactly one block ``W`` writes ``out``, at exactly its own iter vars
   ``out[v0, ..., vn]``, all of them spatial (no reduction, no ``init``);
3. every block that reads ``in`` reads it at exactly its own iter vars
   ``in[v0, ..., vn]`` (identity index map; its read region is that single point),
   all of them spatial, and writes a buffer of the same shape: no transpose,
   broadcast, gather, window, reduction, matmul, conv, softmax or cumsum reads
   ``in`` directly;
4. a block other than ``W`` that reads ``in`` sits in a root-level loop nest strictly
   before ``W``'s (it has finished before ``W`` starts); ``W`` itself reads
   ``in[v]`` before writing ``out[v]`` in the same block instance;
5. no block writes ``in`` and no block reads ``out``.

"At its own iter var" includes an iter var of extent 1 written as its one value: our scheduled
matmul epilogues (:mod:`relax_memplan.schedules.cpu_matmul`) index the unit batch axis by the
constant 0 (refusing it would cost bert-tiny under ``--schedule`` 4 of its 5 in-place
calls); a constant for an iter var of extent above 1 is a broadcast and refused.

Then each element of ``out`` is written only after the element of ``in`` at the same
index has been read for the last time, so writing ``out`` over ``in`` gives the same
result. Views (``R.reshape``, ``ensure_zero_offset``) are not kernels and stay views
(:mod:`relax_memplan.analysis.liveness`).

The kernel is then called in place through :func:`inplace_kernel`: TVM's
``PrimFunc.specialize`` binds the ``out`` parameter to ``in``, so the compiled kernel
has one pointer for the shared tensor (no ``noalias`` promise is broken).

Sources: the buffer reuse of TFLite's arena planner and onnxruntime's allocation
planner (an elementwise output reuses an input that dies at that node), and TVM
Relax's ``DataflowUseInplaceCalls`` (``call_tir_inplace``), which applies the idea to
a fixed list of high-level ops; here it is derived from the TIR of each kernel.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Dict, List, Optional, Tuple

import tvm
from tvm import s_tir, tirx

__all__ = ["InplacePair", "inplace_pairs", "kernel_table", "inplace_kernel"]


@dataclass(frozen=True)
class InplacePair:
    """An output parameter that may be written over an input parameter.

    Attributes
    ----------
    out_index, in_index : int
        Positions of the two parameters in the PrimFunc's parameter list (the
        positions of the arguments of the destination-passing call).
    """

    out_index: int
    in_index: int


def _param_of(buf, params) -> Optional[int]:
    """Index of the parameter ``buf`` is bound to, ``None`` for a local buffer."""
    data = buf.data
    target = data.args[0] if isinstance(data, tvm.ir.Call) and len(data.args) == 1 else data
    for k, p in enumerate(params):
        if target.same_as(p) or buf.same_as(p):
            return k
    return None


def _shape(buf) -> Tuple:
    return tuple(int(d) if isinstance(d, tirx.IntImm) else d for d in buf.shape)


def _same_shape(a, b) -> bool:
    sa, sb = _shape(a), _shape(b)
    if len(sa) != len(sb):
        return False
    return all(x == y if isinstance(x, int) and isinstance(y, int)
               else (not isinstance(x, int) and not isinstance(y, int) and x.same_as(y))
               for x, y in zip(sa, sb))


def _at_iter_var(index, iv) -> bool:
    """``index`` is the value of iter var ``iv``: the var itself, or, for an iter var of
    extent 1, the constant its domain starts at (its only value)."""
    if index.same_as(iv.var):
        return True
    dom = iv.dom
    return (isinstance(dom.extent, tirx.IntImm) and dom.extent.value == 1
            and isinstance(dom.min, tirx.IntImm) and isinstance(index, tirx.IntImm)
            and index.value == dom.min.value)


def _identity_point(region, block) -> bool:
    """The region is the single point ``[v0, ..., vn]`` of the block's iter vars, in order,
    and every iter var is spatial (an iter var of extent 1 may appear as its one value:
    scheduled matmul epilogues index the unit batch axis by the constant 0)."""
    ivs = list(block.iter_vars)
    if len(ivs) != len(region.region) or not all(iv.iter_type == tirx.IterVar.DataPar
                                                  for iv in ivs):
        return False
    for rng, iv in zip(region.region, ivs):
        if not (isinstance(rng.extent, tirx.IntImm) and rng.extent.value == 1):
            return False
        if not _at_iter_var(rng.min, iv):
            return False
    return True


def _blocks(func: tirx.PrimFunc):
    """``[(block, nest)]`` for every block below the root, in program order; ``nest`` is the
    index of the root-level loop nest holding it. ``None`` if the function has no root block."""
    try:
        sch = s_tir.Schedule(func)
        root = sch.get_sblock("root")
    except (s_tir.schedule.ScheduleError, tvm.error.InternalError, ValueError):
        # no root block (hand-written TIR without blocks): nothing can be proven
        return None
    nests: List = []
    out = []

    def visit(parent):
        for rv in sch.get_child_blocks(parent):
            loops = sch.get_loops(rv)
            key = sch.get(loops[0]) if loops else sch.get(rv)
            idx = next((k for k, n in enumerate(nests) if n.same_as(key)), None)
            if idx is None:
                nests.append(key)
                idx = len(nests) - 1
            out.append((sch.get(rv), idx))
            visit(rv)

    visit(root)
    return out


def _pair_ok(blocks, out_k: int, in_k: int, buf_of) -> bool:
    out_buf, in_buf = buf_of[out_k], buf_of[in_k]
    if str(out_buf.dtype) != str(in_buf.dtype) or not _same_shape(out_buf, in_buf):
        return False
    writers = [(b, n) for b, n in blocks if any(_param_is(w.source, out_k, buf_of) for w in b.writes)]
    if len(writers) != 1:
        return False
    w_block, w_nest = writers[0]
    if w_block.init is not None:
        return False
    if not all(_identity_point(w, w_block) for w in w_block.writes if _param_is(w.source, out_k, buf_of)):
        return False
    for b, n in blocks:
        if any(_param_is(w.source, in_k, buf_of) for w in b.writes):
            return False
        if any(_param_is(r.source, out_k, buf_of) for r in b.reads):
            return False
        reads_in = [r for r in b.reads if _param_is(r.source, in_k, buf_of)]
        if not reads_in:
            continue
        if not all(_identity_point(r, b) for r in reads_in):
            return False
        if not all(_same_shape(w.source, in_buf) for w in b.writes):
            return False
        if b is not w_block and not b.same_as(w_block) and n >= w_nest:
            return False
    return True


def _param_is(buf, k: int, buf_of) -> bool:
    return _param_of(buf, buf_of["params"]) == k


def inplace_pairs(func: tirx.PrimFunc) -> List[InplacePair]:
    """The (output, input) parameter pairs of ``func`` that may share storage.

    Parameters
    ----------
    func : tvm.tirx.PrimFunc
        A kernel after ``FuseTIR`` (scheduled or not) with ``s_tir`` blocks.

    Returns
    -------
    list of InplacePair
        Every pair (an output = a parameter some block writes) that satisfies the rule of
        the module docstring; an output may pair with several inputs (the caller picks
        one that dies at the call).
        Empty for a function without blocks (nothing can be proven).
    """
    blocks = _blocks(func)
    if not blocks:
        return []
    params = list(func.params)
    buf_of: Dict = {"params": params}
    for b, _ in blocks:
        for region in list(b.reads) + list(b.writes):
            k = _param_of(region.source, params)
            if k is not None and k not in buf_of:
                buf_of[k] = region.source
    buffer_params = sorted(k for k in buf_of if k != "params")
    outs = [k for k in buffer_params
            if any(_param_is(w.source, k, buf_of) for b, _ in blocks for w in b.writes)]
    return [InplacePair(out_k, in_k) for out_k in outs for in_k in buffer_params
            if in_k not in outs and _pair_ok(blocks, out_k, in_k, buf_of)]


def kernel_table(mod: tvm.IRModule) -> Dict[str, List[InplacePair]]:
    """:func:`inplace_pairs` of every PrimFunc of ``mod``, by name.

    Parameters
    ----------
    mod : tvm.IRModule

    Returns
    -------
    dict of str to list of InplacePair
        Kernel name -> its in-place pairs (empty list: needs fresh memory).
    """
    return {gv.name_hint: inplace_pairs(f)
            for gv, f in mod.functions_items() if isinstance(f, tirx.PrimFunc)}


def inplace_kernel(func: tirx.PrimFunc, pair: InplacePair) -> tirx.PrimFunc:
    """The kernel with output ``pair.out_index`` written over input ``pair.in_index``.

    TVM's ``PrimFunc.specialize`` binds the output parameter to the input parameter:
    the result has one parameter less (the output's) and writes the input buffer.

    Raises
    ------
    ValueError
        If ``pair`` is not one of :func:`inplace_pairs` of ``func``.
    """
    if pair not in inplace_pairs(func):
        raise ValueError(f"output {pair.out_index} of the kernel may not be written over "
                             f"input {pair.in_index}: not an identity-index (elementwise) pair")
    params = list(func.params)
    return func.specialize({params[pair.out_index]: params[pair.in_index]})
