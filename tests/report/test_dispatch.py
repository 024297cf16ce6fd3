"""report_dispatch: the specialized versions no sampled shape ran are named in plain words."""

import copy

import pytest

from relax_memplan.compile import BuildOptions, CheckOptions, compile_model
from relax_memplan.report.dispatch import dispatch_lines
from tests.conftest import mlp_model


@pytest.fixture(scope="module")
def report():
    """The MLP with n in [1, 128], kernels specialized at n=8 and n=64, verified at n=1 and
    n=128 only (the range ends): neither specialized version runs."""
    return compile_model(mlp_model(), dim_ranges={"n": (1, 128)},
                         options=BuildOptions(dispatch={"n": (8, 64)}, strategies=("exact",)),
                         check=CheckOptions(verify=True, sample_shapes=2)).report


def test_versions_no_sample_ran_are_said_not_verified(report):
    """Review: with --dispatch, a version no sampled shape hits was not verified and the
    report did not say so."""
    assert dispatch_lines(report)[-1] == (
        "  specialized n=8, n=64: not verified, no sampled shape falls on them (sampled: n=1; "
        "n=128); --sample-shapes 128 runs every shape in range")


def test_a_version_a_sample_ran_is_not_named(report):
    ran = copy.deepcopy(report)
    ran.shapes[0].kernel_paths = ["n=8"]  # as if n=8 had been sampled
    assert dispatch_lines(ran)[-1].startswith("  specialized n=64: not verified, no sampled "
                                               "shape falls on it")
    ran.shapes[1].kernel_paths = ["n=64"]
    assert not any("not verified" in line for line in dispatch_lines(ran))


def test_unbounded_or_large_ranges_do_not_suggest_running_every_shape(report):
    large = copy.deepcopy(report)
    large.dims = {"n": (1, 100000)}
    assert dispatch_lines(large)[-1].endswith(
        "no option picks the shapes to run; a --dim range ending at a value runs it (the ends "
        "always run)")
