"""FuseAttention: scaled dot-product attention as one kernel, without the score matrix.

Where it runs: on the high-level Relax graph, before ``LegalizeOps`` (our pipeline runs it in
the ``legalize`` phase with ``fusion=True``, llvm and cuda targets, after
``FoldConstantsFirst`` and ``RemoveDropout``: the emitted kernel carries its own CPU or CUDA
schedule and is marked ``tirx.is_scheduled``, so dlight, our CPU schedules and
``SpecializeKernels`` leave it alone). Reads ``main``'s ``relax_memplan.onnx_nodes`` (to name
the ONNX nodes of a refused candidate); writes no attribute.

What it matches: ``softmax(Q . K^T * scale + bias) . V`` by structure, wherever it stands
(:mod:`~relax_memplan.transform._attention_match`): the scores' element-wise steps (scales,
additive biases and masks of any broadcastable shape, boolean masks through ``where``, casts,
a softcap ``tanh``, a reshape into windows and back), the ``where(isnan(p), 0, p)`` guard and
casts after the softmax, any leading dims (batch, heads, windows; grouped-query heads repeated
by ``broadcast_to``/``tile``/``repeat`` are read from the unrepeated tensor), queries and keys
of different lengths (cross-attention), and ``R.nn.attention``. Q, K, V and the bias operands are
read where the graph has them, through the reshapes, transposes, splits and gathers between
(:mod:`~relax_memplan.transform._attention_views`), and the output is written through the
views after the ``P . V`` matmul, so those copies disappear with the scores. ``docs/fusion.md``
lists the forms, per exporter.

Each candidate (a softmax whose result reaches a matmul's first operand, and every
``nn.attention``) is fused or refused with its reason in :attr:`FuseAttention.records`
(:mod:`~relax_memplan.transform.fusion_record`); a refused one is left exactly as it was.

The kernel computes the softmax in streaming form over blocks of keys with a running maximum
and sum: FlashAttention's recurrence (Dao et al., "FlashAttention: Fast and Memory-Efficient
Exact Attention with IO-Awareness", NeurIPS 2022); CPU
(:mod:`~relax_memplan.transform._attention_kernel`) or CUDA
(:mod:`~relax_memplan.transform._attention_kernel_gpu`).

Memory: every intermediate of the block (scores, their steps, probabilities) has no reader
outside it (else the candidate is refused), and the tensors the kernel reads instead of the
matmul operands are no larger in total than those operands (else it reads the operands
themselves, where a slice or gather of a larger tensor stands), so the rewrite adds no tensor
and the function's peak live bytes cannot rise.
"""

from __future__ import annotations

from typing import Dict, List, Optional, Union

import tvm
import tvm_ffi
from tvm import relax, tirx
from tvm.relax.expr_functor import PyExprMutator, mutator
from tvm.target import Target

from . import _attention_kernel, _attention_kernel_gpu
from ._attention_match import (AttentionMatch, FunctionGraph, Refusal, candidates,
                               find_attention, find_nn_attention)
from ._attention_spec import Access, KernelSpec, Step
from ._attention_views import static_shape_values
from ._module_util import replace_functions
from .fusion_record import PatternRecord

__all__ = ["FuseAttention", "kernel_spec"]


