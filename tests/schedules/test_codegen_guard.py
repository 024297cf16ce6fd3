"""The compile-time guard (issue 12): vector schedules that blow up LLVM are refused.

dlight's CPU GEMV on the VAD model's head (``[256, 1, 64] @ [64, 1]``) vectorised the
rows 128 wide around the reduction loop; for an AVX-512 host that one kernel did not
compile in 15 minutes."""

import os
import subprocess
import sys
from pathlib import Path

import pytest
import tvm
from tvm import s_tir, te

from relax_memplan.schedules import (CodegenGuard, DotProductGEMV, host_target,
                                     schedule_prim_func, vector_codegen_risk)

REPO_ROOT = Path(__file__).resolve().parents[2]


def _vad_head(rows=256, k=64):
    """The VAD head kernel as legalized: ``y[rows, 1, k] @ w[k, 1]``."""
    y = te.placeholder((rows, 1, k), name="y")
    w = te.placeholder((k, 1), name="w")
    r = te.reduce_axis((0, k), name="r")
    out = te.compute((rows, 1, 1), lambda i, j, n: te.sum(y[i, j, r] * w[r, n], axis=r),
                     name="matmul")
    return te.create_prim_func([y, w, out])


def _vectorized_rows(lanes, reduction_inside):
    """The head with its rows split by ``lanes`` and vectorized, the reduction inside or out."""
    sch = s_tir.Schedule(_vad_head())
    i, _, _, r = sch.get_loops(sch.get_sblock("matmul"))
    outer, inner = sch.split(i, factors=[None, lanes])
    if not reduction_inside:
        sch.reorder(outer, r, inner)
    sch.vectorize(inner)
    return sch.mod["main"]


def test_risk_names_too_many_lanes():
    reason = vector_codegen_risk(_vectorized_rows(128, reduction_inside=True))
    assert reason is not None and "128" in reason and "lanes" in reason


def test_risk_names_a_loop_inside_the_vector_loop():
    reason = vector_codegen_risk(_vectorized_rows(8, reduction_inside=True))
    assert reason is not None and "encloses" in reason and "64" in reason


def test_innermost_narrow_vector_loop_is_safe():
    assert vector_codegen_risk(_vectorized_rows(8, reduction_inside=False)) is None
    assert vector_codegen_risk(_vectorized_rows(8, reduction_inside=False),
                               max_vector_lanes=4) is not None


def test_gemv_result_on_vad_head_is_refused():
    target = host_target()
    with target:
        assert DotProductGEMV().apply(_vad_head(), target, False) is not None  # dlight applies
        guard = CodegenGuard(DotProductGEMV())
        assert guard.apply(_vad_head(), target, False) is None
        assert guard.rejected and "lanes" in guard.rejected[0]
        scheduled = schedule_prim_func(_vad_head(), target)
    assert vector_codegen_risk(scheduled) is None


def test_vad_model_builds_for_the_host_cpu_and_matches_onnxruntime_subprocess():
    """The build took over 15 min (a schedule blowing up LLVM); now about 1 s, measured by
    benchmarks/compile_time_bench.py. The subprocess's limit only guards against a hang."""
    call = (
        "import time, tempfile, os, numpy as np, onnx, tvm; from tvm import relax\n"
        "from relax_memplan.frontend.recurrent_example import vad_lstm_model\n"
        "from relax_memplan.frontend import import_onnx, run_onnxruntime\n"
        "from relax_memplan.pipeline import get_pipeline\n"
        "from relax_memplan.schedules import host_target\n"
        "path = os.path.join(tempfile.mkdtemp(), 'vad.onnx'); onnx.save(vad_lstm_model(), path)\n"
        "mod, _ = import_onnx(path, {'feats': (1, 40, 64)})\n"
        "t = host_target(); t0 = time.perf_counter()\n"
        "ex = tvm.compile(mod, t, relax_pipeline=get_pipeline(t, schedule=True))\n"
        "print('BUILT', time.perf_counter() - t0)\n"
        "rng = np.random.default_rng(0)\n"
        "feeds = {'feats': rng.standard_normal((1, 40, 64)).astype('float32'),\n"
        "         'h0': np.zeros((1, 1, 64), 'float32'), 'c0': np.zeros((1, 1, 64), 'float32'),\n"
        "         'sr': np.array(16000, 'int64')}\n"
        "got = relax.VirtualMachine(ex, tvm.cpu())['main'](*[tvm.runtime.tensor(v) for v in feeds.values()])\n"
        "want = run_onnxruntime(path, feeds)\n"
        "err = max(float(np.abs(g.numpy() - w).max()) for g, w in zip(got, want))\n"
        "assert err < 1e-4, err\n"
        "print('MATCH', err)\n")
    env = dict(os.environ, PYTHONPATH=str(REPO_ROOT), TVM_NUM_THREADS="2")
    try:
        proc = subprocess.run([sys.executable, "-c", call], env=env, cwd=REPO_ROOT,
                              capture_output=True, text=True, timeout=600)
    except subprocess.TimeoutExpired as err:
        pytest.fail(f"the VAD build hung for 600 s (a schedule blowing up LLVM?): {err}")
    tail = (proc.stdout + proc.stderr)[-3000:]
    assert proc.returncode == 0 and "MATCH" in proc.stdout, tail
