"""RowReduction: dlight's CPU Reduction kept for multi-row softmax / layer norm, rejected where
its parallel loop would run over the columns of a single row (a quadratic kernel).
VectorRowReduction: layer norm / RMS norm with vectorized partial sums."""

import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
import tvm
from tvm import relax, tirx

from relax_memplan.pipeline import get_pipeline
from relax_memplan.schedules import RowReduction, VectorRowReduction, host_target

REPO_ROOT = Path(__file__).resolve().parents[2]


def _module(shape, kind):
    x = relax.Var("x", relax.TensorType(list(shape), "float32"))
    bb = relax.BlockBuilder()
    with bb.function("main", [x]):
        with bb.dataflow():
            if kind == "softmax":
                y = relax.op.nn.softmax(x, axis=-1)
            else:
                width = int(shape[-1])
                y = relax.op.nn.layer_norm(x, relax.const(np.ones(width, "float32")),
                                           relax.const(np.zeros(width, "float32")), axes=[-1])
            out = bb.emit_output(bb.emit(y))
        bb.emit_func_output(out)
    return bb.get()


def _kernel(shape, kind):
    mod = relax.transform.LegalizeOps()(_module(shape, kind))
    (func,) = [f for _, f in mod.functions_items() if isinstance(f, tirx.PrimFunc)]
    return func


@pytest.mark.parametrize("kind", ["softmax", "layer_norm"])
@pytest.mark.parametrize("shape,applies", [((1, 1000), False), ((1, 1, 128), False),
                                           ((8, 128), True), ((2, 4, 16, 16), True),
                                           ((tirx.Var("n", "int64"), 128), True)])
def test_row_reduction_only_parallel_over_rows(kind, shape, applies):
    rule = RowReduction(min_reduction_work=0)  # the row check alone, at any size
    with host_target() as target:
        assert (rule.apply(_kernel(shape, kind), target, False) is not None) == applies


@pytest.mark.parametrize("shape,applies", [
    ((4420, 2), False),     # ultraface's softmax: 8,840 iterations, 85 us with dlight, 5.5 declined
    ((8, 128), False),      # 1,024
    ((511, 256), False),    # 130,816: just below 1 << 17
    ((512, 256), True),     # 131,072: the threshold itself
    ((1000, 169), True),    # squeezenet's mean size: within noise, kept
    ((tirx.Var("n", "int64"), 2), True),  # symbolic: work unknown, kept
])
def test_row_reduction_declines_below_min_reduction_work(shape, applies):
    with host_target() as target:
        got = RowReduction().apply(_kernel(shape, "softmax"), target, False)
    assert (got is not None) == applies


def test_row_reduction_threshold_is_the_parameter():
    """The decline comes from ``min_reduction_work``, not from the shape alone: lowered, the same
    small softmax is taken; raised, a large one is declined."""
    with host_target() as target:
        assert RowReduction(min_reduction_work=8840).apply(
            _kernel((4420, 2), "softmax"), target, False) is not None
        assert RowReduction(min_reduction_work=8841).apply(
            _kernel((4420, 2), "softmax"), target, False) is None


@pytest.mark.parametrize("shape", [(1, 1000), (4420, 2), (37, 5)])  # declined: the next rules
def test_softmax_matches_unscheduled_build(shape):
    mod = _module(shape, "softmax")
    x = np.random.default_rng(0).standard_normal(shape, dtype="float32") * 30
    outs = []
    for schedule in (False, True):
        target = host_target()
        ex = tvm.compile(mod, target, relax_pipeline=get_pipeline(target, schedule=schedule))
        outs.append(relax.VirtualMachine(ex, tvm.cpu())["main"](tvm.runtime.tensor(x)).numpy())
    np.testing.assert_allclose(outs[1], outs[0], rtol=1e-5, atol=1e-7)
    ref = np.exp(x - x.max(axis=-1, keepdims=True))
    np.testing.assert_allclose(outs[1], ref / ref.sum(axis=-1, keepdims=True), rtol=1e-4,
                               atol=1e-6)


# --- VectorRowReduction: layer norm / RMS norm with vectorized partial sums --------------------


def _schedule(rule, func):
    with host_target() as target:
        sch = rule.apply(func, target, False)
    return None if sch is None else sch.mod["main"]


@pytest.mark.parametrize("shape", [(8, 128), (2, 4, 16, 16), (tirx.Var("n", "int64"), 128)])
def test_vector_row_reduction_takes_layer_norm_with_vector_partial_sums(shape):
    text = _schedule(VectorRowReduction(), _kernel(shape, "layer_norm")).script()
    assert "x_sum_rf" in text and "x_var_sum_rf" in text  # both sums split into lanes
    assert 'scope="local"' in text                       # row statistics on the stack


@pytest.mark.parametrize("shape", [(8, 128), (1, 1000)])
def test_vector_row_reduction_leaves_softmax_to_the_next_rule(shape):
    """A max reduction (softmax) is not taken: measured slower than dlight's rule there."""
    assert VectorRowReduction().apply(_kernel(shape, "softmax"), host_target(), False) is None


def test_vector_row_reduction_parallel_only_above_threshold():
    small = _schedule(VectorRowReduction(), _kernel((64, 64), "layer_norm")).script()
    large = _schedule(VectorRowReduction(), _kernel((512, 768), "layer_norm")).script()
    symbolic = _schedule(VectorRowReduction(), _kernel((tirx.Var("n", "int64"), 64),
                                                       "layer_norm")).script()
    assert "T.parallel" not in small
    assert "T.parallel" in large and "T.parallel" in symbolic


def test_cpu_rules_give_layer_norm_to_vector_row_reduction():
    from relax_memplan.schedules import schedule_prim_func

    text = schedule_prim_func(_kernel((8, 128), "layer_norm"), host_target()).script()
    assert "x_sum_rf" in text


def test_layer_norm_and_rms_norm_match_numpy_odd_and_symbolic_sizes_subprocess():
    """Odd widths (4 lanes, no lanes), parallel and serial rows, symbolic rows incl. 1; a
    subprocess, so that an out-of-bounds store fails the test instead of pytest."""
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join([str(REPO_ROOT), env.get("PYTHONPATH", "")])
    src = "from tests.schedules import row_norm_checks as c; c.check_norms()"
    proc = subprocess.run([sys.executable, "-c", src], env=env, cwd=REPO_ROOT,
                          capture_output=True, text=True, timeout=300, check=False)
    tail = (proc.stdout + proc.stderr)[-3000:]
    assert proc.returncode == 0, tail
    assert "NORMS OK" in proc.stdout, tail


def test_norm_reference_catches_a_wrong_variance():
    """The numpy reference of the subprocess check fails a kernel off by a biased variance."""
    from tests.schedules.row_norm_checks import reference

    rng = np.random.default_rng(1)
    x = rng.standard_normal((4, 100)).astype("float32")
    g, b = np.ones(100, "float32"), np.zeros(100, "float32")
    x64 = x.astype("float64")
    wrong = (x64 - x64.mean(-1, keepdims=True)) / np.sqrt(x64.var(-1, ddof=1, keepdims=True)
                                                           + 1e-5)
    with pytest.raises(AssertionError):
        np.testing.assert_allclose(wrong, reference(x, g, b, "layer_norm"), rtol=1e-4, atol=1e-4)
