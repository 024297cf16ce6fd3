"""ChunkFeedForward: a transformer feed-forward block computed over row chunks of its input.

Where it runs: on the high-level Relax graph, before ``LegalizeOps`` (our pipeline runs it in
the ``legalize`` phase with ``fusion=True``, last of :func:`~relax_memplan.pipeline.fusion_passes`).
Reads the function attributes ``tir_var_upper_bound`` (size of the wide hidden tensor, and the
peak check) and ``tir_var_lower_bound`` (whether a symbolic axis can be cut); writes none.

What it matches, in one dataflow block (a :mod:`tvm.relax.dpl` pattern anchors the first
matmul, ``matmul(x, W1)`` with an optional ``add(., b1)``; the activation is then walked)::

    h = R.add(R.matmul(x, W1), b1)            # (..., F), the wide hidden tensor
    a = <elementwise chain of h and constants> # GELU erf/tanh form as the ONNX importer
                                               # writes it, R.nn.gelu, relu, ...
    y = R.add(R.matmul(a, W2), b2)            # (..., H), b1/b2 optional

where every intermediate of ``h .. a`` is read only inside the block, ``W1``/``W2`` are 2-d, and
biases and the activation's constants are scalars or 1-d (the same for every row). It
becomes, for ``k`` chunks along one leading axis of ``x``::

    x_i = R.strided_slice(x, [axis], [b_i], [e_i]); y_i = <the block on x_i>
    y = R.concat([y_0, ..., y_{k-1}], axis)

so only one chunk of the wide tensor (and its activation) is live at a time: the memory-saving
chunking of the Reformer's "chunked feed-forward layers" (Kitaev et al., 2020) and of Hugging
Face's ``apply_chunking_to_forward``; each chunk is still one fused matmul + bias + GELU kernel
after TVM's FuseOps.

Rule (when it applies):

- the wide tensor's size (at the function's ``tir_var_upper_bound`` when symbolic) is at least
  ``min_hidden_bytes`` (default 1 MiB): small blocks keep their kernel count;
- ``k = max(2, ceil(F / H))`` chunks (the wide tensor's chunk no bigger than the block's
  input/output), cut along a leading axis (not the last) of length ``n >= 2``: static, or
  symbolic with ``tir_var_lower_bound >= 2`` (``n`` is that bound). The first axis with
  ``n >= k`` is taken, else the longest, and ``k`` is capped at ``n``. A static axis is cut by
  ``strided_slice`` at ``floor(i * n / k)`` (chunks differ by at most one row); a symbolic one by
  TVM's ``split`` in ``k`` sections (``ceil(n / k)`` rows each, the last the rest), ``k`` lowered
  until no section can be empty for any length in the dim's declared range (an empty chunk
  crashed the VM); an unknown upper bound or a range over 65536 long: not cut. The ``k`` input
  chunks of a split are live together; the wide tensor is still one chunk at a time. No such
  axis: skipped (``skipped["axis"]``);
- each chunk keeps at least ``min_chunk_rows`` rows (default 128; the product of the leading
  extents over ``k``, symbolic ones at their ``tir_var_lower_bound``), ``k`` lowered to fit or
  the block skipped (``skipped["rows"]``): a matmul over fewer rows re-reads its weights for
  less work, and on our CPU schedules costs more per row (``benchmarks/ffn_rows_bench.py``:
  per row 1.16x at 32 rows, 1.10x at 64, within 3 % of the best from 128 on), which made
  BERT-base at 1 x 128 slower with its FFN in four 32-row chunks than unchunked;
- the function's peak live bytes after TVM's fusion and lowering
  (:func:`~relax_memplan.analysis.lowered_peak.lowered_peak_live_bytes`) must drop with all the
  function's sites chunked; otherwise none is (``skipped["peak"]``). All or nothing, because
  identical layers share one peak: chunking one of twelve lowers nothing. This costs two
  lowerings of the function at compile time.

Cost: per block ``2 k`` matmul kernels instead of 2, plus the slices (or one split) and one
concat, each a copy of an (n, ..., H) tensor; vars are told apart by name (as the importer
names them, unique per function).
"""

