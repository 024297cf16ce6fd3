"""Compare a build's outputs with reference outputs (onnxruntime), NaN and Inf included.

One comparison for every path (``relax-memplan compile --verify``, with or without
``--dim``): :func:`compare_outputs` returns a :class:`Comparison` whose ``ok`` is the
verdict.  Non-finite values are compared position by position: a NaN, +Inf or -Inf in
our output where the reference does not hold the same non-finite value (or the
reference holds one that we do not) is a mismatch, counted.  Finite positions are
compared with a tolerance of each output's own: ``rtol * max|finite reference output| + atol``,
so an output of large values (a state, a cast to int32) never widens the tolerance of another
(a probability).

:func:`input_sensitivity` measures how much the reference moves between two inputs:
when it moves by no more than the tolerance, a passing comparison says little.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Dict, Sequence, Tuple

import numpy as np

from ..errors import VerificationError

__all__ = ["Comparison", "OutputComparison", "compare_outputs", "input_sensitivity", "WEAK_VERIFICATION"]

WEAK_VERIFICATION = "the output barely depends on the input: verification is weak"
"""The warning given when the reference moves by no more than the tolerance between inputs."""


@dataclass(frozen=True)
class OutputComparison:
    """One output against its reference.

    Attributes
    ----------
    max_abs_error : float
        Largest absolute difference over the positions finite on both sides (0.0 if none).
    tolerance : float
        ``rtol * max|finite reference of this output| + atol``.
    nonfinite_mismatches : int
        Elements where one side is NaN/Inf and the other does not hold the same value.
    nonfinite_matched : int
        Elements where both sides hold the same non-finite value.
    num_elements : int
    nonfinite_only_ours, nonfinite_only_reference : int
        Of ``nonfinite_mismatches``: elements non-finite in ours where the reference is finite,
        and the other way round (the rest: both non-finite, different values).
    """

    max_abs_error: float
    tolerance: float
    nonfinite_mismatches: int = 0
    nonfinite_matched: int = 0
    num_elements: int = 0
    nonfinite_only_ours: int = 0
    nonfinite_only_reference: int = 0

    @property
    def ok(self) -> bool:
        """No non-finite mismatch and the finite error within this output's tolerance."""
        return self.nonfinite_mismatches == 0 and self.max_abs_error <= self.tolerance

    @property
    def excess(self) -> float:
        """Error over tolerance (inf when the tolerance is 0 and the error is not)."""
        if self.max_abs_error <= self.tolerance:
            return self.max_abs_error / self.tolerance if self.tolerance else 0.0
        return self.max_abs_error / self.tolerance if self.tolerance else math.inf


