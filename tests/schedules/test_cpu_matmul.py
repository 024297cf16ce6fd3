"""CPU matmul schedules: numerics against numpy, that the rules apply, and the pipeline hook."""

import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
import tvm
from tvm import relax, te, tirx

from relax_memplan.pipeline import get_pipeline
from relax_memplan.schedules import (
    IS_SCHEDULED_ATTR,
    GenericMatmul,
    StaticMatmul,
    cpu_schedule_pass,
    schedule_prim_func,
)
from tests.conftest import shared_model
from tests.schedules.isolated_checks import dense3d_module

TARGET = tvm.target.Target({"kind": "llvm"})
REPO_ROOT = Path(__file__).resolve().parents[2]
RTOL = 1e-4


def _gelu(x):
    from math import erf, sqrt

    return x * 0.5 * (1.0 + np.vectorize(erf)(x / sqrt(2.0)).astype(x.dtype))


def _dense_module(m, k, n, act=None, bias=True):
    """Relax ``act(x @ w + b)``; ``m`` may be a ``tirx.Var``."""
    x = relax.Var("x", relax.TensorType([m, k], "float32"))
    w = relax.Var("w", relax.TensorType([k, n], "float32"))
    b = relax.Var("b", relax.TensorType([n], "float32"))
    bb = relax.BlockBuilder()
    with bb.function("main", [x, w, b]):
        with bb.dataflow():
            y = bb.emit(relax.op.matmul(x, w))
            if bias:
                y = bb.emit(relax.op.add(y, b))
            if act == "relu":
                y = bb.emit(relax.op.nn.relu(y))
            elif act == "gelu":
                y = bb.emit(relax.op.nn.gelu(y))
            out = bb.emit_output(y)
        bb.emit_func_output(out)
    return bb.get()


def _fused_kernel(mod):
    """The one fused PrimFunc LegalizeOps + FuseOps + FuseTIR make of ``mod``."""
    seq = tvm.transform.Sequential([
        relax.transform.LegalizeOps(), relax.transform.AnnotateTIROpPattern(),
        relax.transform.FuseOps(), relax.transform.FuseTIR(),
    ])
    funcs = [f for _, f in seq(mod).functions_items() if isinstance(f, tirx.PrimFunc)]
    assert len(funcs) == 1
    return funcs[0]


def _nt_batch_kernel(batch, m, k, n):
    """``C[b, i, j] = sum_k A[b, i, k] * B[b, j, k]`` (NT batch matmul) from TE."""
    a = te.placeholder((batch, m, k), name="A")
    b = te.placeholder((batch, n, k), name="B")
    r = te.reduce_axis((0, k), name="k")
    c = te.compute((batch, m, n), lambda s, i, j: te.sum(a[s, i, r] * b[s, j, r], axis=r),
                   name="C")
    return te.create_prim_func([a, b, c])


def _run(func, *arrays, out_shape):
    lib = tvm.compile(tvm.IRModule({"main": func.with_attr("global_symbol", "main")}),
                      target=TARGET)
    out = tvm.runtime.tensor(np.zeros(out_shape, "float32"))
    lib["main"](*[tvm.runtime.tensor(a) for a in arrays], out)
    return out.numpy()


def _dense_inputs(m, k, n, seed=0):
    rng = np.random.default_rng(seed)
    return (rng.standard_normal((m, k), dtype="float32"),
            rng.standard_normal((k, n), dtype="float32"),
            rng.standard_normal(n, dtype="float32"))


def _reference(x, w, b, act):
    y = x @ w + b
    if act == "relu":
        return np.maximum(y, 0)
    if act == "gelu":
        return _gelu(y)
    return y


@pytest.mark.parametrize("m,k,n,act", [(64, 64, 48, "relu"), (37, 96, 40, "gelu"),
                                       (1, 32, 24, None)])
