"""FuseAttention: scaled dot-product attention as one kernel, without the score matrix.

Where it runs: on the high-level Relax graph, before ``LegalizeOps`` (our pipeline runs it in
the ``legalize`` phase with ``fusion=True``, llvm and cuda targets: the emitted kernel carries
its own CPU or CUDA schedule and is marked ``tirx.is_scheduled``, so dlight, our CPU schedules
and ``SpecializeKernels`` leave it alone). Reads no attributes.

What it matches (the form TVM's ONNX importer gives BERT's and GPT-2's attention)::

    s = R.matmul(permute_dims(q4, [0, 2, 1, 3]), permute_dims(k4, [0, 2, 3, 1]))
    s = R.multiply(s, c) | R.multiply(c, s) | R.divide(s, c)      # optional, c a scalar constant
    s = R.add(s, mask) | R.add(mask, s)                            # optional additive mask
    p = R.nn.softmax(s, axis=-1)
    o = R.matmul(p, permute_dims(v4, [0, 2, 1, 3]))

with q4, k4, v4 of shape (batch, seq, heads, head_dim), heads and head_dim static, and a 4-d
mask whose batch, head and query dims are either 1 or the full extent. ``o`` becomes
``permute_dims(call_tir(attention, (q4, k4, v4[, mask])), [0, 2, 1, 3])``; a later
``permute_dims(o, [0, 2, 1, 3])`` cancels with it. The kernel
(:mod:`~relax_memplan.transform._attention_kernel`) computes the softmax in streaming form
over blocks of keys with a running maximum and sum: FlashAttention's recurrence (Dao et al.,
"FlashAttention: Fast and Memory-Efficient Exact Attention with IO-Awareness", NeurIPS 2022).

Memory: the rewrite is applied only where every intermediate (scores, scaled scores, masked
scores, probabilities) has no other reader and the q/k/v inputs come from the transposes
above, so it adds no tensor and removes three (batch, heads, seq, seq) tensors and three
transposes: the function's peak live bytes cannot rise.
"""

from __future__ import annotations

from typing import Dict, Optional, Union

import numpy as np
import tvm
from tvm import relax
from tvm.relax.expr_functor import PyExprMutator, mutator
from tvm.target import Target

from ._attention_kernel import attention_kernel
from ._attention_kernel_gpu import attention_kernel_gpu
from ._module_util import replace_functions

__all__ = ["FuseAttention"]

_Q_AXES = (0, 2, 1, 3)  # (b, s, h, d) -> (b, h, s, d), also for v and the output
_K_AXES = (0, 2, 3, 1)  # (b, s, h, d) -> (b, h, d, s)


