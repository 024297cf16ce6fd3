"""What the fused attention kernels compute and read: :class:`KernelSpec`, shared by the CPU
(:mod:`~relax_memplan.transform._attention_kernel`) and CUDA
(:mod:`~relax_memplan.transform._attention_kernel_gpu`) kernels.

A kernel computes, for every leading index ``lead`` (batch, heads, windows: whatever the
scores' leading dims are), query ``i`` and value dim ``e``::

    out[f_out(lead, i, e)] = sum_j softmax_j(steps(scale * sum_d q(lead, i, d) k(lead, j, d)))
                             * v(lead, j, e)

where ``q(lead, i, d)`` is ``inputs[q.input][q.index(lead, i, d)]`` (likewise ``k``, ``v``
and the operands of the score ``steps``): the index expressions, over the canonical variables
of the block (:class:`~relax_memplan.transform._attention_views.IndexSpace`), say where each
element lives in the tensors the graph has, so no transposed or repeated copy is made. The
kernel's buffers are those tensors (``inputs``, in call order) and the output; symbolic dims of
their shapes are scalar parameters (``params``), passed by ``call_tir`` after the inputs.

:func:`build_prim_func` wraps a body written with TVMScript over these buffers into the
PrimFunc ``(inputs..., params..., out)``.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Callable, Dict, List, Optional, Sequence, Union

import tvm
from tvm import tirx

__all__ = ["Access", "Step", "KernelSpec", "build_prim_func", "declare_buffers", "float_min",
           "whole_regions"]

_map_indices = tvm.get_global_func("tirx.IndexMapMapIndices")

float_min = -3.4028234663852886e38  # numpy.finfo(float32).min


@dataclass
class Access:
    """``inputs[input][index]``, ``index`` over the spec's canonical variables."""

    input: int
    index: List[tirx.Expr]


@dataclass
class Step:
    """One score step (:class:`~relax_memplan.transform._attention_match.ScoreStep` with its
    operands as :class:`Access`)."""

    op: str
    operand: Union[float, Access, None] = None
    cond: Optional[Access] = None
    swapped: bool = False
    dtype: str = "float32"


