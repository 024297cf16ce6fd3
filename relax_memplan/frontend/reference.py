"""The reference run a compiled model is checked against: random inputs for an ONNX model's
graph inputs (:func:`make_random_inputs`) and onnxruntime's outputs on them
(:func:`run_onnxruntime`, CPUExecutionProvider). ``relax_memplan.frontend`` re-exports both.
"""

from __future__ import annotations

import re
from typing import TYPE_CHECKING

import numpy as np
import onnx

from ..errors import ReferenceRunError, ShapeSpecError, summarize_error
from .input_shapes import graph_inputs

if TYPE_CHECKING:
    from .importer import ImportInfo

__all__ = ["SAMPLE_RATE_DEFAULT_HZ", "cast_value", "make_random_inputs", "run_onnxruntime"]

SAMPLE_RATE_DEFAULT_HZ = 16000
"""Default value :func:`make_random_inputs` gives an integer scalar input named like a
sample rate (``sr``, ``sample_rate``, ``sampling_rate``)."""

_SAMPLE_RATE_NAME = re.compile(r"^(sr|sample_?rate|sampling_?rate)$", re.IGNORECASE)


def make_random_inputs(
    model, info: ImportInfo, seed: int = 0, values: dict[str, np.ndarray] | None = None
) -> dict[str, np.ndarray]:
    """Draw one array per graph input, with the shapes and dtypes in ``info``.

    Float inputs are standard normal; bool inputs are uniform in {False, True}; integer
    inputs are uniform in {0, 1} (valid token ids, masks and indices for most models),
    except an integer scalar named like a sample rate (``sr``, ``sample_rate``,
    ``sampling_rate``), which gets :data:`SAMPLE_RATE_DEFAULT_HZ`.  Models whose inputs
    need other values (e.g. silero-vad's ``sr`` selects the 16 kHz branch only when it is
    16000, else the 8 kHz one) take them from ``values``.

    Parameters
    ----------
    model : onnx.ModelProto or str or os.PathLike
        The model ``info`` came from; gives the input order.
    info : ImportInfo
        From :func:`import_onnx`.
    seed : int
        Seed of ``numpy.random.default_rng``.
    values : dict of str to numpy.ndarray, optional
        Arrays used as given (cast to the input's dtype) instead of random ones; a 0-d
        array (one number) fills an input of any shape.

    Returns
    -------
    dict of str to numpy.ndarray
        Input name to array, in graph input order.

    Raises
    ------
    ShapeSpecError
        When ``values`` names an unknown input or has a shape other than
        ``info.input_shapes``.
    """
    from .importer import _as_model  # frontend imports this module

    model = _as_model(model)
    values = dict(values or {})
    names = [value.name for value in graph_inputs(model)]
    unknown = sorted(set(values) - set(names))
    if unknown:
        raise ShapeSpecError(f"values given for unknown input(s) {unknown}; inputs: {names}")
    rng = np.random.default_rng(seed)
    arrays = {}
    for name in names:
        shape, dtype = info.input_shapes[name], np.dtype(info.input_dtypes[name])
        if name in values:
            array = cast_value(name, values[name], dtype)
            if array.ndim == 0 and shape != ():
                array = np.full(shape, array)  # one number fills the input (--input mask=1)
            if array.shape != shape:
                raise ShapeSpecError(
                    f"value for input '{name}' has shape {array.shape}, expected {shape}"
                )
        elif dtype.kind == "f":
            # drawn in float32 (no float64 copy twice the size)
            array = rng.standard_normal(shape, dtype=np.float32).astype(dtype, copy=False)
        elif dtype.kind == "b":
            array = rng.integers(0, 2, size=shape).astype(dtype)
        elif dtype.kind in "iu" and shape == () and _SAMPLE_RATE_NAME.match(name):
            array = np.asarray(SAMPLE_RATE_DEFAULT_HZ, dtype=dtype)
        elif dtype.kind in "iu":
            array = rng.integers(0, 2, size=shape).astype(dtype)
        else:
            raise ShapeSpecError(f"cannot draw random values for input '{name}' of dtype {dtype}")
        arrays[name] = array
    return arrays


