"""Compare a build's outputs with reference outputs (onnxruntime), NaN and Inf included.

One comparison for every path (``relax-memplan compile --verify``, with or without
``--dim``): :func:`compare_outputs` returns a :class:`Comparison` whose ``ok`` is the
verdict.  Non-finite values are compared position by position: a NaN, +Inf or -Inf in
our output where the reference does not hold the same non-finite value (or the
reference holds one that we do not) is a mismatch, counted.  Finite positions are
compared with the tolerance ``rtol * max|finite reference| + atol``.

:func:`input_sensitivity` measures how much the reference moves between two inputs:
when it moves by no more than the tolerance, a passing comparison says little.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Dict, Sequence

import numpy as np

from .errors import VerificationError

__all__ = ["Comparison", "compare_outputs", "input_sensitivity", "WEAK_VERIFICATION"]

WEAK_VERIFICATION = "the output barely depends on the input: verification is weak"
"""The warning given when the reference moves by no more than the tolerance between inputs."""


@dataclass(frozen=True)
class Comparison:
    """Outputs of a build against reference outputs.

    Attributes
    ----------
    max_abs_error : float
        Largest absolute difference over the positions where both sides are finite
        (0.0 when there is none).
    tolerance : float
        ``rtol * max|finite reference| + atol``.
    nonfinite_mismatches : int
        Elements where one side is NaN/Inf and the other does not hold the same value.
    nonfinite_matched : int
        Elements where both sides hold the same non-finite value (NaN and NaN, +Inf
        and +Inf, ...): agreement, but the inputs drove the model to non-finite values.
    num_elements : int
        Elements compared, over all outputs.
    """

    max_abs_error: float
    tolerance: float
    nonfinite_mismatches: int = 0
    nonfinite_matched: int = 0
    num_elements: int = 0

    @property
    def ok(self) -> bool:
        """No non-finite mismatch and the finite error within the tolerance."""
        return self.nonfinite_mismatches == 0 and self.max_abs_error <= self.tolerance

    @property
    def error(self) -> float:
        """``max_abs_error``, or ``inf`` when a non-finite value does not match."""
        return math.inf if self.nonfinite_mismatches else self.max_abs_error

    def describe(self) -> str:
        """One phrase: the error, the tolerance, the non-finite counts, OK or FAILED."""
        text = f"max abs error {self.max_abs_error:.3g} (tolerance {self.tolerance:.3g})"
        if self.nonfinite_mismatches:
            text += (f", {self.nonfinite_mismatches} element(s) NaN/Inf on one side only")
        if self.nonfinite_matched:
            text += (f", {self.nonfinite_matched} element(s) NaN/Inf on both sides (the inputs "
                     f"produced non-finite values)")
        return text + (" OK" if self.ok else " FAILED")


def _as_pairs(actual: Sequence[np.ndarray], expected: Sequence[np.ndarray]):
    if len(actual) != len(expected):
        raise VerificationError(f"got {len(actual)} outputs, the reference has {len(expected)}")
    pairs = []
    for i, (a, e) in enumerate(zip(actual, expected)):
        a, e = np.asarray(a), np.asarray(e)
        if a.shape != e.shape:
            raise VerificationError(f"output {i} has shape {a.shape}, the reference has {e.shape}")
        pairs.append((a.astype(np.float64), e.astype(np.float64)))
    return pairs


def compare_outputs(actual: Sequence[np.ndarray], expected: Sequence[np.ndarray],
                    rtol: float = 1e-4, atol: float = 1e-5) -> Comparison:
    """Compare outputs element by element, non-finite values explicitly.

    Parameters
    ----------
    actual : sequence of numpy.ndarray
        Our build's outputs.
    expected : sequence of numpy.ndarray
        The reference outputs, same count and shapes.
    rtol, atol : float
        Tolerance ``rtol * max|finite reference| + atol`` (in the outputs' units) on
        the largest absolute difference over positions finite on both sides.

    Returns
    -------
    Comparison

    Raises
    ------
    VerificationError
        If the number of outputs or a shape differs.
    """
    pairs = _as_pairs(actual, expected)
    err, ref_max, mismatches, matched, count = 0.0, 0.0, 0, 0, 0
    for a, e in pairs:
        count += a.size
        if not a.size:
            continue
        a_finite, e_finite = np.isfinite(a), np.isfinite(e)
        both = a_finite & e_finite
        same_nonfinite = (~a_finite & ~e_finite) & ((np.isnan(a) & np.isnan(e)) | (a == e))
        matched += int(np.count_nonzero(same_nonfinite))
        mismatches += int(np.count_nonzero(~both & ~same_nonfinite))
        if both.any():
            err = max(err, float(np.max(np.abs(a[both] - e[both]))))
        if e_finite.any():
            ref_max = max(ref_max, float(np.max(np.abs(e[e_finite]))))
    return Comparison(max_abs_error=err, tolerance=rtol * ref_max + atol,
                      nonfinite_mismatches=mismatches, nonfinite_matched=matched,
                      num_elements=count)


def input_sensitivity(reference: Sequence[np.ndarray], other: Sequence[np.ndarray],
                      tolerance: float) -> Dict[str, object]:
    """How much the reference outputs move between two different inputs.

    Parameters
    ----------
    reference : sequence of numpy.ndarray
        Reference outputs on the verified inputs.
    other : sequence of numpy.ndarray
        Reference outputs on other inputs (e.g. another random seed).
    tolerance : float
        The verification tolerance (absolute, in the outputs' units).

    Returns
    -------
    dict
        ``max_abs_change`` (float: the largest change over positions finite in both,
        or None when the output shapes differ), ``nonfinite_changes`` (int: elements
        that turn NaN/Inf or back) and ``weak`` (bool: the outputs moved by no more than
        ``tolerance``, so a comparison within ``tolerance`` says little).
    """
    try:
        moved = compare_outputs(other, reference, rtol=0.0, atol=0.0)
    except VerificationError:  # other shapes: the output does depend on the input
        return {"max_abs_change": None, "nonfinite_changes": 0, "weak": False}
    return {"max_abs_change": moved.max_abs_error, "nonfinite_changes": moved.nonfinite_mismatches,
            "weak": moved.nonfinite_mismatches == 0 and moved.max_abs_error <= tolerance}
