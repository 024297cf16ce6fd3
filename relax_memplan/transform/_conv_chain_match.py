"""Finding conv -> epilogue -> strided conv chains for
:class:`~relax_memplan.transform.fuse_conv_chain.FuseConvChain` (on the Relax graph before
``LegalizeOps``).

An epilogue is a run of elementwise bindings on one NCHW tensor: ``add``/``multiply`` by a
constant per-channel (``(C, 1, 1)``, ``(1, C, 1, 1)``) or scalar tensor (bias, folded batch
norm), ``clip``, ``nn.relu``, ``sigmoid``, ``x * sigmoid(x)`` (SiLU) and the
``maximum``/``minimum`` kernels TVM's ONNX ``Clip`` importer emits (``R.call_tir`` of a PrimFunc
structurally equal to TOPI's ``maximum``/``minimum`` against a 0-d constant). Constants are read
through ``reshape``, and ``where(isnan(c), inf, c)`` (the Clip importer's bound), with numpy.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Dict, List, Optional, Tuple

import numpy as np
import tvm
import tvm_ffi
from tvm import relax, te, topi

from ._conv_chain_kernel import ConvSpec, EpilogueStep

__all__ = ["ChainSite", "ConvChainMatcher"]


@dataclass
class ChainSite:
    """One match: the producer conv call, its epilogue, the consumer conv, its epilogue; the
    vars of every binding the fused kernel replaces (``first`` .. ``last`` in program order)."""

    producer: relax.Call
    a: ConvSpec
    a_steps: List[EpilogueStep]
    a_arrays: List[np.ndarray]
    consumer: relax.Call
    b: ConvSpec
    b_steps: List[EpilogueStep]
    b_arrays: List[np.ndarray]
    last: relax.Var
    replaced: List[relax.Var] = field(default_factory=list)


def _op(expr, *names) -> bool:
    return (isinstance(expr, relax.Call) and isinstance(expr.op, tvm.ir.Op)
            and expr.op.name in names)


def _is_tensor_const(expr) -> bool:
    return isinstance(expr, tvm.ir.GenericConst) and isinstance(expr.value, tvm.runtime.Tensor)


def _float(expr) -> Optional[float]:
    """A constant scalar bound (``FloatImm``/``IntImm``, possibly in a ``PrimValue``)."""
    value = getattr(expr, "value", expr)
    value = getattr(value, "value", value)
    return float(value) if isinstance(value, (int, float)) else None


def _static_shape(expr) -> Optional[Tuple[int, ...]]:
    ty = expr.ty
    if not isinstance(ty, relax.TensorType) or ty.shape is None:
        return None
    values = ty.shape.values
    if not all(isinstance(v, tvm.tirx.IntImm) for v in values):
        return None
    return tuple(int(v) for v in values)


def conv_spec(call: relax.Call) -> Optional[ConvSpec]:
    """The :class:`ConvSpec` of a ``relax.nn.conv2d`` call in the supported form (NCHW/OIHW,
    dilation 1, float32, static shapes, constant weight), else ``None``."""
    if not _op(call, "relax.nn.conv2d"):
        return None
    attrs = call.attrs
    if (attrs.data_layout != "NCHW" or attrs.kernel_layout != "OIHW"
            or attrs.out_layout != "NCHW" or any(int(d) != 1 for d in attrs.dilation)
            or (attrs.out_dtype and attrs.out_dtype not in ("", "float32"))):
        return None
    data, weight = call.args
    shape, wshape, out = _static_shape(data), _static_shape(weight), _static_shape(call)
    if (shape is None or wshape is None or out is None or len(shape) != 4
            or data.ty.dtype != "float32" or weight.ty.dtype != "float32"
            or not _is_tensor_const(weight)):
        return None
    pad = [int(p) for p in attrs.padding]
    pad = pad * 2 if len(pad) == 2 else pad
    spec = ConvSpec(shape[1], wshape[0], (shape[2], shape[3]), (wshape[2], wshape[3]),
                    tuple(int(s) for s in attrs.strides), tuple(pad), int(attrs.groups))
    if (spec.out_hw != out[2:] or spec.in_channels % spec.groups
            or spec.out_channels % spec.groups or wshape[1] != spec.in_channels // spec.groups):
        return None
    return spec


def _topi_kernel(name, shape):
    """TOPI's ``name`` (maximum/minimum) of a float32 tensor of ``shape`` (int64 dims, as
    LegalizeOps and the ONNX importer make them) and a 0-d tensor, without a global symbol."""
    a = te.placeholder(tuple(tvm.tirx.IntImm("int64", d) for d in shape), "float32", name="a")
    b = te.placeholder((), "float32", name="b")
    func = te.create_prim_func([a, b, getattr(topi, name)(a, b)])
    return func.without_attr("global_symbol")


class ConvChainMatcher:
    """Finds :class:`ChainSite` s in one Relax function (bindings of all its blocks)."""

    def __init__(self, mod: tvm.IRModule, func: relax.Function):
        self.mod = mod
        self.bound: Dict[relax.Var, relax.Expr] = {}
        self.uses: Dict[relax.Var, List[relax.Var]] = {}
        for block in func.body.blocks:
            for binding in block.bindings:
                if isinstance(binding, relax.VarBinding):
                    self.bound[binding.var] = binding.value
                for used in relax.analysis.free_vars(binding.value):
                    self.uses.setdefault(used, []).append(binding.var)
        for used in relax.analysis.free_vars(func.body.body):
            self.uses.setdefault(used, []).append(None)
        self._kernels: Dict[tuple, str] = {}

    # ---- constants -------------------------------------------------------------------------
    def const(self, expr) -> Optional[np.ndarray]:
        """``expr`` as a numpy array when it is a constant (through reshape, and the Clip
        importer's ``where(isnan(c), inf, c)``), else ``None``."""
        if isinstance(expr, relax.Var) and expr in self.bound:
            expr = self.bound[expr]
        if _is_tensor_const(expr):
            return expr.value.numpy()
        if _op(expr, "relax.reshape"):
            inner = self.const(expr.args[0])
            shape = _static_shape(expr)
            return None if inner is None or shape is None else inner.reshape(shape)
        if _op(expr, "relax.isnan"):
            inner = self.const(expr.args[0])
            return None if inner is None else np.isnan(inner)
        if _op(expr, "relax.where"):
            parts = [self.const(a) for a in expr.args]
            return None if any(p is None for p in parts) else np.where(*parts)
        return None

    def _channel_const(self, expr, channels: int):
        """("scalar", value) or ("channel", (C,) array) for a constant broadcasting over the
        channel axis of an NCHW tensor only, else None."""
        value = self.const(expr)
        if value is None or value.dtype != np.float32:
            return None
        if value.size == 1 and value.ndim <= 4:
            return "scalar", float(value.reshape(()))
        shape = value.shape
        if shape in ((channels, 1, 1), (1, channels, 1, 1)):
            return "channel", value.reshape(channels).astype("float32")
        return None

    # ---- elementwise steps -----------------------------------------------------------------
    def _clip_kernel(self, call, shape) -> Optional[str]:
        """``max``/``min`` when ``call`` is R.call_tir of TOPI's maximum/minimum."""
        if not _op(call, "relax.call_tir") or not isinstance(call.args[0], tvm.ir.GlobalVar):
            return None
        func = self.mod[call.args[0]]
        for name, kind in (("maximum", "max"), ("minimum", "min")):
            key = (name, shape)
            if key not in self._kernels:
                self._kernels[key] = _topi_kernel(name, shape)
            if tvm_ffi.structural_equal(func.without_attr("global_symbol"), self._kernels[key],
                                       map_free_vars=True):
                return kind
        return None

    def step_of(self, value, channels: int, shape):
        """(input var, steps, arrays, extra vars read only by this step) for one epilogue
        binding value, else None."""
        if _op(value, "relax.nn.relu"):
            return value.args[0], [EpilogueStep("relu")], [], []
        if _op(value, "relax.sigmoid"):
            return value.args[0], [EpilogueStep("sigmoid")], [], []
        if _op(value, "relax.clip"):
            bounds = [_float(a) for a in value.args[1:3]]
            if None in bounds:
                return None
            return value.args[0], [EpilogueStep("max", bounds[0]),
                                   EpilogueStep("min", bounds[1])], [], []
        if _op(value, "relax.add", "relax.multiply"):
            kind = "add" if value.op.name == "relax.add" else "mul"
            x, y = value.args
            if kind == "mul" and self._is_silu(x, y):
                return x, [EpilogueStep("silu")], [], [y]
            if kind == "mul" and self._is_silu(y, x):
                return y, [EpilogueStep("silu")], [], [x]
            for t, c in ((x, y), (y, x)):
                got = self._channel_const(c, channels)
                if got is not None and _static_shape(t) == shape:
                    if got[0] == "scalar":
                        return t, [EpilogueStep(kind + "_scalar", got[1])], [], []
                    return t, [EpilogueStep(kind)], [got[1]], []
            return None
        kind = self._clip_kernel(value, shape) if _op(value, "relax.call_tir") else None
        if kind is not None:
            args = value.args[1].fields
            bound = self.const(args[1])
            if bound is not None and bound.shape == () and bound.dtype == np.float32:
                return args[0], [EpilogueStep(kind, float(bound))], [], []
        return None

    def _is_silu(self, x, s) -> bool:
        value = self.bound.get(s) if isinstance(s, relax.Var) else None
        return (_op(value, "relax.sigmoid") and value.args[0].same_as(x)
                and len(self.uses.get(s, [])) == 1)

    # ---- chains ----------------------------------------------------------------------------
    def backward(self, var):
        """From the consumer's input ``var`` back to a producer conv: (producer call, its spec,
        steps, arrays, replaced vars) or a refusal reason (str)."""
        steps, arrays, replaced = [], [], []
        shape = _static_shape(var) if isinstance(var, relax.Var) else None
        while isinstance(var, relax.Var) and var in self.bound:
            value = self.bound[var]
            replaced.append(var)
            spec = conv_spec(value)
            if spec is not None:
                return value, spec, steps[::-1], arrays[::-1], replaced
            if shape is None or len(shape) != 4:
                return "form"
            got = self.step_of(value, shape[1], shape)
            if got is None:
                return "epilogue"
            var, new_steps, new_arrays, extra = got
            steps += new_steps[::-1]
            arrays += new_arrays[::-1]
            replaced += extra
        return "no_producer"

    def forward(self, var, channels: int, shape):
        """The consumer's epilogue from its output ``var``: (steps, arrays, last var, replaced
        vars after ``var``), following single readers."""
        steps, arrays, replaced = [], [], []
        while True:
            users = [u for u in self.uses.get(var, []) if u is not None]
            if len(users) != len(self.uses.get(var, [])) or not users:
                break
            last = users[-1]
            got = self.step_of(self.bound.get(last), channels, shape)
            if got is None or not got[0].same_as(var) or len(set(users)) > 2:
                break
            if len(users) == 2 and not (got[1][0].kind == "silu" and users[0] in got[3]):
                break
            if len(users) == 1 and got[3]:
                break
            steps += got[1]
            arrays += got[2]
            replaced += got[3] + [last]
            var = last
        return steps, arrays, var, replaced

    def private_uses(self, replaced, readers) -> bool:
        """True when every use of every var in ``replaced`` is in ``readers`` (bindings)."""
        inside = set(readers)
        return all(u is not None and u in inside
                   for v in replaced for u in self.uses.get(v, []))