def test_static_matmul_epilogue_matches_numpy(m, k, n, act):
    func = _fused_kernel(_dense_module(m, k, n, act))
    assert StaticMatmul().apply(func, TARGET, False) is not None
    x, w, b = _dense_inputs(m, k, n)
    out = _run(schedule_prim_func(func, TARGET), x, w, b, out_shape=(m, n))
    np.testing.assert_allclose(out, _reference(x, w, b, act), rtol=RTOL, atol=RTOL)


@pytest.mark.parametrize("act", ["relu", "gelu"])
def test_symbolic_matmul_matches_numpy_for_every_m(act):
    m = tirx.Var("m", "int64")
    func = _fused_kernel(_dense_module(m, 64, 40, act))
    assert StaticMatmul().apply(func, TARGET, False) is None
    assert GenericMatmul().apply(func, TARGET, False) is not None
    lib = tvm.compile(tvm.IRModule({"main": schedule_prim_func(func, TARGET)
                                    .with_attr("global_symbol", "main")}), target=TARGET)
    for rows in (1, 7, 64, 100, 128):
        x, w, b = _dense_inputs(rows, 64, 40, seed=rows)
        out = tvm.runtime.tensor(np.zeros((rows, 40), "float32"))
        lib["main"](tvm.runtime.tensor(x), tvm.runtime.tensor(w), tvm.runtime.tensor(b), out)
        np.testing.assert_allclose(out.numpy(), _reference(x, w, b, act), rtol=RTOL, atol=RTOL,
                                   err_msg=f"m={rows}")


def test_nt_batch_matmul_static_and_symbolic():
    rng = np.random.default_rng(1)
    a = rng.standard_normal((3, 20, 16), dtype="float32")
    b = rng.standard_normal((3, 12, 16), dtype="float32")
    ref = a @ b.transpose(0, 2, 1)
    static = schedule_prim_func(_nt_batch_kernel(3, 20, 16, 12), TARGET)
    np.testing.assert_allclose(_run(static, a, b, out_shape=ref.shape), ref, rtol=RTOL,
                               atol=RTOL)
    m = tirx.Var("m", "int64")
    generic = schedule_prim_func(_nt_batch_kernel(3, m, 16, 12), TARGET)
    assert generic.attrs[IS_SCHEDULED_ATTR]
    np.testing.assert_allclose(_run(generic, a, b, out_shape=ref.shape), ref, rtol=RTOL,
                               atol=RTOL)


def test_scheduled_function_is_marked_parallel_and_vectorized():
    # 128 x 128 x 96 = 1.6 M multiply-adds: above StaticMatmul's parallel threshold
    func = schedule_prim_func(_fused_kernel(_dense_module(128, 128, 96, "relu")), TARGET)
    assert func.attrs[IS_SCHEDULED_ATTR]
    text = func.script()
    for loop_kind in ("T.parallel(", "T.vectorized(", "T.unroll("):
        assert loop_kind in text
    # accumulation in a local tile; the epilogue writes the output from that tile
    assert 'scope="local"' in text
    assert "T.max(matmul_intermediate_local[" in text


def test_small_static_matmul_runs_serially():
    # silero-vad's small matmuls: serial, the model runs in 0.2 ms instead of 2.6 ms at 2 threads
    func = _fused_kernel(_dense_module(1, 256, 512, None))
    text = StaticMatmul().apply(func, TARGET, False).mod["main"].script()
    assert "T.parallel(" not in text and "T.vectorized(" in text
    forced = StaticMatmul(min_parallel_macs=0).apply(func, TARGET, False).mod["main"].script()
    assert "T.parallel(" in forced
    x, w, b = _dense_inputs(1, 256, 512)
    out = _run(schedule_prim_func(func, TARGET), x, w, b, out_shape=(1, 512))
    np.testing.assert_allclose(out, _reference(x, w, b, None), rtol=RTOL, atol=RTOL)