@dataclass(frozen=True)
class Comparison:
    """Outputs of a build against reference outputs, each output with its own tolerance.

    Attributes
    ----------
    max_abs_error : float
        The error of the worst output (largest error / tolerance): with ``tolerance``, the
        pair that decides the verdict, so ``max_abs_error <= tolerance`` holds exactly when
        every output is within its own tolerance.
    tolerance : float
        That output's tolerance, ``rtol * max|its finite reference| + atol``.
    nonfinite_mismatches : int
        Elements, over all outputs, where one side is NaN/Inf and the other does not hold
        the same value.
    nonfinite_matched : int
        Elements, over all outputs, where both sides hold the same non-finite value (NaN and
        NaN, +Inf and +Inf, ...): agreement, but the inputs drove the model to non-finite values.
    num_elements : int
        Elements compared, over all outputs.
    worst_output : int
        Index of the output that gives ``max_abs_error`` and ``tolerance``.
    outputs : tuple of OutputComparison
        Per output, in order.
    nonfinite_only_ours, nonfinite_only_reference : int
        Of ``nonfinite_mismatches``, over all outputs: NaN/Inf in ours where the reference is
        finite, and in the reference where ours is finite (the rest: both non-finite, different
        values, e.g. NaN against Inf), so that a NaN mismatch says which side produced the NaN.
    """

    max_abs_error: float
    tolerance: float
    nonfinite_mismatches: int = 0
    nonfinite_matched: int = 0
    num_elements: int = 0
    worst_output: int = 0
    outputs: Tuple[OutputComparison, ...] = ()
    nonfinite_only_ours: int = 0
    nonfinite_only_reference: int = 0

    @property
    def ok(self) -> bool:
        """No non-finite mismatch and every output within its own tolerance."""
        if self.outputs:
            return all(o.ok for o in self.outputs)
        return self.nonfinite_mismatches == 0 and self.max_abs_error <= self.tolerance

    @property
    def error(self) -> float:
        """``max_abs_error``, or ``inf`` when a non-finite value does not match."""
        return math.inf if self.nonfinite_mismatches else self.max_abs_error

    def describe(self) -> str:
        """One phrase: the error, the tolerance, the non-finite counts, OK or FAILED."""
        text = f"max abs error {self.max_abs_error:.3g} (tolerance {self.tolerance:.3g}"
        text += f", output {self.worst_output})" if len(self.outputs) > 1 else ")"
        if self.nonfinite_mismatches:
            text += f", {self.nonfinite_mismatches} element(s) NaN/Inf on one side only"
            sides = [f"{n} in {who} where {other} is finite" for n, who, other in (
                (self.nonfinite_only_ours, "ours", "onnxruntime"),
                (self.nonfinite_only_reference, "onnxruntime", "ours")) if n]
            rest = (self.nonfinite_mismatches - self.nonfinite_only_ours
                    - self.nonfinite_only_reference)
            if rest > 0:
                sides.append(f"{rest} non-finite on both sides with different values")
            text += f" ({'; '.join(sides)})" if sides else ""
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
    per_output = [_compare_one(a, e, rtol, atol) for a, e in _as_pairs(actual, expected)]
    if not per_output:
        return Comparison(max_abs_error=0.0, tolerance=atol)
    worst = max(range(len(per_output)),
                key=lambda i: (per_output[i].excess, per_output[i].max_abs_error))
    return Comparison(
        max_abs_error=per_output[worst].max_abs_error, tolerance=per_output[worst].tolerance,
        nonfinite_mismatches=sum(o.nonfinite_mismatches for o in per_output),
        nonfinite_matched=sum(o.nonfinite_matched for o in per_output),
        num_elements=sum(o.num_elements for o in per_output),
        worst_output=worst, outputs=tuple(per_output),
        nonfinite_only_ours=sum(o.nonfinite_only_ours for o in per_output),
        nonfinite_only_reference=sum(o.nonfinite_only_reference for o in per_output))


def _compare_one(a: np.ndarray, e: np.ndarray, rtol: float, atol: float) -> OutputComparison:
    if not a.size:
        return OutputComparison(0.0, atol)
    a_finite, e_finite = np.isfinite(a), np.isfinite(e)
    both = a_finite & e_finite
    same_nonfinite = (~a_finite & ~e_finite) & ((np.isnan(a) & np.isnan(e)) | (a == e))
    err = float(np.max(np.abs(a[both] - e[both]))) if both.any() else 0.0
    ref_max = float(np.max(np.abs(e[e_finite]))) if e_finite.any() else 0.0
    return OutputComparison(
        max_abs_error=err, tolerance=rtol * ref_max + atol,
        nonfinite_mismatches=int(np.count_nonzero(~both & ~same_nonfinite)),
        nonfinite_matched=int(np.count_nonzero(same_nonfinite)), num_elements=int(a.size),
        nonfinite_only_ours=int(np.count_nonzero(~a_finite & e_finite)),
        nonfinite_only_reference=int(np.count_nonzero(a_finite & ~e_finite)))


def input_sensitivity(reference: Sequence[np.ndarray], other: Sequence[np.ndarray],
                      rtol: float = 1e-4, atol: float = 1e-5) -> Dict[str, object]:
    """How much the reference outputs move between two different inputs.

    Parameters
    ----------
    reference : sequence of numpy.ndarray
        Reference outputs on the verified inputs.
    other : sequence of numpy.ndarray
        Reference outputs on other inputs (e.g. another random seed).
    rtol, atol : float
        The verification tolerance, as given to :func:`compare_outputs` (each output its own:
        ``rtol * max|finite reference output| + atol``).

    Returns
    -------
    dict
        ``max_abs_change`` (float: the largest change over positions finite in both, over
        all outputs, or None when the output shapes differ), ``nonfinite_changes`` (int:
        elements that turn NaN/Inf or back) and ``weak`` (bool: every output moved by no
        more than its tolerance, so a comparison within tolerance says little).
    """
    try:
        moved = compare_outputs(other, reference, rtol=0.0, atol=0.0)
        within = compare_outputs(other, reference, rtol=rtol, atol=atol)
    except VerificationError:  # other shapes: the output does depend on the input
        return {"max_abs_change": None, "nonfinite_changes": 0, "weak": False}
    return {"max_abs_change": moved.max_abs_error, "nonfinite_changes": moved.nonfinite_mismatches,
            "weak": within.ok}