from __future__ import annotations

from typing import Dict, List, Optional

import tvm
from tvm import relax
from tvm.relax.dpl import is_op, wildcard

from ..analysis.dims import evaluate_bytes
from ..analysis.lowered_peak import lowered_peak_live_bytes
from ._module_util import replace_functions
from .fusion_record import RefusalLog

__all__ = ["ChunkFeedForward", "ACTIVATION_OPS", "REASONS"]

#: ``skipped`` reason -> the words of the fusion report.
REASONS = {
    "small": "wide tensor below min_hidden_bytes (or of unknown size)",
    "axis": "no leading axis to cut into chunks",
    "rows": "a chunk would hold fewer than min_chunk_rows rows (its matmuls slower per row)",
    "peak": "the function's peak live bytes would not drop",
}

#: Elementwise operators an activation between the two matmuls may be made of.
ACTIVATION_OPS = frozenset({
    "relax.add", "relax.subtract", "relax.multiply", "relax.divide", "relax.power",
    "relax.erf", "relax.tanh", "relax.sigmoid", "relax.exp", "relax.nn.gelu",
    "relax.nn.gelu_tanh", "relax.nn.relu", "relax.nn.silu",
})


def _first_matmul_pattern():
    """``matmul(x, W1)`` or ``add(matmul(x, W1), b1)``; returns (pattern, matmul, x)."""
    x, w, b = wildcard(), wildcard(), wildcard()
    mm = is_op("relax.matmul")(x, w)
    return mm | is_op("relax.add")(mm, b), mm, x


@tvm.transform.module_pass(opt_level=0, name="ChunkFeedForward")
class ChunkFeedForward:
    """Compute matmul -> activation -> matmul over row chunks where it lowers the peak
    (module docstring for the matched form and the rule).

    Parameters
    ----------
    min_hidden_bytes : int
        Smallest wide hidden tensor (bytes; at the upper bounds when symbolic) worth chunking.
    min_chunk_rows : int
        Fewest rows (product of the leading extents, symbolic ones at their lower bounds) a
        chunk may hold.
    memory_check : bool
        Keep the chunking only if the function's lowered peak live bytes drop.
    target : tvm.target.Target or str, optional
        Whose lowering passes that check runs (default ``llvm``).

    Attributes
    ----------
    chunked : int
        Feed-forward blocks chunked by the last run.
    skipped : dict of str to int
        Matches not chunked, by reason (``small``: below ``min_hidden_bytes`` or size unknown;
        ``axis``: no leading axis to cut; ``rows``: a chunk would hold fewer than
        ``min_chunk_rows`` rows; ``peak``: the peak would not drop).
    records : list of PatternRecord
        ``[feed_forward]``: candidates, chunked, and each refusal with its reason
        (:data:`REASONS`) and bindings (:mod:`~relax_memplan.transform.fusion_record`).

    Raises
    ------
    ValueError
        ``min_hidden_bytes < 0`` or ``min_chunk_rows < 1``.
    """

    def __init__(self, min_hidden_bytes: int = 1 << 20, memory_check: bool = True, target=None,
                 min_chunk_rows: int = 128):
        if min_hidden_bytes < 0:
            raise ValueError(f"min_hidden_bytes must be >= 0, got {min_hidden_bytes}")
        if min_chunk_rows < 1:
            raise ValueError(f"min_chunk_rows must be >= 1, got {min_chunk_rows}")
        self.min_hidden_bytes = min_hidden_bytes
        self.min_chunk_rows = min_chunk_rows
        self.memory_check = memory_check
        self.target = target
        self.chunked = 0
        self.skipped: Dict[str, int] = {}
        self._log = RefusalLog()

    @property
    def records(self):
        return [self._log.record("feed_forward", self.chunked, REASONS, verb="chunked")]

    def transform_module(self, mod: tvm.IRModule, _ctx) -> tvm.IRModule:
        self.chunked, self.skipped, self._log = 0, {}, RefusalLog()
        for gv, func in list(mod.functions_items()):
            if isinstance(func, relax.Function):
                mod = self._function(mod, gv, func)
        return mod

    def _skip(self, reason: str, n: int = 1, names=(), func=None, function: str = ""):
        self.skipped[reason] = self.skipped.get(reason, 0) + n
        if names:
            for name in names:
                self._log.refuse(reason, [name], func=func, function=function)
        else:
            self._log.refuse(reason, n=n, func=func, function=function)

    def _function(self, mod, gv, func):
        rewriter = _Rewriter(mod, self, func)
        new_func = rewriter.visit_expr(func)
        if not rewriter.sites:
            return mod
        new_mod = replace_functions(rewriter.builder_.get(),
                                    {gv: relax.analysis.remove_all_unused(new_func)})
        if self.memory_check:
            name = gv.name_hint
            if (lowered_peak_live_bytes(new_mod, name, self.target)
                    >= lowered_peak_live_bytes(mod, name, self.target)):
                self._skip("peak", len(rewriter.sites), rewriter.sites, func, gv.name_hint)
                return mod
        self.chunked += len(rewriter.sites)
        return new_mod