def test_specialized_kernel_gets_the_static_rule():
    m = tirx.Var("m", "int64")
    func = _fused_kernel(_dense_module(m, 64, 48, "relu"))
    x_param = func.params[0]  # x: (m, 64); binding its shape binds m everywhere
    rows = tirx.IntImm("int64", 64)
    shape = (rows, x_param.shape[1])
    special = func.specialize({x_param: tirx.decl_buffer(shape, "float32", "x")})
    assert StaticMatmul().apply(special, TARGET, False) is not None
    scheduled = schedule_prim_func(special, TARGET)
    assert "_pad" not in scheduled.script()  # 64 rows divide the tile: no padding
    x, w, b = _dense_inputs(64, 64, 48)
    np.testing.assert_allclose(_run(scheduled, x, w, b, out_shape=(64, 48)),
                               _reference(x, w, b, "relu"), rtol=RTOL, atol=RTOL)


def test_already_scheduled_function_is_not_rescheduled():
    func = _fused_kernel(_dense_module(16, 16, 16)).with_attr(IS_SCHEDULED_ATTR, True)
    assert schedule_prim_func(func, TARGET).same_as(func)


def test_non_matmul_prim_func_is_left_alone():
    a = te.placeholder((32, 16), name="A")
    elementwise = te.create_prim_func([a, te.compute((32, 16), lambda i, j: a[i, j] + 1.0)])
    assert StaticMatmul().apply(elementwise, TARGET, False) is None
    assert GenericMatmul().apply(elementwise, TARGET, False) is None
    # only the fallback takes it: short vectors, no parallel loop for 512 elements
    text = schedule_prim_func(elementwise, TARGET).script()
    assert "T.vectorized(" in text and "T.parallel(" not in text
    r = te.reduce_axis((0, 16), name="r")
    row_max = te.create_prim_func([a, te.compute((32,), lambda i: te.max(a[i, r], axis=r))])
    assert StaticMatmul().apply(row_max, TARGET, False) is None
    assert GenericMatmul().apply(row_max, TARGET, False) is None


def test_cpu_schedule_pass_schedules_every_matmul_in_a_module():
    mod = tvm.IRModule({"dense": _fused_kernel(_dense_module(8, 16, 8, "relu")),
                        "bmm": _nt_batch_kernel(2, 8, 16, 8)})
    out = cpu_schedule_pass(TARGET)(mod)
    for gv in ("dense", "bmm"):
        assert out[gv].attrs[IS_SCHEDULED_ATTR]


def test_pipeline_with_schedule_runs_symbolic_dense_end_to_end():
    n = tirx.Var("n", "int64")
    mod = _dense_module(n, 32, 24, "relu")
    ex = tvm.compile(mod, "llvm", relax_pipeline=get_pipeline("llvm", schedule=True))
    vm = relax.VirtualMachine(ex, tvm.cpu())
    for rows in (1, 5, 16):
        x, w, b = _dense_inputs(rows, 32, 24, seed=rows)
        out = vm["main"](*[tvm.runtime.tensor(v) for v in (x, w, b)]).numpy()
        np.testing.assert_allclose(out, _reference(x, w, b, "relu"), rtol=RTOL, atol=RTOL)


# --- (batch, seq, K) dense with symbolic rows: out-of-bounds write-back regression -------------
# GenericMatmul fused the row loops (batch, padded seq) into one M axis; with seq symbolic a tile
# could straddle two batches as far as the analyzer knew, the write-back region became a loose
# box (negative / repeated seq indices) and the stores corrupted the heap. StaticMatmul picked
# its row tile from batch * seq (2-row tiles over 2 x 17 rows) and wrote back stale accumulators.
# The runs are in a subprocess (tests/schedules/isolated_checks.py), so a heap corruption fails
# the test instead of pytest.