@tvm.transform.module_pass(opt_level=0, name="FuseAttention")
class FuseAttention:
    """Rewrite each attention block into one streaming-softmax kernel (module docstring).

    Parameters
    ----------
    block_keys : int, optional
        Keys per block of the streaming softmax (CPU: scores held per task at a time; CUDA:
        keys per shared-memory tile). Default 32 on CPU, 16 on CUDA.
    block_queries : int, optional
        Query rows per parallel task (CPU) or per thread block (CUDA). Default 32, but 16 on
        a CPU with 256-bit vectors and no AVX-512 (AVX2: 16 registers of 8 float32 lanes): a
        task's register tiles (4 keys x the rows of scores, 4 head-dim entries x the rows of
        output) then take 8 registers instead of all 16, and the kernel ran 1.2-1.4x faster
        (``benchmarks/attention_bench.py``, znver3, head dim 64, seq 32-512, 1 and 2
        threads); with AVX-512 (32 registers of 16 lanes) 32 rows take 8, and with SSE 8 rows
        were no faster than 32.
    target : str, dict or tvm.target.Target, optional
        Whose kernel to emit: ``cuda`` gets the CUDA kernel, any other kind (default
        ``llvm``) the CPU one.

    Attributes
    ----------
    fused : int
        Attention blocks rewritten by the last run.
    records : list of PatternRecord
        ``[attention]``: candidates, fused, and each refusal with its reason and bindings.

    Raises
    ------
    ValueError
        A block size below 1.
    """

    def __init__(self, block_keys: Optional[int] = None, block_queries: Optional[int] = None,
                 target: Union[str, dict, Target, None] = None):
        tgt = target if isinstance(target, Target) else Target(target or "llvm")
        self.gpu = tgt.kind.name == "cuda"
        block_keys = block_keys if block_keys is not None else (16 if self.gpu else 32)
        if block_queries is None:
            block_queries = 32 if self.gpu else _cpu_block_queries(tgt)
        if block_keys < 1 or block_queries < 1:
            raise ValueError(f"block sizes must be >= 1, got block_keys={block_keys}, "
                             f"block_queries={block_queries}")
        self.block_keys = block_keys
        self.block_queries = block_queries
        self.fused = 0
        self.records = [PatternRecord("attention")]

    def transform_module(self, mod: tvm.IRModule, _ctx) -> tvm.IRModule:
        record = PatternRecord("attention")
        self.records = [record]
        kernels = _Kernels(self)
        updates = {}
        rewriter = None
        for gv, func in mod.functions_items():
            if not isinstance(func, relax.Function) or not isinstance(func.body, relax.SeqExpr):
                continue
            plans = self._plans(func, gv.name_hint, record)
            if not plans:
                continue
            rewriter = rewriter or _Rewriter(mod)
            rewriter.plans = {anchor: (kernels.get(rewriter, spec), spec, sources)
                              for anchor, (spec, sources) in plans.items()}
            updates[gv] = relax.analysis.remove_all_unused(rewriter.visit_expr(func))
        self.fused = record.fused
        if not updates:
            return mod
        return replace_functions(rewriter.builder_.get(), updates)

    def _plans(self, func, name, record) -> Dict[relax.Var, tuple]:
        """Anchor var -> (kernel spec, source exprs) of each block fused in ``func``; the
        others refused in ``record``."""
        graph = FunctionGraph(func)
        found = [(var, kind, _find(graph, var, kind)) for var, kind in candidates(graph)]
        # a block may read another's output through views: never through its anchor, whose
        # bindings before it the other kernel replaces; so all anchors first, then again
        graph.barrier = {m.anchor for _, _, m in found if isinstance(m, AttentionMatch)}
        plans = {}
        for var, kind, got in found:
            if isinstance(got, AttentionMatch):
                got = _find(graph, var, kind)
            if got is None:
                continue
            if isinstance(got, Refusal):
                record.refuse(got.reason, got.bindings, func, name)
                continue
            spec, sources = kernel_spec(got)
            kernel = _attention_kernel_gpu if self.gpu else _attention_kernel
            reason = kernel.decline_reason(spec)
            if reason is not None:
                record.refuse(f"kernel declined: {reason}", got.bindings, func, name)
                continue
            plans[got.anchor] = (spec, sources)
            record.accept()
        return plans


def _cpu_block_queries(target: Target) -> int:
    """16 for an llvm target with 8 float32 SIMD lanes (AVX2), else 32 (see ``block_queries``)."""
    from ..schedules import simd_lanes

    return 16 if simd_lanes(target, "float32") == 8 else 32


def _find(graph, var, kind):
    return find_attention(graph, var) if kind == "softmax" else find_nn_attention(graph, var)