@dataclass
class KernelSpec:
    """One fused attention block (module docstring).

    Attributes
    ----------
    canonical : list of tirx.Var
        ``lead0..``, ``i``, ``j``, ``d``, ``e``, the variables the indices are written over.
    lead : list of PrimExpr
        Extents of the leading dims (their product is the number of independent rows' groups).
    seq_q, seq_k : PrimExpr
        Query and key counts.
    head_dim, value_dim : int
        ``d`` and ``e`` extents (static).
    inputs : list of (shape, dtype)
        Buffers read, in call order.
    q, k, v : Access
    steps : list of Step
    scale : float
        Multiplies ``q . k`` (the q row is scaled when loaded).
    guard : bool
        Rows with no finite score give 0 (``where(isnan(p), 0, p)`` after the softmax),
        else NaN as the unfused softmax does.
    out_shape, out_dtype, out : list, str, Access
        The output tensor and where ``(lead, i, e)`` is written (``out.input`` unused).
    params : list of tirx.Var
        Symbolic dims of the shapes, scalar parameters between the inputs and the output.
    """

    canonical: List[tirx.Var]
    lead: List[tirx.Expr]
    seq_q: tirx.Expr
    seq_k: tirx.Expr
    head_dim: int
    value_dim: int
    inputs: List[tuple]
    q: Access
    k: Access
    v: Access
    steps: List[Step]
    scale: float
    guard: bool
    out_shape: List[tirx.Expr]
    out_dtype: str
    out: Access
    params: List[tirx.Var] = field(default_factory=list)

    def value_of(self, buffers, access: Access, lead: Sequence, i=0, j=0, d=0, e=0):
        """``inputs[access.input]`` (from ``buffers``) at ``access.index`` with the canonical
        variables given these values, as float32."""
        values = list(lead) + [i, j, d, e]
        imap = tirx.IndexMap(self.canonical, access.index, None)
        index = _map_indices(imap, [_i64(x) for x in values], tvm.sym.Analyzer())
        load = buffers[access.input][tuple(index)]
        return load if load.ty.dtype == "float32" else tirx.Cast("float32", load)

    def out_index(self, lead: Sequence, i, e) -> List[tirx.Expr]:
        imap = tirx.IndexMap(self.canonical, self.out.index, None)
        return list(_map_indices(imap, [_i64(x) for x in list(lead) + [i, 0, 0, e]],
                                 tvm.sym.Analyzer()))

    def epilogue(self, buffers, s, lead: Sequence, i, j) -> tirx.Expr:
        """``steps`` applied to the float32 score ``s`` of query ``i``, key ``j``."""
        for step in self.steps:
            if step.op == "cast":
                if step.dtype != "float32":
                    s = tirx.Cast("float32", tirx.Cast(step.dtype, s))
                continue
            if step.op == "tanh":
                s = tirx.tanh(s)
                continue
            x = (tirx.FloatImm("float32", step.operand) if isinstance(step.operand, float)
                 else self.value_of(buffers, step.operand, lead, i, j))
            if step.op == "where":
                cond = self._cond(buffers, step.cond, lead, i, j)
                s = tirx.Select(cond, x, s) if step.swapped else tirx.Select(cond, s, x)
                continue
            a, b = (x, s) if step.swapped else (s, x)
            s = _BINARY[step.op](a, b)
        return s

    def _cond(self, buffers, access, lead, i, j):
        values = list(lead) + [i, j, 0, 0]
        imap = tirx.IndexMap(self.canonical, access.index, None)
        index = _map_indices(imap, [_i64(x) for x in values], tvm.sym.Analyzer())
        load = buffers[access.input][tuple(index)]
        return load if load.ty.dtype == "bool" else load != tirx.const(0, load.ty.dtype)

    def lead_values(self, group) -> List[tirx.Expr]:
        """The leading indices of group number ``group`` (row-major over ``lead``)."""
        out = []
        for extent in reversed(self.lead[1:]):
            out.append(tirx.floormod(group, extent))
            group = tirx.floordiv(group, extent)
        out.append(group)
        return out[::-1] if self.lead else []

    def groups(self) -> tirx.Expr:
        n = tirx.IntImm("int64", 1)
        for extent in self.lead:
            n = n * extent
        return n

    def fingerprint(self) -> tuple:
        """``(plain, exprs)``: two specs whose ``plain`` parts are equal and whose ``exprs``
        are ``structural_equal(..., map_free_vars=True)`` build the same kernel, so the
        fused layers of a model build it once (its TVMScript parse takes ~1 s).

        ``exprs`` holds every index and extent as one ``IndexMap`` per access over the
        canonical variables (bound positionally) and one of the extents and shapes; the
        symbolic dims in them are free vars, matched consistently across the whole list."""
        accesses = [self.q, self.k, self.v, self.out] + [
            a for st in self.steps for a in (st.operand, st.cond) if isinstance(a, Access)]
        extents = (list(self.lead) + [self.seq_q, self.seq_k] + list(self.out_shape)
                   + [d for shape, _ in self.inputs for d in shape] + list(self.params))
        exprs = [tirx.IndexMap(self.canonical, [_i64(x) for x in a.index], None)
                 for a in accesses]
        exprs.append(tirx.IndexMap(self.canonical, [_i64(x) for x in extents], None))
        plain = (self.head_dim, self.value_dim, self.scale, self.guard, self.out_dtype,
                 len(self.canonical), len(self.lead), len(self.params), len(self.out_shape),
                 tuple((len(shape), str(dtype)) for shape, dtype in self.inputs),
                 tuple((a.input, len(a.index)) for a in accesses),
                 tuple((st.op, st.operand if not isinstance(st.operand, Access) else "access",
                        st.cond is not None, st.swapped, st.dtype) for st in self.steps))
        return plain, exprs


_BINARY: Dict[str, Callable] = {
    "add": lambda a, b: a + b, "subtract": lambda a, b: a - b,
    "multiply": lambda a, b: a * b, "divide": lambda a, b: a / b,
    "maximum": tirx.max, "minimum": tirx.min,
}


def _i64(x):
    if isinstance(x, int):
        return tirx.IntImm("int64", x)
    return x if x.ty.dtype == "int64" else tirx.Cast("int64", x)


def build_prim_func(spec: KernelSpec, parsed: tirx.PrimFunc, buffers, out) -> tirx.PrimFunc:
    """The PrimFunc ``(inputs..., params..., out)`` around the body of ``parsed`` (a
    parameterless TVMScript function written over ``buffers`` and ``out``), private, marked
    ``tirx.noalias`` and ``tirx.is_scheduled``."""
    func = tirx.PrimFunc(list(buffers) + list(spec.params) + [out], parsed.body)
    return func.with_attr("tirx.noalias", True).with_attr("tirx.is_scheduled", True)


def declare_buffers(spec: KernelSpec):
    """(input buffers, output buffer) of the spec's shapes and dtypes."""
    buffers = [tirx.decl_buffer(shape, dtype, name=f"in{k}")
               for k, (shape, dtype) in enumerate(spec.inputs)]
    out = tirx.decl_buffer(spec.out_shape, spec.out_dtype, name="out")
    return buffers, out


def whole_regions(buffers):
    """Each buffer's whole region (the kernel block's reads/writes)."""
    zero = tirx.IntImm("int64", 0)
    return [tirx.BufferRegion(b, [tvm.ir.Range.from_min_extent(zero, _i64(x)) for x in b.shape])
            for b in buffers]