def _run_isolated(call, marker, timeout=180):
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join([str(REPO_ROOT), env.get("PYTHONPATH", "")])
    src = f"from tests.schedules import isolated_checks as c; {call}"
    try:
        proc = subprocess.run([sys.executable, "-c", src], env=env, cwd=REPO_ROOT,
                              capture_output=True, text=True, timeout=timeout, check=False)
    except subprocess.TimeoutExpired as err:  # corrupted heap can also deadlock
        pytest.fail(f"subprocess hung for {timeout} s: {err}")
    tail = (proc.stdout + proc.stderr)[-3000:]
    assert proc.returncode == 0, f"subprocess exited with {proc.returncode}:\n{tail}"
    assert marker in proc.stdout, tail


def test_dense3d_residual_symbolic_rows_in_bounds_subprocess():
    _run_isolated("c.check_dense3d()", "DENSE3D OK")


def test_dense3d_symbolic_write_back_is_exact():
    """The tile's write-back covers its own 4 rows of one batch: no min/max box bounds."""
    func = _fused_kernel(dense3d_module(tirx.Var("batch", "int64"), tirx.Var("seq", "int64")))
    assert StaticMatmul().apply(func, TARGET, False) is None
    text = schedule_prim_func(func, TARGET).script()
    # the only min is the clamped read of the padded rows (_clamp_pad), none in the regions
    mins = [line.strip() for line in text.splitlines() if "T.min(" in line or "T.max(" in line]
    assert len(mins) == 1 and "x[v0, T.min(v1, seq - T.int64(1)), v3]" in mins[0], mins
    assert "T.where(" in text  # the padded rows are guarded


def test_bert_tiny_dynamic_scheduled_matches_onnxruntime_subprocess():
    pytest.importorskip("onnxruntime")
    path = shared_model("bert-tiny-randw.onnx")
    _run_isolated(f"c.check_bert_tiny({str(path)!r})", "BERT OK")


def test_bert_static_at_seq_1_builds_with_cpu_schedules_and_matches_onnxruntime():
    """dlight's CPU GEMV rule asserts on a reduction of length 1 (attention at seq 1): the
    guarded rule leaves that kernel unscheduled instead of failing the build."""
    from relax_memplan.compile import BuildOptions, CheckOptions, compile_model

    seq_1 = {name: (1, 1) for name in ("input_ids", "attention_mask", "token_type_ids")}
    result = compile_model(shared_model("bert-tiny-randw.onnx"), seq_1,
                           options=BuildOptions(schedule=True), check=CheckOptions(verify=True))
    assert result.report.main.verified


@pytest.mark.parametrize("mcpu, n, nr_vectors", [("skylake-avx512", 96, 3), ("skylake-avx512", 32, 2),
                                                 (None, 96, 2)])
def test_generic_tile_is_as_wide_as_the_static_one_where_the_columns_allow(mcpu, n, nr_vectors):
    """With FMA and N a multiple of 3 vectors the generic tile is StaticMatmul's first FMA tile
    (4 x 3 vectors), so a dispatching kernel's versions share one prepacked weight layout."""
    from relax_memplan.schedules.analysis import MatmulAxes  # pylint: disable=import-outside-toplevel

    target = tvm.target.Target({"kind": "llvm", "mcpu": mcpu} if mcpu else {"kind": "llvm"})
    lanes = 16 if mcpu else 4
    axes = MatmulAxes(block=None, roles="IJK", i_extents=[tirx.Var("m", "int64")],
                      j_extents=[n], k_extents=[64])
    cfg = GenericMatmul().choose_config(axes, lanes, target)
    assert (cfg.mr, cfg.nr_vectors) == (4, nr_vectors)
    assert GenericMatmul(wide_nr_vectors=0).choose_config(axes, lanes, target).nr_vectors == 2


AVX512 = tvm.target.Target({"kind": "llvm", "mcpu": "skylake-avx512"})


def _nt_kernel(m, k, n):
    """``C[i, j] = sum_k A[i, k] * W[j, k]`` (a tied LM head's ``matmul_nt``) from TE."""
    a = te.placeholder((m, k), name="A")
    w = te.placeholder((n, k), name="W")
    r = te.reduce_axis((0, k), name="k")
    return te.create_prim_func([a, w, te.compute(
        (m, n), lambda i, j: te.sum(a[i, r] * w[j, r], axis=r), name="C")])