class _Kernels:
    """The kernels of one run, one GlobalVar per structurally distinct PrimFunc; a spec
    equal to one seen before (:meth:`KernelSpec.fingerprint`) reuses its kernel unbuilt."""

    def __init__(self, owner: FuseAttention):
        self.owner = owner
        self.built: List[tuple] = []
        self.by_spec: List[tuple] = []

    def get(self, rewriter, spec: KernelSpec) -> relax.GlobalVar:
        plain, exprs = spec.fingerprint()
        for known_plain, known_exprs, gv in self.by_spec:
            if known_plain == plain and tvm_ffi.structural_equal(known_exprs, exprs,
                                                                 map_free_vars=True):
                return gv
        gv = self._build(rewriter, spec)
        self.by_spec.append((plain, exprs, gv))
        return gv

    def _build(self, rewriter, spec: KernelSpec) -> relax.GlobalVar:
        o = self.owner
        if o.gpu:
            func = _attention_kernel_gpu.attention_kernel_gpu(spec, o.block_keys,
                                                              o.block_queries)
        else:
            func = _attention_kernel.attention_kernel(spec, o.block_keys, o.block_queries)
        for known, gv in self.built:
            if tvm_ffi.structural_equal(known, func, map_free_vars=True):
                return gv
        gv = rewriter.builder_.add_func(func, "fused_attention")
        self.built.append((func, gv))
        return gv


def kernel_spec(match: AttentionMatch):
    """(:class:`~relax_memplan.transform._attention_spec.KernelSpec`, the Relax exprs of its
    inputs in order) of a match."""
    sources: List[relax.Expr] = []

    def access(traced) -> Access:
        for k, s in enumerate(sources):
            if s.same_as(traced.source):
                return Access(k, traced.index)
        sources.append(traced.source)
        return Access(len(sources) - 1, traced.index)

    q, k, v = access(match.q), access(match.k), access(match.v)
    steps = [Step(s.op, s.operand if not hasattr(s.operand, "source") else access(s.operand),
                  access(s.cond) if s.cond is not None else None, s.swapped, s.dtype)
             for s in match.steps]
    space = match.space
    inputs = [(static_shape_values(s), s.ty.dtype) for s in sources]
    out_shape = static_shape_values(match.anchor)
    canonical = [space.vars[n] for n in match.lead + ["i", "j", "d", "e"]]
    spec = KernelSpec(canonical, [space.extents[n] for n in match.lead], space.extents["i"],
                      space.extents["j"], int(space.extents["d"]), int(space.extents["e"]),
                      inputs, q, k, v, steps, match.scale, match.guard, out_shape,
                      match.out_dtype, Access(-1, match.out_index))
    spec.params = _symbolic_vars(spec)
    return spec, sources


def _symbolic_vars(spec: KernelSpec) -> List[tirx.Var]:
    """The shape vars (``batch``, ``seq``) that the kernel's shapes and indices use."""
    exprs = [x for shape, _ in spec.inputs for x in shape] + list(spec.out_shape)
    exprs += list(spec.lead) + [spec.seq_q, spec.seq_k]
    accesses = [spec.q, spec.k, spec.v, spec.out] + [a for s in spec.steps
                                                     for a in (s.operand, s.cond)
                                                     if isinstance(a, Access)]
    exprs += [x for a in accesses for x in a.index]
    found, seen = [], set(spec.canonical)
    for expr in exprs:
        for var in tirx.analysis.undefined_vars(tirx.Evaluate(expr), []):
            if var not in seen:
                seen.add(var)
                found.append(var)
    return found


@mutator
class _Rewriter(PyExprMutator):
    """Replaces the binding of each anchor var by the kernel's ``call_tir``."""

    def __init__(self, mod):
        super().__init__(mod)
        self.plans: Dict[relax.Var, tuple] = {}

    def visit_var_binding_(self, binding):
        plan = self.plans.get(binding.var)
        if plan is None:
            return super().visit_var_binding_(binding)
        gv, spec, sources = plan
        call = relax.call_tir(gv, list(sources) + list(spec.params), out_ty=binding.var.ty)
        return super().visit_var_binding_(relax.VarBinding(binding.var, call))
