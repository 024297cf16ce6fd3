"""VectorPlaneSum: mean / sum over trailing (H, W) axes with a W-wide vector accumulator."""

import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
import tvm
from tvm import relax, tirx

from relax_memplan.pipeline import get_pipeline
from relax_memplan.schedules import RowReduction, VectorPlaneSum, cpu_schedule_rules, host_target

REPO_ROOT = Path(__file__).resolve().parents[2]


def _module(shape, op="mean", axes=(2, 3), keepdims=True):
    x = relax.Var("x", relax.TensorType(list(shape), "float32"))
    bb = relax.BlockBuilder()
    with bb.function("main", [x]):
        with bb.dataflow():
            fn = relax.op.mean if op == "mean" else relax.op.sum
            out = bb.emit_output(bb.emit(fn(x, axis=list(axes), keepdims=keepdims)))
        bb.emit_func_output(out)
    return bb.get()


def _kernel(*args, **kwargs):
    mod = relax.transform.LegalizeOps()(_module(*args, **kwargs))
    (func,) = [f for _, f in mod.functions_items() if isinstance(f, tirx.PrimFunc)]
    return func


def _apply(rule, func):
    with host_target() as target:
        return rule.apply(func, target, False)


@pytest.mark.parametrize("shape,kwargs,applies", [
    ((1, 192, 10, 10), {}, True),                        # ppocrv4-det's SE means
    ((1, 24, 80, 80), {}, True),
    ((1, 7, 3, 5), {"op": "sum", "keepdims": False}, True),  # odd sizes, no epilogue
    ((1, 8, 10, 3), {}, False),                          # W = 3 < 4 lanes
    ((1, 8, 4, 200), {}, False),                         # W = 200 > max_vector_elements
    ((8, 128), {"axes": (1,)}, False),                   # one reduction axis: not a plane
    ((1, 8, 16, 16), {"axes": (1, 2)}, False),           # W is not the innermost input axis
    ((tirx.Var("n", "int64"), 8, 10, 10), {}, False),    # symbolic: left to the next rule
])
def test_vector_plane_sum_applies_only_to_trailing_planes(shape, kwargs, applies):
    assert (_apply(VectorPlaneSum(), _kernel(shape, **kwargs)) is not None) == applies


def test_vector_plane_sum_width_limit_is_the_parameter():
    func = _kernel((1, 8, 4, 200))
    assert _apply(VectorPlaneSum(max_vector_elements=200), func) is not None
    assert _apply(VectorPlaneSum(max_vector_elements=199), func) is None


def test_vector_plane_sum_is_the_rule_the_pipeline_picks_for_a_mean():
    func = _kernel((1, 96, 20, 20))
    from relax_memplan.schedules import _apply_first
    with host_target() as target:
        out = _apply_first(cpu_schedule_rules(), func, target)
    assert str(out.attrs["relax_memplan.schedule_rule"]) == "VectorPlaneSum"
    assert "T.vectorized" in out.script() and 'scope="local"' in out.script()


NUMERIC_CASES = [((1, 24, 10, 10), {}), ((2, 7, 3, 5), {}),
                 ((1, 5, 9, 13), {"op": "sum", "keepdims": False}), ((1, 3, 80, 80), {}),
                 ((3, 2, 1, 4), {"op": "sum"})]


def check_numerics():
    """Each case built with ``schedule=True`` (its reduction taken by VectorPlaneSum) against a
    float64 numpy reference; run in a subprocess so that an out-of-bounds store fails the test
    instead of killing pytest."""
    for shape, kwargs in NUMERIC_CASES:
        _check_case(shape, kwargs)


def _check_case(shape, kwargs, perturb: float = 0.0):
    func = _kernel(shape, **kwargs)
    assert _apply(VectorPlaneSum(), func) is not None, shape
    x = np.random.default_rng(1).standard_normal(shape, dtype="float32")
    target = host_target()
    ex = tvm.compile(_module(shape, **kwargs), target,
                     relax_pipeline=get_pipeline(target, schedule=True))
    got = relax.VirtualMachine(ex, tvm.cpu())["main"](tvm.runtime.tensor(x)).numpy()
    fn = np.mean if kwargs.get("op", "mean") == "mean" else np.sum
    ref = fn(x.astype("float64"), axis=(2, 3), keepdims=kwargs.get("keepdims", True)) + perturb
    np.testing.assert_allclose(got, ref, rtol=1e-5, atol=1e-5, err_msg=str(shape))


def test_numeric_check_fails_on_a_wrong_value():
    """The tolerance of :func:`check_numerics` rejects a mean off by 1e-3."""
    with pytest.raises(AssertionError):
        _check_case((1, 24, 10, 10), {}, perturb=1e-3)


def test_vector_plane_sum_matches_numpy_odd_sizes_subprocess():
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join([str(REPO_ROOT), env.get("PYTHONPATH", "")])
    src = "from tests.schedules import test_cpu_plane_sum as t; t.check_numerics()"
    proc = subprocess.run([sys.executable, "-c", src], env=env, cwd=REPO_ROOT,
                          capture_output=True, text=True, timeout=300, check=False)
    assert proc.returncode == 0, (proc.stdout + proc.stderr)[-3000:]