def _packed_b_shape(func) -> tuple:
    """Shape of the per-task packed copy of ``B`` (the one block-allocated global buffer)."""
    import re

    shapes = [tuple(int(d) for d in found.split(",") if d.strip())
              for found, scope in re.findall(r"sblock_alloc_buffer\(\(([\d, ]+)\)(.*)\)",
                                             func.script()) if "scope=" not in scope]
    assert len(shapes) == 1, shapes
    return shapes[0]


@pytest.mark.parametrize("kernel, a_shape, b_shape, packed", [
    (_nt_kernel(64, 32, 50), (64, 32), (50, 32), (32, 64)),
    (_nt_batch_kernel(3, 20, 16, 12), (3, 20, 16), (3, 12, 16), (3, 16, 16))])
def test_an_nt_b_is_packed_k_major_and_matches_numpy(kernel, a_shape, b_shape, packed):
    # the packed panel is (.., K, N padded to the tile): K before the columns
    # B[.., j, k] packed as read, the micro-kernel's columns were a gather of rows K apart
    # (GPT-2's tied LM head ran at a third of the prepacked matmuls' speed)
    func = schedule_prim_func(kernel, AVX512)
    assert _packed_b_shape(func) == packed
    rng = np.random.default_rng(3)
    a = rng.standard_normal(a_shape, dtype="float32")
    b = rng.standard_normal(b_shape, dtype="float32")
    ref = a @ np.swapaxes(b, -1, -2)
    out = _run(schedule_prim_func(kernel, TARGET), a, b, out_shape=ref.shape)
    np.testing.assert_allclose(out, ref, rtol=RTOL, atol=RTOL)


@pytest.mark.parametrize("m, n, tile", [(128, 50257, (4, 3)),  # 50304 columns: 0.1 % padding
                                        (128, 55, (4, 2)),     # 96 would pad 75 %: 64 kept
                                        (3, 50257, (3, 4))])   # 4 does not divide 3 rows
def test_padded_columns_take_the_preferred_tile_when_it_wastes_almost_nothing(m, n, tile):
    from relax_memplan.schedules.analysis import MatmulAxes  # pylint: disable=import-outside-toplevel

    axes = MatmulAxes(block=None, roles="IJK", i_extents=[m], j_extents=[n], k_extents=[768])
    cfg = StaticMatmul().choose_config(axes, 16, AVX512)
    assert (cfg.mr, cfg.nr_vectors) == (min(tile[0], m), tile[1])


def _loops_after_unroll(func, target):
    """``for`` headers of ``func`` after TVM's ``UnrollLoop`` (TIR lowering, no LLVM)."""
    import re

    seen = []

    @tvm.instrument.pass_instrument
    class _Capture:
        def run_after_pass(self, mod, info):
            if info.name == "tirx.UnrollLoop":
                seen.append(mod["main"].script())

    mod = tvm.IRModule({"main": func.with_attr("global_symbol", "main")
                        .with_attr("target", target)})
    with tvm.transform.PassContext(instruments=[_Capture()]):
        try:
            tirx.get_default_tir_pipeline(target)[0](mod)
        except tvm.error.InternalError:
            pass  # 0.27's pipeline stops at a pass meant for after MakePackedAPI; seen by then
    assert seen, "UnrollLoop did not run"
    return re.findall(r"for \w+ in range\((?:T\.int64\()?(\d+)", seen[0])


def test_long_reduction_loops_of_a_one_vector_tile_are_not_unrolled():
    # mnist's 1x256x10 kernel with per-call packing: at the old unroll_max_step=256 the
    # 256-long packing and reduction loops were unrolled (0.5 s of LLVM for one kernel)
    func = _fused_kernel(_dense_module(1, 256, 10))
    packed = StaticMatmul(gemv_in_place=False)
    loops = _loops_after_unroll(packed.apply(func, AVX512, False).mod["main"], AVX512)
    assert loops.count("256") == 2, loops
    old = StaticMatmul(gemv_in_place=False, unroll_max_step=256)
    assert "256" not in _loops_after_unroll(old.apply(func, AVX512, False).mod["main"], AVX512)


