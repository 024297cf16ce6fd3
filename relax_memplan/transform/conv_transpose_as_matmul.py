"""ConvTransposeAsMatmul: a transposed convolution whose kernel equals its stride is a matmul.

Why: TVM legalizes ``relax.nn.conv2d_transpose`` by dilating the input with ``s - 1`` zeros
between pixels, padding it and running a direct convolution over the result, so with stride
``s`` only one product in ``s * s`` is not a multiplication by zero, and the kernel makes two
extra passes (dilate, pad) over an ``s * s`` times larger tensor. ppocrv4-det's upsampling
head (two 2x2 stride-2 transposed convolutions, 24 channels, to 160x160 and 320x320) spent
about a fifth of the model's time there. When the kernel equals the stride (``kh = sh``,
``kw = sw``; no padding, dilation 1, one group), each output pixel receives exactly one input
pixel::

    y[n, o, h * sh + i, w * sw + j] = sum_c x[n, c, h, w] * wt[c, o, i, j]

that is one matmul ``(O * sh * sw, C) @ (C, H * W)`` followed by a reshape and a transpose
(the depth-to-space step of sub-pixel convolution: Shi et al., "Real-time single image and
video super-resolution using an efficient sub-pixel convolutional neural network", CVPR
2016). The transposed weight is a constant expression ``FoldConstant`` evaluates when
compiling; the bias and activation after it fuse into the transpose (``FuseOps``).

Where it runs: on the high-level Relax graph, before ``LegalizeOps`` (our ``legalize``
phase, llvm targets with ``schedule=True``). Matches ``R.nn.conv2d_transpose`` in ``NCHW`` /
``IOHW`` / ``NCHW`` layouts with constant shapes, float32, ``groups = 1``, ``dilation = 1``,
zero padding and output padding, kernel = stride; every other transposed convolution is
left to TVM. Reads no function attributes.
"""

from __future__ import annotations

import tvm
from tvm import relax
from tvm.relax.expr_functor import PyExprMutator, mutator

from ._module_util import CountingRewritePass

__all__ = ["ConvTransposeAsMatmul"]

_CONV_TRANSPOSE = "relax.nn.conv2d_transpose"


@tvm.transform.module_pass(opt_level=0, name="ConvTransposeAsMatmul")
class ConvTransposeAsMatmul(CountingRewritePass):
    """Rewrite kernel-equals-stride ``conv2d_transpose`` as matmul + depth-to-space (see the
    module docstring). Raises nothing; other calls are left unchanged.

    Attributes
    ----------
    rewritten : int
        Calls rewritten by the last run.
    """

    count_attr = "rewritten"
    make_rewriter = staticmethod(lambda mod: _Rewriter(mod))  # the mutator, defined below


def _static_shape(expr):
    ty = expr.ty
    if not isinstance(ty, relax.TensorType) or ty.shape is None or str(ty.dtype) != "float32":
        return None
    dims = [getattr(d, "value", None) for d in ty.shape.values]
    return None if any(d is None for d in dims) else dims


def _ints(values) -> list:
    return [int(v) for v in values]


def _matches(call) -> bool:
    attrs = call.attrs
    if (str(attrs.data_layout), str(attrs.kernel_layout), str(attrs.out_layout)) != \
            ("NCHW", "IOHW", "NCHW"):
        return False
    if int(attrs.groups) != 1 or any(_ints(attrs.padding)) or any(_ints(attrs.output_padding)):
        return False
    if _ints(attrs.dilation) != [1, 1]:
        return False
    if attrs.out_dtype is not None and str(attrs.out_dtype) not in ("", "float32"):
        return False
    data, weight = (_static_shape(a) for a in call.args)
    return data is not None and weight is not None and len(data) == 4 and len(weight) == 4 \
        and weight[2:] == _ints(attrs.strides) and weight[0] == data[1]


@mutator
class _Rewriter(PyExprMutator):
    def __init__(self, mod):
        super().__init__(mod)
        self.rewritten = 0

    def visit_call_(self, op):
        call = super().visit_call_(op)
        if not (isinstance(call.op, tvm.ir.Op) and call.op.name == _CONV_TRANSPOSE
                and _matches(call)):
            return call
        x, w = call.args
        n, c, h, wd = _static_shape(x)
        _c, o, sh, sw = _static_shape(w)
        emit = self.builder_.emit
        op_ = relax.op
        # (C, O, sh, sw) -> (O, sh, sw, C) -> (O * sh * sw, C): a constant for model weights
        wt = emit(op_.reshape(op_.permute_dims(w, [1, 2, 3, 0]), [o * sh * sw, c]))
        cols = emit(op_.reshape(x, [n, c, h * wd]))
        y = emit(op_.matmul(wt, cols))  # (N, O * sh * sw, H * W)
        y = emit(op_.reshape(y, [n, o, sh, sw, h, wd]))
        y = emit(op_.permute_dims(y, [0, 1, 4, 2, 5, 3]))  # (N, O, H, sh, W, sw)
        self.rewritten += 1
        return op_.reshape(y, [n, o, h * sh, wd * sw])
