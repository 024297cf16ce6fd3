"""relax_memplan.runtime.verify: one comparison for every path, NaN and Inf compared by position."""

import numpy as np
import pytest

from relax_memplan.compile import max_abs_error
from relax_memplan.errors import VerificationError
from relax_memplan.runtime.verify import compare_outputs, input_sensitivity

NAN, INF = float("nan"), float("inf")


def _cmp(ours, ref, rtol=1e-4, atol=1e-5):
    return compare_outputs([np.array(ours, "float32")], [np.array(ref, "float32")], rtol, atol)


def test_nan_in_ours_where_reference_is_finite_fails():
    """Regression: max(err, nan) dropped the NaN and [5, nan] vs [1, 1] reported 0."""
    c = _cmp([5.0, NAN], [1.0, 1.0])
    assert not c.ok
    assert c.nonfinite_mismatches == 1
    assert c.max_abs_error == 4.0
    assert max_abs_error([np.array([5.0, NAN])], [np.array([1.0, 1.0])]) == INF


def test_single_nan_against_finite_fails():
    c = _cmp([NAN], [1.0])
    assert not c.ok and c.nonfinite_mismatches == 1 and c.max_abs_error == 0.0
    assert "1 element(s) NaN/Inf on one side only" in c.describe() and c.describe().endswith("FAILED")


@pytest.mark.parametrize("ours, ref", [([1.0, INF], [1.0, -INF]), ([1.0, INF], [1.0, NAN]),
                                       ([1.0, 2.0], [1.0, INF])])
def test_a_different_nonfinite_value_or_a_missing_one_fails(ours, ref):
    assert _cmp(ours, ref).nonfinite_mismatches == 1


def test_matching_nan_and_inf_positions_pass_with_a_note():
    c = _cmp([NAN, INF, -INF, 2.0], [NAN, INF, -INF, 2.0])
    assert c.ok and c.nonfinite_matched == 3 and c.nonfinite_mismatches == 0
    text = c.describe()
    assert "nan" not in text.split("(tolerance")[1].split(")")[0]  # a finite tolerance
    assert "the inputs produced non-finite values" in text and text.endswith("OK")
    # the tolerance comes from the finite reference values only
    assert c.tolerance == pytest.approx(1e-4 * 2.0 + 1e-5)


def test_shift_above_tolerance_fails_and_within_passes():
    ref = np.linspace(-1.0, 1.0, 16).astype("float32")
    tolerance = 1e-4 * 1.0 + 1e-5
    assert not _cmp(ref + 2 * tolerance, ref).ok
    assert _cmp(ref + 0.5 * tolerance, ref).ok


def test_output_count_and_shape_must_match():
    with pytest.raises(VerificationError, match="got 1 outputs, the reference has 2"):
        compare_outputs([np.zeros(2)], [np.zeros(2), np.zeros(2)])
    with pytest.raises(VerificationError, match=r"output 0 has shape \(2,\), the reference has \(3,\)"):
        compare_outputs([np.zeros(2)], [np.zeros(3)])


def test_empty_outputs_compare_equal():
    c = compare_outputs([np.zeros((0, 8), "float32")], [np.zeros((0, 8), "float32")])
    assert c.ok and c.max_abs_error == 0.0 and c.num_elements == 0


def test_input_sensitivity_flags_an_output_that_does_not_move():
    ref = [np.array([1.0, 2.0])]
    assert input_sensitivity(ref, [np.array([1.0, 2.0 + 1e-7])], rtol=0.0, atol=1e-4)["weak"] is True
    moved = input_sensitivity(ref, [np.array([1.5, 2.0])], rtol=0.0, atol=1e-4)
    assert moved == {"max_abs_change": 0.5, "nonfinite_changes": 0, "weak": False}
    assert input_sensitivity(ref, [np.array([1.0, NAN])], rtol=0.0, atol=1e-4)["weak"] is False
    assert input_sensitivity(ref, [np.array([1.0])], rtol=0.0, atol=1e-4)["weak"] is False


def test_each_output_has_its_own_tolerance():
    # a large output (a state, x * 1e6) must not widen the tolerance of a small one
    small_ours, small_ref = np.array([0.5, 0.6]), np.array([0.5, 0.9])
    large = np.array([3e9, -2e9])
    c = compare_outputs([small_ours, large], [small_ref, large])
    assert not c.ok and c.worst_output == 0
    assert c.max_abs_error == pytest.approx(0.3) and c.tolerance == pytest.approx(1e-4 * 0.9 + 1e-5)
    assert [o.ok for o in c.outputs] == [False, True]
    assert "output 0" in c.describe() and c.describe().endswith("FAILED")


def test_int32_cast_mismatch_fails_next_to_a_large_output():
    # a two_cast model: y = Cast(x, int32) differs, z = x * 1e6 agrees
    y_ours = np.array([-1, -1294967296, 1294967296, 2, -2, 0, 0, 1], dtype=np.int32)
    y_ref = np.array([-1, -2147483648, -2147483648, 2, -2, -2147483648, 0, 1], dtype=np.int32)
    z = np.array([3e11, -3e11, 1.0], dtype=np.float32)
    c = compare_outputs([y_ours, z], [y_ref, z])
    assert not c.ok and c.worst_output == 0


def test_within_tolerance_on_every_output_passes():
    c = compare_outputs([np.array([1.0 + 1e-6]), np.array([1e6 + 1.0])],
                        [np.array([1.0]), np.array([1e6])])
    assert c.ok and len(c.outputs) == 2


def test_a_nonfinite_mismatch_says_which_side_produced_it():
    """Regression: "1 element(s) NaN/Inf on one side only" did not say whether our build or
    onnxruntime produced the NaN."""
    ours = _cmp([NAN, INF, 1.0, 1.0], [1.0, 1.0, NAN, 1.0])
    assert (ours.nonfinite_only_ours, ours.nonfinite_only_reference) == (2, 1)
    assert ("3 element(s) NaN/Inf on one side only (2 in ours where onnxruntime is finite; "
            "1 in onnxruntime where ours is finite)") in ours.describe()
    both = _cmp([INF, 1.0], [NAN, 1.0])  # NaN against Inf: neither side finite
    assert (both.nonfinite_only_ours, both.nonfinite_only_reference) == (0, 0)
    assert "(1 non-finite on both sides with different values)" in both.describe()
    # kept by a report row and printed from it
    from relax_memplan.report import ShapeMeasurement
    from relax_memplan.report.text import _check_lines

    row = ShapeMeasurement({"n": 2}, None, 0, 0)
    row.record_comparison(_cmp([1.0, NAN], [1.0, 1.0]))
    assert row.to_dict()["nonfinite_only_ours"] == 1
    assert "(1 in ours where onnxruntime is finite)" in _check_lines([row])[0]