@pytest.mark.parametrize("k,n,act", [(256, 10, None), (512, 10, "relu"), (64, 40, "gelu")])
def test_one_row_matmul_reads_b_in_place_and_matches_numpy(k, n, act):
    # a matrix-vector product reads each element of B once: no per-call packed/padded copy
    func = _fused_kernel(_dense_module(1, k, n, act))
    text = StaticMatmul().apply(func, AVX512, False).mod["main"].script()
    assert "_global" not in text and "_pad" not in text
    packed = StaticMatmul(gemv_in_place=False).apply(func, AVX512, False).mod["main"].script()
    assert "w_pad_global" in packed or "w_global" in packed
    x, w, b = _dense_inputs(1, k, n, seed=k)
    out = _run(schedule_prim_func(func, TARGET), x, w, b, out_shape=(1, n))
    np.testing.assert_allclose(out, _reference(x, w, b, act), rtol=RTOL, atol=RTOL)


def test_one_row_matmul_reads_a_constant_b_in_place_unless_it_is_prepacked():
    # mnist's last Gemm: a constant (layout-free) B of 10 columns cannot be prepacked in
    # 16-lane panels, so it was packed and padded per call; 48 columns are prepacked
    def scheduled(n):
        func = _fused_kernel(_dense_module(1, 256, n)).with_attr("layout_free_buffers", [1])
        return StaticMatmul().apply(func, AVX512, False).mod["main"].script()

    assert "_global" not in scheduled(10) and "_pad" not in scheduled(10)
    assert "w_global" in scheduled(48)


def _heavy_epilogue_module(m, k, n, terms):
    """Relax ``z = 0.5 * z + y`` ``terms`` times on ``y = x @ w``: one long epilogue
    expression once FuseOps/FuseTIR fuse it into the matmul's write-back."""
    x = relax.Var("x", relax.TensorType([m, k], "float32"))
    w = relax.Var("w", relax.TensorType([k, n], "float32"))
    bb = relax.BlockBuilder()
    with bb.function("main", [x, w]):
        with bb.dataflow():
            y = bb.emit(relax.op.matmul(x, w))
            z = y
            for _ in range(terms):
                z = bb.emit(relax.op.add(relax.op.multiply(z, relax.const(0.5, "float32")), y))
            out = bb.emit_output(z)
        bb.emit_func_output(out)
    return bb.get()


def test_heavy_epilogue_write_back_is_not_unrolled():
    """Compile time: magika's tanh-GELU write-back unrolled 8 times took LLVM 82-93 ms
    (rolled 50-54 ms, same kernel speed); a long epilogue stays a loop, a short one
    (a plain matmul) is unrolled as before; numerics unchanged."""
    from relax_memplan.schedules._matmul_nest import HEAVY_EPILOGUE_CHARS

    heavy = _fused_kernel(_heavy_epilogue_module(8, 64, 64, terms=120))
    light = _fused_kernel(_heavy_epilogue_module(8, 64, 64, terms=1))
    with TARGET:
        heavy_s = StaticMatmul().apply(heavy, TARGET, False).mod["main"]
        light_s = StaticMatmul().apply(light, TARGET, False).mod["main"]
    assert len(heavy.script()) > HEAVY_EPILOGUE_CHARS > len(light.script())
    assert '"pragma_auto_unroll_max_step": 0' in heavy_s.script()
    assert '"pragma_auto_unroll_max_step": 0' not in light_s.script()
    x, w, _ = _dense_inputs(8, 64, 64)
    y = x @ w
    z = y
    for _ in range(120):
        z = z * np.float32(0.5) + y
    np.testing.assert_allclose(_run(heavy_s, x, w, out_shape=(8, 64)), z, rtol=RTOL, atol=1e-3)
