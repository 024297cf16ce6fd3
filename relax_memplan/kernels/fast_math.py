"""Vectorisable float32 ``exp``, ``sigmoid`` and ``tanh`` written as TIR expressions.

Why: LLVM lowers TVM's ``T.exp`` to ``llvm.exp``, which becomes one libm ``expf`` call per
element, also inside a vectorised loop (the vector intrinsic is split into scalar calls: x86
has no vector ``exp`` instruction and TVM sets no vector math library). TVM lowers
``T.sigmoid(x)`` to ``1 / (1 + exp(-x))`` and ``T.tanh`` to two such ``exp`` calls, so
yolov8n's SiLU epilogues and magika's tanh-GELU ran at libm speed inside otherwise vectorised
kernels. The expressions here use only multiply-add, ``floor``, a float-to-int cast, an integer
shift and a bit ``reinterpret``, which LLVM vectorises with the surrounding loop.

Algorithm: Cody-Waite range reduction, the textbook scheme of Cephes ``expf`` and
J.-M. Muller, "Elementary Functions: Algorithms and Implementation" (ch. 11):
``exp(x) = 2^n * exp(r)`` with ``n = round(x / ln 2)`` and ``r = x - n ln 2`` in
``[-ln 2 / 2, ln 2 / 2]`` (``ln 2`` split in a high part exact in float32 and a low part),
``exp(r)`` by its Taylor polynomial to degree 7 (truncation error below 5e-9 relative),
``2^n`` built in the exponent bits. The input is clamped to ``[-87, 88]`` (``2^n`` stays a
normal float), so ``exp`` itself is *not* offered for general use (it would return 1.7e38
instead of ``inf``); ``sigmoid`` and ``tanh`` are bounded and exact at the clamp to float32
precision. ``tanh(x) = sign(x) (1 - e) / (1 + e)`` with ``e = exp(-2 |x|)``, and its odd
Taylor polynomial to degree 9 for ``|x| < 0.25`` where ``1 - e`` would cancel. NaN in gives
NaN out (the clamp would turn it into a number: selected back explicitly).

Measured accuracy over 2e6 points in [-100, 100] and near 0, against float64 numpy:
see ``tests/kernels/test_fast_math.py`` (bounds asserted there).
"""

from __future__ import annotations

from tvm import tirx

__all__ = ["exp_clamped_f32", "sigmoid_f32", "tanh_f32"]

_LOG2E = 1.4426950408889634
_LN2_HI = 0.693145751953125  # 12 significant bits: n * _LN2_HI is exact for |n| < 2^11
_LN2_LO = 1.4286068203094173e-06  # ln 2 - _LN2_HI
_CLAMP_LO, _CLAMP_HI = -87.0, 88.0
_TANH_SMALL = 0.25
# tanh(x) = x - x^3/3 + 2x^5/15 - 17x^7/315 + 62x^9/2835 - ...
_TANH_TAYLOR = (1.0, -1.0 / 3.0, 2.0 / 15.0, -17.0 / 315.0, 62.0 / 2835.0)
_EXP_TAYLOR = (1.0, 1.0, 1 / 2, 1 / 6, 1 / 24, 1 / 120, 1 / 720, 1 / 5040)


def _f(value: float) -> tirx.PrimExpr:
    return tirx.const(value, "float32")


def _let(name: str, value: tirx.PrimExpr, body) -> tirx.PrimExpr:
    """``let name = value in body(name)``: each value is computed once, however often the
    formula uses it. Without it, fused into a kernel whose argument is itself a large
    expression (magika's tanh-GELU), the argument was copied ~60 times and the build took
    17x longer."""
    var = tirx.Var(name, "float32")  # every value bound here is float32
    return tirx.Let(var, value, body(var))


def _horner(x: tirx.PrimExpr, coefficients) -> tirx.PrimExpr:
    """``c0 + c1 x + c2 x^2 + ...`` for ``coefficients = (c0, c1, ...)``."""
    acc = _f(coefficients[-1])
    for c in reversed(coefficients[:-1]):
        acc = acc * x + _f(c)
    return acc


def _keep_nan(x: tirx.PrimExpr, value: tirx.PrimExpr) -> tirx.PrimExpr:
    return tirx.Select(tirx.isnan(x), x, value)


def exp_clamped_f32(x: tirx.PrimExpr) -> tirx.PrimExpr:
    """``exp(clamp(x, -87, 88))`` for a float32 ``x``, vectorisable (see the module docstring).

    Parameters
    ----------
    x : tvm.tirx.PrimExpr
        float32 scalar expression.

    Returns
    -------
    tvm.tirx.PrimExpr
        float32; relative error about 1 ulp inside the clamp range. Outside it the result is
        ``exp(-87)`` / ``exp(88)``, not 0 / ``inf``: use only where that cannot show
        (:func:`sigmoid_f32`, :func:`tanh_f32`). NaN is not preserved here.
    """
    def _with_n(xc, n):
        r = xc - n * _f(_LN2_HI) - n * _f(_LN2_LO)
        bits = tirx.shift_left(tirx.Cast("int32", n) + tirx.const(127, "int32"),
                               tirx.const(23, "int32"))
        return _let("r", r, lambda rv: _horner(rv, _EXP_TAYLOR)) * tirx.reinterpret("float32",
                                                                                   bits)

    clamped = tirx.max(tirx.min(x, _f(_CLAMP_HI)), _f(_CLAMP_LO))
    return _let("xc", clamped, lambda xc: _let(
        "n", tirx.floor(xc * _f(_LOG2E) + _f(0.5)), lambda n: _with_n(xc, n)))


def sigmoid_f32(x: tirx.PrimExpr) -> tirx.PrimExpr:
    """``1 / (1 + exp(-x))`` for a float32 ``x``, vectorisable; NaN stays NaN.

    Returns
    -------
    tvm.tirx.PrimExpr
        float32 in ``[0, 1]``; absolute error a few 1e-8 (asserted in the tests).
    """
    return _let("x", x, lambda v: _keep_nan(v, _f(1.0) / (_f(1.0) + exp_clamped_f32(-v))))


def tanh_f32(x: tirx.PrimExpr) -> tirx.PrimExpr:
    """``tanh(x)`` for a float32 ``x``, vectorisable; NaN stays NaN.

    Returns
    -------
    tvm.tirx.PrimExpr
        float32 in ``[-1, 1]``; relative error a few 1e-7 (asserted in the tests).
    """
    def _body(v):
        def _large(e):
            mag = (_f(1.0) - e) / (_f(1.0) + e)
            return tirx.Select(v < _f(0.0), -mag, mag)

        large = _let("e", exp_clamped_f32(_f(-2.0) * tirx.abs(v)), _large)
        small = v * _let("x2", v * v, lambda x2: _horner(x2, _TANH_TAYLOR))
        return _keep_nan(v, tirx.Select(tirx.abs(v) < _f(_TANH_SMALL), small, large))

    return _let("x", x, _body)