def _is_op(expr, names) -> bool:
    return (isinstance(expr, relax.Call) and isinstance(expr.op, tvm.ir.Op)
            and expr.op.name in names)


def _bounds(func, key) -> Dict[str, int]:
    attrs = func.attrs
    if attrs is None or key not in attrs:
        return {}
    return {str(k): int(v) for k, v in attrs[key].items()}


def _readers(func) -> Dict[str, int]:
    """How many bindings (or the result) read each var, by name."""
    out: Dict[str, int] = {}

    def note(expr):
        seen = set()

        def visit(e):
            if isinstance(e, relax.Var) and e.name not in seen:
                seen.add(e.name)
                out[e.name] = out.get(e.name, 0) + 1
        relax.analysis.post_order_visit(expr, visit)

    for block in func.body.blocks:
        for binding in block.bindings:
            note(binding.value)
    note(func.body.body)
    return out


@tvm.relax.expr_functor.mutator
class _Rewriter(relax.PyExprMutator):
    def __init__(self, mod, owner: ChunkFeedForward, func):
        super().__init__(mod)
        self.owner = owner
        self.func = func
        self.readers = _readers(func)
        self.upper = _bounds(func, "tir_var_upper_bound")
        self.lower = _bounds(func, "tir_var_lower_bound")
        self.pattern, self.mm_pat, self.x_pat = _first_matmul_pattern()
        self.sites: List[str] = []
        # a matmul whose bias add follows is chunked at the add
        self.biased = {b.value.args[0].name for block in func.body.blocks for b in block.bindings
                       if _is_op(b.value, ("relax.add",)) and isinstance(b.value.args[0], relax.Var)}
        self.positions = {b.var.name: i for i, b in
                          enumerate(b for block in func.body.blocks for b in block.bindings)}

    def _bound(self, var):
        return self.lookup_binding(var) if isinstance(var, relax.Var) else None

    def visit_var_binding_(self, binding):
        value = binding.value

        if (isinstance(binding.var, relax.DataflowVar)  # a block output keeps its binding
                and _is_op(value, ("relax.matmul", "relax.add"))):
            chunked = self._try(binding.var, value)
            if chunked is not None:
                self.set_var_remap(binding.var, chunked)
                return
        super().visit_var_binding_(binding)

    def _single(self, var) -> bool:
        return isinstance(var, relax.Var) and self.readers.get(var.name, 0) == 1

    def _second_matmul(self, value):
        """(matmul call, bias or None) when ``value`` is ``[add(]matmul(a, W2)[, b2)]``."""
        if _is_op(value, ("relax.add",)):
            mm = self._bound(value.args[0])
            if not _is_op(mm, ("relax.matmul",)) or not self._single(value.args[0]):
                return None, None
            return mm, value.args[1]
        return (value, None) if _is_op(value, ("relax.matmul",)) else (None, None)

    def _region(self, act):
        """(region vars in program order, first-block output h, x) for the activation ``act``,
        or None when it is not an elementwise chain of one matmul's output."""
        region, stack, h = {}, [act], None
        while stack:
            var = stack.pop()
            if var.name in region:
                continue
            value = self._bound(var)
            if self._is_first_block(value):
                if h is not None and h.name != var.name:
                    return None
                h, region[var.name] = var, var
                continue
            if not _is_op(value, ACTIVATION_OPS):
                return None
            region[var.name] = var
            for arg in value.args:
                if isinstance(arg, relax.Var):
                    stack.append(arg)
                elif not (isinstance(arg, tvm.ir.GenericConst) and _row_free(arg)):
                    return None
        return (region, h) if h is not None else None

    def _is_first_block(self, value) -> bool:
        """``value`` is ``matmul(x, W1)`` or ``add(mm, b1)`` with ``mm`` such a matmul (read
        only by the add)."""
        if value is None:
            return False
        var2val = {}
        if _is_op(value, ("relax.add",)) and self._single(value.args[0]):
            inner = self._bound(value.args[0])
            if inner is not None:
                var2val[value.args[0]] = inner
        return self.pattern.extract_matched_expr(value, var2val) is not None

    def _try(self, var, value) -> Optional[relax.Expr]:
        mm2, b2 = self._second_matmul(value)
        if (mm2 is None or not isinstance(mm2.args[0], relax.Var)
                or (b2 is None and var.name in self.biased)):
            return None
        found = self._region(mm2.args[0])
        if found is None:
            return None
        region, h = found
        if any(self.readers.get(n, 0) != 1 for n in region if n != h.name):
            return None  # an intermediate read outside the block
        h_value = self._bound(h)
        mm1 = self._bound(h_value.args[0]) if _is_op(h_value, ("relax.add",)) else h_value
        if _is_op(h_value, ("relax.add",)) and not self._single(h_value.args[0]):
            return None
        x = mm1.args[0]
        biases = [b for b in (b2, h_value.args[1] if _is_op(h_value, ("relax.add",)) else None)
                  if b is not None]
        if not all(_ndim(w) == 2 for w in (mm1.args[1], mm2.args[1])) or \
                not all(_row_free(b) for b in biases):
            return None  # a weight or bias that differs between rows cannot follow a chunk
        plan = self._plan(x, h, var)
        if plan is None:
            return None
        self.sites.append(var.name)
        return self._emit(x, plan, h, mm1, region, var, value)

    def _plan(self, x, h, out):
        """(axis, n, k) to cut ``x`` along, or None (skip reason counted)."""
        hty, xty, oty = h.ty, x.ty, out.ty
        if not all(isinstance(t, relax.TensorType) and t.shape is not None
                   for t in (hty, xty, oty)) or xty.ndim < 2 or hty.ndim != xty.ndim:
            return None
        try:
            size = evaluate_bytes(_size_expr(hty), self.upper)
        except (ValueError, TypeError):
            size = None
        if size is None or size < self.owner.min_hidden_bytes:
            self.owner._skip("small", names=[out.name], func=self.func)
            return None
        wide, narrow = hty.shape.values[-1], xty.shape.values[-1]
        if not isinstance(wide, tvm.tirx.IntImm) or not isinstance(narrow, tvm.tirx.IntImm):
            self.owner._skip("axis", names=[out.name], func=self.func)
            return None
        want = max(2, -(-int(wide) // max(int(narrow), 1)))
        sizes = [(axis, dim, int(dim) if isinstance(dim, tvm.tirx.IntImm)
                  else self.lower.get(str(dim), 0))
                 for axis, dim in enumerate(xty.shape.values[:-1])]
        sizes = [s for s in sizes if s[2] >= 2]
        if not sizes:
            self.owner._skip("axis", names=[out.name], func=self.func)
            return None
        # the first axis long enough for ``want`` chunks, else the longest
        axis, dim, n = next((s for s in sizes if s[2] >= want), max(sizes, key=lambda s: s[2]))
        rows = 1
        for d in xty.shape.values[:-1]:
            rows *= int(d) if isinstance(d, tvm.tirx.IntImm) else max(self.lower.get(str(d), 1), 1)
        k = min(want, n, rows // self.owner.min_chunk_rows)
        if k < 2:
            self.owner._skip("rows", names=[out.name], func=self.func)
            return None
        if not isinstance(dim, tvm.tirx.IntImm):
            k = _sections_never_empty(k, n, self.upper.get(str(dim)))
            if k < 2:
                self.owner._skip("axis", names=[out.name], func=self.func)
                return None
        return axis, dim, k

    def _emit(self, x, plan, h, mm1, region, out_var, out_value):
        axis, n, k = plan
        order = sorted(region.values(), key=lambda v: self._order(v))
        outs = []
        parts = None
        if not isinstance(n, tvm.tirx.IntImm):  # symbolic: TVM's split in k sections
            parts = self.builder_.emit(relax.op.split(x, k, axis))
        for i in range(k):
            if parts is None:
                begin, end = int(n) * i // k, int(n) * (i + 1) // k
                xi = self.builder_.emit(relax.op.strided_slice(x, [axis], [begin], [end]))
            else:
                xi = self.builder_.emit(relax.TupleGetItem(parts, i))
            local = {}
            for v in order:
                val = self._bound(v)
                if v.name == h.name:
                    hv = relax.op.matmul(xi, mm1.args[1])
                    if _is_op(val, ("relax.add",)):
                        hv = relax.op.add(self.builder_.emit(hv), val.args[1])
                    local[v.name] = self.builder_.emit(hv)
                    continue
                args = [local.get(a.name, a) if isinstance(a, relax.Var) else a
                        for a in val.args]
                local[v.name] = self.builder_.emit(relax.Call(val.op, args, val.attrs,
                                                              val.ty_args))
            outs.append(self.builder_.emit(self._tail(out_value, local)))
        cat = self.builder_.emit(relax.op.concat(outs, axis))
        want = out_var.ty.shape.values
        if not all(tvm.sym.Analyzer().can_prove_equal(a, b)
                   for a, b in zip(cat.ty.shape.values, want)):
            cat = self.builder_.match_cast(cat, out_var.ty)
        return cat

    def _tail(self, value, local):
        mm2, b2 = self._second_matmul(value)
        y = relax.op.matmul(local[mm2.args[0].name], mm2.args[1])
        return y if b2 is None else relax.op.add(self.builder_.emit(y), b2)

    def _order(self, var):
        return self.positions[var.name]


def _ndim(expr) -> int:
    ty = expr.ty
    return ty.ndim if isinstance(ty, relax.TensorType) else -1


def _row_free(expr) -> bool:
    """A scalar or 1-d operand (broadcast along the last axis only): the same for every row."""
    return 0 <= _ndim(expr) <= 1


def _sections_never_empty(k: int, lo: int, hi: Optional[int], widest: int = 1 << 16) -> int:
    """Largest ``j <= k`` for which TVM's ``split`` of every length in ``[lo, hi]`` into ``j``
    sections (``ceil(n / j)`` rows each, the last the rest) leaves none empty; 1 when there is
    none, or when ``hi`` is unknown or more than ``widest`` past ``lo`` (not checked)."""
    if hi is None or hi - lo > widest:
        return 1
    for j in range(k, 1, -1):
        if all((j - 1) * -(-n // j) < n for n in range(lo, hi + 1)):
            return j
    return 1


def _size_expr(ty):
    size = tvm.tirx.IntImm("int64", (tvm.DataType(ty.dtype).bits + 7) // 8)
    for d in ty.shape.values:
        size = size * d
    return size