def cast_value(name: str, value, dtype) -> np.ndarray:
    """A value given for input ``name`` cast to the input's ``dtype``, refused when the cast
    fails or changes it (``1.5`` for an int64 input, ``1e300`` for a float32 one). A float
    value for a float input of lower precision is rounded (float64 data for a float32 input
    is accepted); only a finite value overflowing to infinity is refused.

    Raises
    ------
    ShapeSpecError
        Naming the input and the dtype.
    """
    given, dtype = np.asarray(value), np.dtype(dtype)
    try:
        with np.errstate(over="ignore", invalid="ignore"):  # refused below, in one line
            array = given.astype(dtype)
    except (OverflowError, ValueError, TypeError) as err:
        raise ShapeSpecError(f"value for input '{name}' does not fit {dtype}: {err}") from None
    if given.dtype.kind == "f" and dtype.kind == "f":
        # float to float: rounding to the input's precision is what the model computes with
        # (a float64 .npy of random data for a float32 input); refused only
        # when a finite value overflows to infinity
        if np.any(np.isfinite(given) & ~np.isfinite(array)):
            raise ShapeSpecError(f"value for input '{name}' changes when cast to {dtype}: "
                                 f"finite values overflow to infinity")
    elif given.dtype.kind in "fiub" and not np.array_equal(
            array.astype(given.dtype), given, equal_nan=given.dtype.kind == "f"):
        raise ShapeSpecError(f"value for input '{name}' changes when cast to {dtype}")
    return array


def run_onnxruntime(model, inputs: dict[str, np.ndarray]) -> list[np.ndarray]:
    """Run the model with onnxruntime's CPUExecutionProvider (the numerical reference).

    Pass the original model, not the opset-upgraded one: onnxruntime runs old opsets.

    Parameters
    ----------
    model : onnx.ModelProto or str or os.PathLike
        The model.
    inputs : dict of str to numpy.ndarray
        One array per graph input, e.g. from :func:`make_random_inputs`.

    Returns
    -------
    list of numpy.ndarray
        The graph outputs in graph order.

    Raises
    ------
    ImportError
        When onnxruntime is not installed.
    ReferenceRunError
        When onnxruntime cannot load the model or refuses the inputs (e.g. a token id
        beyond the vocabulary); onnxruntime's message on one line.
    """
    try:
        import onnxruntime  # pylint: disable=import-outside-toplevel
    except ImportError as err:
        raise ImportError(
            "onnxruntime is needed for reference runs: pip install 'relax_memplan[test]'"
        ) from err
    options = onnxruntime.SessionOptions()
    # fatal only: its errors reach us as exceptions (one line below), its log would repeat
    # them with colour codes, and its warnings (unused initializers) are noise here
    options.log_severity_level = 4
    source = model.SerializeToString() if isinstance(model, onnx.ModelProto) else str(model)
    try:
        session = onnxruntime.InferenceSession(
            source, sess_options=options, providers=["CPUExecutionProvider"]
        )
    except Exception as err:  # onnxruntime's own error types; one clear line
        raise ReferenceRunError(
            f"onnxruntime (the reference) cannot load the model: {_ort_message(err)}"
        ) from None
    try:
        run_options = onnxruntime.RunOptions()
        run_options.log_severity_level = 4
        return [np.asarray(out) for out in session.run(None, dict(inputs), run_options)]
    except Exception as err:  # e.g. INVALID_ARGUMENT: an index beyond the data
        at = ", ".join(f"{n}{tuple(np.shape(v))}" for n, v in inputs.items())
        raise ReferenceRunError(
            f"onnxruntime (the reference) refused the inputs ({at}): {_ort_message(err)}"
        ) from None


def _ort_message(err: BaseException) -> str:
    """onnxruntime's message without its ``[ONNXRuntimeError] : 2 : INVALID_ARGUMENT :`` prefix,
    its lines joined ("Got invalid dimensions for input: x for the following indices" is
    followed by the indices and sizes on the next lines)."""
    joined = RuntimeError("; ".join(line.strip() for line in str(err).splitlines() if line.strip()))
    return re.sub(r"^\[ONNXRuntimeError\]\s*:\s*\d+\s*:\s*", "",
                  summarize_error(joined, max_chars=400))
