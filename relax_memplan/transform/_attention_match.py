"""Attention found by its structure, for :class:`~relax_memplan.transform.fuse_attention.FuseAttention`.

A candidate is a ``softmax`` whose result reaches the first operand of a ``matmul`` (through
casts and the ``where(isnan(p), 0, p)`` guard exporters put after it). It is an attention block
when, walking from it:

* backward, the softmax's input is a chain of element-wise operations on the output of a
  ``matmul(A, B)`` (the scores), each step read by the next one only: ``add``/``subtract``/
  ``multiply``/``divide``/``maximum``/``minimum`` with a tensor or constant that broadcasts
  over the scores without widening them (masks, relative-position biases, scales),
  ``where(c, scores, x)`` either way round (boolean masks), ``astype``, ``tanh`` (a softcap
  ``tanh(s / c) * c``), and ``reshape`` that
  keeps the key axis last (Swin's windows and their mask);
* forward, ``P -> [astype] -> [where(isnan(P), 0, P)] -> matmul(P, V)``, each read once;
* ``A`` is ``(..., Sq, D)``, ``B`` is ``(..., D, Sk)``, ``V`` is ``(..., Sk, Dv)``, with
  static head dims ``D``, ``Dv`` and the leading (batch, head, window) dims of ``V`` not
  widening the scores'.

``A``, ``B`` and ``V`` are then traced back to where their data lives through view operators
(:mod:`~relax_memplan.transform._attention_views`; scalar scales on ``A`` and ``B`` folded into
the kernel's scale), the bias and mask operands too, and the output forward through the views
after it. The result is an :class:`AttentionMatch`, or a :class:`Refusal` saying why not.

``R.nn.attention`` and ``R.nn.attention_bias`` (what TVM's importer makes of the
``com.microsoft`` ``Attention`` node) are matched as the same form: ``(B, S, N, H)`` layouts,
an optional additive bias, their scale.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Dict, List, Optional, Tuple, Union

import tvm
from tvm import relax, tirx

from ._attention_steps import (Refusal, ScoreStep, fmt_shape as _fmt, score_steps, side_read,
                               unread)
from ._attention_views import IndexSpace, Traced, scalar_value, static_shape_values, trace_back, \
    trace_forward

__all__ = ["AttentionMatch", "Refusal", "ScoreStep", "find_attention", "FunctionGraph"]

_BINARY = ("relax.add", "relax.subtract", "relax.multiply", "relax.divide", "relax.maximum",
           "relax.minimum")
_FLOATS = ("float32", "float16")
_MAX_CHAIN = 24  # bindings walked between the scores matmul and the softmax
_SHAPES = "q, k or v of rank below 2, of unknown shape, or not broadcast over the scores"


@dataclass
class AttentionMatch:
    """One attention block: ``out = softmax(steps(scale * q . k)) . v`` (module docstring).

    ``space``: canonical indices ``lead0..`` (scores' leading dims), ``i``, ``j``, ``d``, ``e``;
    ``q``/``k``/``v``: reads over ``(lead, i, d)``, ``(lead, j, d)``, ``(lead, j, e)``;
    ``anchor``: the var whose binding the kernel's call replaces, written at ``out_index``
    over ``(lead, i, e)``; ``guard``: rows without a finite score give 0 (the isnan guard).
    """

    anchor: relax.Var
    space: IndexSpace
    lead: List[str]
    q: Traced
    k: Traced
    v: Traced
    scale: float
    steps: List[ScoreStep]
    guard: bool
    out_index: list
    out_dtype: str
    bindings: List[str]

    def extent(self, name):
        return self.space.extents[name]


class FunctionGraph:
    """Bindings and readers of one Relax function (the matcher reads the original graph)."""

    def __init__(self, func: relax.Function):
        self.value: Dict[relax.Var, relax.Expr] = {}
        self.users: Dict[relax.Var, List[relax.Var]] = {}
        self.order: List[relax.Var] = []
        self.returned = set()
        #: anchors of the blocks already fused: read as they are, never traced through (the
        #: bindings before them are replaced by the kernel)
        self.barrier = set()
        for block in func.body.blocks:
            for binding in block.bindings:
                if not isinstance(binding, relax.VarBinding):
                    continue
                self.value[binding.var] = binding.value
                self.order.append(binding.var)
                for used in _vars_in(binding.value):
                    self.users.setdefault(used, []).append(binding.var)
        self.returned = set(_vars_in(func.body.body))

    def lookup(self, var):
        return self.value.get(var)

    def readers(self, var) -> int:
        return len(self.users.get(var, [])) + (1 if var in self.returned else 0)

    def sole_user(self, var) -> Optional[relax.Var]:
        users = self.users.get(var, [])
        return users[0] if len(users) == 1 and var not in self.returned else None


def _vars_in(expr) -> List[relax.Var]:
    found = []

    def visit(e):
        if isinstance(e, relax.Var):
            found.append(e)
    relax.analysis.post_order_visit(expr, visit)
    return found


def _op(value) -> str:
    if isinstance(value, relax.Call) and isinstance(value.op, tvm.ir.Op):
        return value.op.name
    return ""


def _dtype(expr) -> str:
    ty = getattr(expr, "ty", None)
    return ty.dtype if isinstance(ty, relax.TensorType) else ""


def _name(var) -> str:
    return var.name if isinstance(var, relax.Var) else str(type(var).__name__)


def find_attention(graph: FunctionGraph, softmax: relax.Var
                   ) -> Union[AttentionMatch, Refusal, None]:
    """The attention block around ``softmax`` (a var bound to ``R.nn.softmax``), a refusal,
    or ``None`` when the softmax reaches no matmul (not a candidate)."""
    post = _post_chain(graph, softmax)
    if post is None:
        return None
    if isinstance(post, Refusal):
        return post
    pv, guard, post_vars = post
    call = graph.value[softmax]
    scores = call.args[0]
    shape = static_shape_values(scores)
    if shape is None or len(shape) < 2:
        return Refusal("scores of unknown shape", [softmax.name])
    if int(call.attrs.axis) not in (-1, len(shape) - 1):
        return Refusal(f"softmax over axis {int(call.attrs.axis)}, not the last (keys)",
                       [softmax.name])
    chain = _score_chain(graph, scores, 0)
    if isinstance(chain, Refusal):
        chain.bindings += [softmax.name] + [v.name for v in post_vars]
        return chain
    qk, steps_raw = chain
    names = ([qk.name] + [v.name for _, v in steps_raw] + [softmax.name]
             + [v.name for v in post_vars] + [pv.name])
    return _assemble(graph, qk, steps_raw, guard, pv, names)


def _post_chain(graph, softmax):
    """(the PV matmul var, guard, vars between) or a refusal; None: not a candidate."""
    if not _reaches_matmul(graph, softmax, 4):
        return None
    cur, guard, walked = softmax, False, []
    for _ in range(4):
        users = graph.users.get(cur, [])
        if cur in graph.returned:
            return Refusal("probabilities are also a function output", [softmax.name])
        guarded = _isnan_guard(graph, cur, users)
        if guarded is not None:
            walked += guarded
            cur, guard = guarded[-1], True
            continue
        if len(users) != 1:
            return Refusal(f"probabilities have another reader ({_name(users[-1])})",
                           [softmax.name] + [u.name for u in users])
        user = users[0]
        value = graph.value[user]
        if _op(value) == "relax.matmul" and value.args[0].same_as(cur):
            return user, guard, walked
        if _op(value) == "relax.astype" and value.attrs.dtype in _FLOATS:
            walked.append(user)
            cur = user
            continue
        return Refusal(f"{_op(value) or 'binding'} between the softmax and the matmul",
                       [softmax.name, user.name])
    return Refusal("more than 3 bindings between the softmax and the matmul", [softmax.name])


def _isnan_guard(graph, p, users):
    """[isnan var, where var] when ``users`` are ``n = isnan(p)``, ``where(n, 0, p)``."""
    if len(users) != 2:
        return None
    a, b = users
    for n, w in ((a, b), (b, a)):
        nv, wv = graph.value.get(n), graph.value.get(w)
        if (_op(nv) == "relax.isnan" and _op(wv) == "relax.where" and graph.sole_user(n) == w
                and wv.args[0].same_as(n) and wv.args[2].same_as(p)
                and scalar_value(wv.args[1]) == 0.0):
            return [n, w]
    return None


def _reaches_matmul(graph, var, depth) -> bool:
    """Whether ``var`` is the first operand of a matmul within ``depth`` operator calls."""
    if depth < 0:
        return False
    for user in graph.users.get(var, []):
        value = graph.value[user]
        if _op(value) == "relax.matmul" and value.args[0].same_as(var):
            return True
        if _op(value) and _reaches_matmul(graph, user, depth - 1):
            return True
    return False


def _score_chain(graph, var, depth):
    """(the QK matmul var, [(raw step value, var)] from the matmul on) or a refusal."""
    if not isinstance(var, relax.Var) or var not in graph.value:
        return Refusal("scores are not computed in this function", [_name(var)])
    if depth > _MAX_CHAIN:
        return Refusal("more than 24 bindings between the scores and the softmax", [var.name])
    if graph.readers(var) != 1:
        others = [u.name for u in graph.users.get(var, [])]
        return Refusal(f"scores have another reader ({var.name})", [var.name] + others)
    value = graph.value[var]
    op = _op(value)
    if op == "relax.matmul":
        return var, []
    candidates = []
    if op in _BINARY:
        candidates = [0, 1]
    elif op == "relax.where":
        candidates = [1, 2]
    elif op in ("relax.astype", "relax.reshape", "relax.tanh"):
        candidates = [0]
    else:
        return Refusal(f"{op or type(value).__name__} between the scores and the softmax",
                       [var.name])
    args = [p for p in candidates if isinstance(value.args[p], relax.Var)]
    # the scores are the operand of the result's shape; another one of that shape (a full
    # bias) is tried too, a narrower one only when none has it (refused as widening them)
    same = [p for p in args if _same_shape(value.args[p], var)]
    first = None
    for pos in same or args:
        got = _score_chain(graph, value.args[pos], depth + 1)
        if not isinstance(got, Refusal):
            qk, steps = got
            return qk, steps + [((value, pos), var)]
        first = first or got
    return first or Refusal("scores are not a matmul", [var.name])


def _same_shape(a, b) -> bool:
    sa, sb = static_shape_values(a), static_shape_values(b)
    if sa is None or sb is None or len(sa) != len(sb):
        return False
    analyzer = tvm.sym.Analyzer()
    return all(analyzer.can_prove_equal(x, y) for x, y in zip(sa, sb))


def _lead_index(space, lead_vars, shape, tail):
    """Index of an operand of ``shape`` broadcast against the scores' leading dims, ``tail``
    appended for its last two dims; None when it does not broadcast."""
    lead_shape = shape[:-2]
    if len(lead_shape) > len(lead_vars):
        extra = lead_shape[:len(lead_shape) - len(lead_vars)]
        if not all(isinstance(d, tirx.IntImm) and int(d) == 1 for d in extra):
            return None
        lead_shape = lead_shape[len(extra):]
        pad = [tirx.IntImm("int64", 0)] * len(extra)
    else:
        pad = []
    offs = len(lead_vars) - len(lead_shape)
    out = list(pad)
    for k, d in enumerate(lead_shape):
        name = lead_vars[offs + k]
        if isinstance(d, tirx.IntImm) and int(d) == 1:
            out.append(tirx.IntImm("int64", 0))
        elif space.equal(d, space.extents[name]):
            out.append(space.vars[name])
        else:
            return None
    return out + tail


def _assemble(graph, qk, steps_raw, guard, pv, names):
    mm = graph.value[qk]
    a, b = mm.args
    pv_value = graph.value[pv]
    v = pv_value.args[1]
    sa, sb, sv = (static_shape_values(x) for x in (a, b, v))
    s_shape, o_shape = static_shape_values(qk), static_shape_values(pv)
    if any(x is None or len(x) < 2 for x in (sa, sb, sv, s_shape, o_shape)):
        return Refusal(_SHAPES, names)
    dims = {"i": s_shape[-2], "j": s_shape[-1], "d": sa[-1], "e": sv[-1]}
    for name in ("d", "e"):
        if not isinstance(dims[name], tirx.IntImm):
            return Refusal(f"head dim {dims[name]} is symbolic", names)
    lead = [f"lead{k}" for k in range(len(s_shape) - 2)]
    space = IndexSpace({**{n: s_shape[k] for k, n in enumerate(lead)}, **dims})
    if not space.equal(sb[-2], dims["d"]) or not space.equal(sv[-2], dims["j"]):
        return Refusal("key and value lengths or head dims differ", names)
    for x in (a, b, v):
        if _dtype(x) not in _FLOATS:
            return Refusal(f"{_dtype(x) or 'unknown'} operands (float32/float16 only)", names)
    vars_ = space.vars
    lead_vars = [vars_[n] for n in lead]
    steps = score_steps(graph, space, lead_vars, s_shape, steps_raw)
    if isinstance(steps, Refusal):
        steps.bindings = names
        return steps
    if len(o_shape) != len(s_shape) or not all(space.equal(x, y) for x, y in
                                               zip(o_shape[:-2], s_shape[:-2])):
        return Refusal(f"values {_fmt(sv)} widen the scores' batch dims {_fmt(s_shape[:-2])}",
                       names)
    qi = _lead_index(space, lead, sa, [vars_["i"], vars_["d"]])
    ki = _lead_index(space, lead, sb, [vars_["d"], vars_["j"]])
    vi = _lead_index(space, lead, sv, [vars_["j"], vars_["e"]])
    if qi is None or ki is None or vi is None:
        return Refusal(_SHAPES, names)
    reads = [_trace(graph, space, x, idx, scale=(x is not v)) for x, idx in
             ((a, qi), (b, ki), (v, vi))]
    reads = _within_bytes(graph, space, (a, b, v), (qi, ki, vi), reads)
    scale = reads[0].scale * reads[1].scale
    while steps and steps[0].op in ("multiply", "divide") and isinstance(steps[0].operand, float) \
            and not steps[0].swapped:
        first = steps.pop(0)
        scale = scale * first.operand if first.op == "multiply" else scale / first.operand
    if not math.isfinite(scale) or scale == 0.0:
        return Refusal(f"scale {scale} is not a finite non-zero number", names)
    out_index = lead_vars + [vars_["i"], vars_["e"]]
    anchor, out_index, walked = trace_forward(
        space, pv, out_index, lambda x: [(u, graph.value[u]) for u in graph.users.get(x, [])
                                         if x not in graph.returned])
    return AttentionMatch(anchor, space, lead, reads[0], reads[1], reads[2], scale, steps, guard,
                          out_index, _dtype(pv), names + [w.name for w in walked])


def _trace(graph, space, x, index, scale, stop=lambda var: False):
    return trace_back(space, x, index, graph.lookup, graph.readers, scale=scale,
                      stop=lambda var: var in graph.barrier or stop(var))


def _size_bytes(expr) -> Optional[int]:
    shape = static_shape_values(expr)
    if shape is None or not all(isinstance(d, tirx.IntImm) for d in shape):
        return None
    n = 1
    for d in shape:
        n *= int(d)
    return n * tvm.DataType(_dtype(expr)).bits // 8


def _within_bytes(graph, space, operands, indices, reads):
    """The reads, traced again stopping at slices and gathers when the tensors read would be
    larger than the operands they replace (a slice of a much larger tensor would keep it
    live until the attention kernel)."""
    sources = {id(r.source): r.source for r in reads}
    before = [_size_bytes(x) for x in operands]
    after = [_size_bytes(s) for s in sources.values()]
    if None in before or None in after or sum(after) <= sum(before):
        return reads
    slicing = ("relax.strided_slice", "relax.take", "relax.split")

    def stop(var):
        value = graph.value.get(var)
        return _op(value) in slicing or isinstance(value, relax.TupleGetItem)
    return [_trace(graph, space, x, idx, scale=k < 2, stop=stop)
            for k, (x, idx) in enumerate(zip(operands, indices))]


def find_nn_attention(graph: FunctionGraph, var: relax.Var) -> Union[AttentionMatch, Refusal]:
    """``R.nn.attention(q, k, v[, bias])`` bound to ``var`` as an :class:`AttentionMatch`."""
    call = graph.value[var]
    q, k, v = call.args[:3]
    bias = call.args[3] if len(call.args) > 3 else None
    names = [var.name]
    sq, sk, sv = (static_shape_values(x) for x in (q, k, v))
    if any(s is None or len(s) != 4 for s in (sq, sk, sv)):
        return Refusal(_SHAPES, names)
    attrs = call.attrs
    if getattr(attrs, "causal_mask", None) or getattr(attrs, "window_size", None):
        return Refusal("nn.attention with a causal mask or window", names)
    dims = {"lead0": sq[0], "lead1": sq[2], "i": sq[1], "j": sk[1], "d": sq[3], "e": sv[3]}
    for name in ("d", "e"):
        if not isinstance(dims[name], tirx.IntImm):
            return Refusal(f"head dim {dims[name]} is symbolic", names)
    space = IndexSpace(dims)
    b, n, i, j, d, e = (space.vars[x] for x in ("lead0", "lead1", "i", "j", "d", "e"))
    reads = [_trace(graph, space, x, idx, scale=False)
             for x, idx in ((q, [b, i, n, d]), (k, [b, j, n, d]), (v, [b, j, n, e]))]
    scale = attrs.scale
    scale = float(scale.value) if scale is not None else 1.0 / math.sqrt(int(dims["d"]))
    steps = []
    if bias is not None:
        s_shape = [dims["lead0"], dims["lead1"], dims["i"], dims["j"]]
        operand = side_read(graph, space, bias, [b, n, i, j], s_shape)
        if operand is None:
            return Refusal(unread("bias", bias, s_shape), names)
        steps.append(ScoreStep("add", operand))
    anchor, out_index, walked = trace_forward(
        space, var, [b, i, n, e], lambda x: [(u, graph.value[u]) for u in graph.users.get(x, [])
                                             if x not in graph.returned])
    return AttentionMatch(anchor, space, ["lead0", "lead1"], reads[0], reads[1], reads[2],
                          scale, steps, False, out_index, _dtype(var),
                          names + [w.name for w in walked])


def candidates(graph: FunctionGraph) -> List[Tuple[relax.Var, str]]:
    """(var, kind) of each softmax and ``nn.attention``/``nn.attention_bias`` binding, in
    program order."""
    out = []
    for var in graph.order:
        op = _op(graph.value[var])
        if op == "relax.nn.softmax":
            out.append((var, "softmax"))
        elif op in ("relax.nn.attention", "relax.nn.attention_bias"):
            out.append((var, "nn.attention"))
    return out