@tvm.transform.module_pass(opt_level=0, name="FuseAttention")
class FuseAttention:
    """Rewrite matmul -> scale -> mask -> softmax -> matmul into one streaming-softmax kernel.

    Parameters
    ----------
    block_keys : int, optional
        Keys per block of the streaming softmax (CPU: scores held per task at a time; CUDA:
        keys per shared-memory tile). Default 32 on CPU, 16 on CUDA.
    block_queries : int, optional
        Query rows per parallel task (CPU) or per thread block (CUDA). Default 32.
    target : str, dict or tvm.target.Target, optional
        Whose kernel to emit: ``cuda`` gets the CUDA kernel
        (:mod:`~relax_memplan.transform._attention_kernel_gpu`), any other kind (default
        ``llvm``) the CPU one (:mod:`~relax_memplan.transform._attention_kernel`).

    Attributes
    ----------
    fused : int
        Attention blocks rewritten by the last run.

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
        block_queries = block_queries if block_queries is not None else 32
        if block_keys < 1 or block_queries < 1:
            raise ValueError(f"block sizes must be >= 1, got block_keys={block_keys}, "
                             f"block_queries={block_queries}")
        self.block_keys = block_keys
        self.block_queries = block_queries
        self.fused = 0

    def transform_module(self, mod: tvm.IRModule, _ctx) -> tvm.IRModule:
        self.fused = 0
        kernel = attention_kernel_gpu if self.gpu else attention_kernel
        rewriter = _Rewriter(mod, kernel, self.block_keys, self.block_queries)
        updates = {}
        for gv, func in mod.functions_items():
            if not isinstance(func, relax.Function):
                continue
            before = rewriter.fused
            rewriter.uses = _use_counts(func)
            new_func = rewriter.visit_expr(func)
            if rewriter.fused > before:
                updates[gv] = relax.analysis.remove_all_unused(new_func)
        self.fused = rewriter.fused
        if not updates:
            return mod
        new_mod = rewriter.builder_.get()
        return replace_functions(new_mod, updates)


def _use_counts(func) -> Dict[str, int]:
    """Readers of each var, by name: the mutator renames nothing but makes new vars downstream
    of a rewrite, and two vars sharing a name only make the count larger (no fusion)."""
    counts: Dict[str, int] = {}

    def add(var):
        counts[var.name] = counts.get(var.name, 0) + 1

    def visit(expr):
        if isinstance(expr, relax.Call):
            for arg in expr.args:
                if isinstance(arg, relax.Var):
                    add(arg)
        elif isinstance(expr, relax.Tuple):
            for field in expr.fields:
                if isinstance(field, relax.Var):
                    add(field)
        elif isinstance(expr, relax.TupleGetItem) and isinstance(expr.tuple_value, relax.Var):
            add(expr.tuple_value)

    relax.analysis.post_order_visit(func.body, visit)
    # a var returned, or used outside a call (R.output, a var-to-var binding), is kept
    for block in func.body.blocks:
        for binding in block.bindings:
            if isinstance(binding.value, relax.Var):
                add(binding.value)
    if isinstance(func.body.body, relax.Var):
        add(func.body.body)
    return counts


def _is_op(expr, name: str) -> bool:
    return isinstance(expr, relax.Call) and isinstance(expr.op, tvm.ir.Op) and expr.op.name == name


def _scalar(expr) -> Optional[float]:
    if isinstance(expr, tvm.ir.GenericConst) and isinstance(expr.value, tvm.runtime.Tensor):
        value = expr.value.numpy()
        if value.size == 1 and value.dtype.kind == "f":
            return float(value.reshape(()))
    return None


def _same(a, b) -> bool:
    return tvm.sym.Analyzer().can_prove_equal(a, b)


@mutator
class _Rewriter(PyExprMutator):
    def __init__(self, mod, kernel, block_keys, block_queries):
        super().__init__(mod)
        self.kernel = kernel
        self.block_keys = block_keys
        self.block_queries = block_queries
        self.uses: Dict[relax.Var, int] = {}
        self.kernels: Dict[tuple, relax.GlobalVar] = {}
        self.fused = 0

    # -- helpers on the new (already visited) graph
    def _bound(self, var, op: str, single_use: bool = True):
        """The call ``var`` is bound to if it is ``op`` (and ``var`` has one reader)."""
        if not isinstance(var, relax.Var):
            return None
        if single_use and self.uses.get(var.name, 0) != 1:
            return None
        value = self.lookup_binding(var)
        return value if _is_op(value, op) else None

    def _unpermute(self, var, axes) -> Optional[relax.Expr]:
        """x when ``var = permute_dims(x, axes)``."""
        value = self._bound(var, "relax.permute_dims", single_use=False)
        if value is None or value.attrs.axes is None:
            return None
        if tuple(int(a) for a in value.attrs.axes) != axes:
            return None
        return value.args[0]

    def visit_call_(self, call):
        call = super().visit_call_(call)
        if _is_op(call, "relax.permute_dims"):
            return self._cancel_permutes(call)
        if _is_op(call, "relax.matmul"):
            fused = self._match(call)
            if fused is not None:
                return fused
        return call

    def _cancel_permutes(self, call):
        inner = self._bound(call.args[0], "relax.permute_dims", single_use=False)
        if inner is None or inner.attrs.axes is None or call.attrs.axes is None:
            return call
        a = [int(x) for x in inner.attrs.axes]
        b = [int(x) for x in call.attrs.axes]
        if [a[i] for i in b] == list(range(len(a))):
            return inner.args[0]
        return call

    def _match(self, out_mm):
        probs, v_t = out_mm.args
        softmax = self._bound(probs, "relax.nn.softmax")
        if softmax is None or int(softmax.attrs.axis) not in (-1, 3):
            return None
        scores, mask = softmax.args[0], None
        add = self._bound(scores, "relax.add")
        if add is not None:
            for s, m in ((add.args[0], add.args[1]), (add.args[1], add.args[0])):
                if any(self._bound(s, op) is not None
                       for op in ("relax.multiply", "relax.divide", "relax.matmul")):
                    scores, mask = s, m
                    break
            else:
                return None
        scale = 1.0
        for op in ("relax.multiply", "relax.divide"):
            scaled = self._bound(scores, op)
            if scaled is None:
                continue
            c = _scalar(scaled.args[1])
            if c is None and op == "relax.multiply":
                c, scaled_arg = _scalar(scaled.args[0]), scaled.args[1]
            else:
                scaled_arg = scaled.args[0]
            if c is None or (op == "relax.divide" and c == 0.0):
                return None
            scale, scores = (c if op == "relax.multiply" else 1.0 / c), scaled_arg
            break
        qk = self._bound(scores, "relax.matmul")
        if qk is None:
            return None
        q4 = self._unpermute(qk.args[0], _Q_AXES)
        k4 = self._unpermute(qk.args[1], _K_AXES)
        v4 = self._unpermute(v_t, _Q_AXES)
        if q4 is None or k4 is None or v4 is None:
            return None
        return self._emit(q4, k4, v4, mask, scale, out_mm)

    def _emit(self, q4, k4, v4, mask, scale, out_mm):
        q_ty, k_ty, v_ty = (x.ty for x in (q4, k4, v4))
        if any(t.ndim != 4 or t.shape is None for t in (q_ty, k_ty, v_ty)):
            return None
        dtype = q_ty.dtype
        if dtype not in ("float32", "float16") or k_ty.dtype != dtype or v_ty.dtype != dtype:
            return None
        b, sq, h, d = q_ty.shape.values
        kb, sk, kh, kd = k_ty.shape.values
        vb, vs, vh, vd = v_ty.shape.values
        if not (isinstance(h, tvm.tirx.IntImm) and isinstance(d, tvm.tirx.IntImm)):
            return None
        if not all(_same(x, y) for x, y in ((b, kb), (b, vb), (h, kh), (h, vh), (d, kd),
                                             (d, vd), (sk, vs))):
            return None
        broadcast = None
        if mask is not None:
            m_ty = mask.ty
            if m_ty.ndim != 4 or m_ty.shape is None or m_ty.dtype != dtype:
                return None
            mdims = m_ty.shape.values
            broadcast = []
            for m, full in zip(mdims[:3], (b, h, sq)):
                if isinstance(m, tvm.tirx.IntImm) and int(m) == 1:
                    broadcast.append(True)
                elif _same(m, full):
                    broadcast.append(False)
                else:
                    return None
            if not _same(mdims[3], sk):
                return None
            broadcast = tuple(broadcast)
        key = (int(h), int(d), dtype, float(np.float32(scale)), broadcast)
        if key not in self.kernels:
            func = self.kernel(int(h), int(d), dtype, key[3], broadcast,
                                    self.block_keys, self.block_queries)
            self.kernels[key] = self.builder_.add_func(func, "fused_attention")
        args = [q4, k4, v4] + ([mask] if mask is not None else [])
        out = self.builder_.emit(relax.call_tir(
            self.kernels[key], args, out_ty=relax.TensorType((b, sq, h, d), dtype)))
        self.fused += 1
        return relax.op.permute_dims(out, list(_Q_AXES))
