"""CPU convolution schedule and the GEMV guard: the rule applies, numerics equal the
unscheduled build (in a subprocess), and convolutions no longer reach dlight's GEMV."""

import os
import subprocess
import sys
from pathlib import Path

import pytest
import tvm
from tvm import relax, te, tirx

from relax_memplan.schedules import DirectConv, DotProductGEMV, StaticMatmul, host_target
from relax_memplan.schedules.cpu_conv import _column_tile, _tail_vectors
from relax_memplan.schedules.cpu_matmul import _box_aligned, _row_tile
from tests.conftest import shared_model
from tests.schedules.conv_checks import CASES, conv_module

REPO_ROOT = Path(__file__).resolve().parents[2]


def _fused_kernels(mod):
    seq = tvm.transform.Sequential([
        relax.transform.LegalizeOps(), relax.transform.AnnotateTIROpPattern(),
        relax.transform.FuseOps(), relax.transform.FuseTIR(),
    ])
    return [f for _, f in seq(mod).functions_items() if isinstance(f, tirx.PrimFunc)]


def _run_isolated(call, marker, timeout=300):
    env = dict(os.environ, PYTHONPATH=str(REPO_ROOT), TVM_NUM_THREADS="2")
    src = f"from tests.schedules import conv_checks as c; {call}"
    try:
        proc = subprocess.run([sys.executable, "-c", src], env=env, cwd=REPO_ROOT,
                              capture_output=True, text=True, timeout=timeout)
    except subprocess.TimeoutExpired as err:
        pytest.fail(f"subprocess hung for {timeout} s: {err}")
    tail = (proc.stdout + proc.stderr)[-3000:]
    assert proc.returncode == 0, f"subprocess exited with {proc.returncode}:\n{tail}"
    assert marker in proc.stdout, tail


@pytest.mark.parametrize("case", CASES, ids=[c[0] for c in CASES])
def test_direct_conv_applies_parallel_and_vectorized(case):
    (func,) = _fused_kernels(conv_module(*case[1:]))
    sch = DirectConv(min_parallel_macs=0, min_direct_1x1_pixels=0,  # small cases
                     schedule_depthwise=True, min_parallel_reduction=0).apply(
        func, host_target(), False)
    assert sch is not None, case[0]
    text = sch.mod["main"].script()
    assert "T.parallel(" in text and "T.vectorized(" in text
    # register accumulators, or full-vector tiles plus a tail accumulating in the output
    assert "_local" in text or "_partition" in text


@pytest.mark.parametrize("target", ["host", "llvm"])
def test_scheduled_convolutions_match_unscheduled_build_subprocess(target):
    _run_isolated(f"c.check_conv_cases({target!r})", "CONV OK")


@pytest.mark.parametrize("target", [host_target(), tvm.target.Target("llvm")],
                         ids=["host", "llvm"])
def test_width_without_vector_divisor_gets_full_vector_tiles_and_a_tail(target):
    # squeezenet's stem is 109 wide (prime): once one column per tile, now full vectors
    (func,) = _fused_kernels(conv_module((1, 3, 79, 79), 8, 7, 2, 0, 1, 1, "relu"))  # 37 wide
    sch = DirectConv(min_parallel_macs=0, min_parallel_reduction=0).apply(func, target, False)
    assert sch is not None
    text = sch.mod["main"].script()
    assert "_partition" in text and "T.parallel(" in text
    assert text.count("T.vectorized(") >= 2  # the main tiles and the tail


def test_column_tile_prefers_whole_vectors():
    # mobilenetv2-tiny's 48-wide stem: 24 columns (1.5 AVX-512 vectors) was 8x slower than 16
    assert _column_tile(48, 16, 2) == 16
    assert _column_tile(32, 16, 2) == 32 and _column_tile(13, 16, 2) == 13  # fit as they are
    assert _column_tile(80, 16, 2) == 16
    assert _column_tile(109, 16, 2) == 1  # the loop_partition path takes it


def test_column_tile_is_never_an_odd_width_above_one_vector():
    """Regression: 54-wide rows got 27-column tiles and 20-wide rows 20 (16 + 4 lanes); LLVM
    spilled those accumulators through the stack (yolov8n's 3x3 conv on a 40-wide map, 1
    thread: 16 -> 5.3 ms with whole-vector tiles). Such widths now take the tail path."""
    assert _column_tile(54, 16, 2) == 9 and _tail_vectors(54, 16, 2) == 1  # 3 x 16 + 6
    assert _column_tile(20, 16, 2) == 10 and _tail_vectors(20, 16, 2) == 1  # 16 + 4
    assert _column_tile(40, 16, 2) == 10 and _tail_vectors(40, 16, 2) == 2  # 32 + 8
    assert _tail_vectors(109, 16, 2) == 2  # 3 x 32 + 13
    for width in range(1, 200):
        xt = _column_tile(width, 16, 2)
        assert xt <= 16 or xt % 16 == 0, width
        if xt < 16 < width:
            v = _tail_vectors(width, 16, 2)
            assert width % (16 * v) < 16 and 16 * v <= width, width


def test_direct_conv_leaves_symbolic_and_non_conv_kernels_alone():
    n = tirx.Var("n", "int64")
    x = te.placeholder((n, 4, 8, 8), name="x")
    w = te.placeholder((4, 4, 3, 3), name="w")
    symbolic = te.create_prim_func([x, w, tvm.topi.nn.conv2d_nchw(x, w, 1, 1, 1)])
    assert DirectConv().apply(symbolic, host_target(), False) is None
    a = te.placeholder((16, 8), name="a")
    v = te.placeholder((8,), name="v")
    k = te.reduce_axis((0, 8), name="k")
    matvec = te.create_prim_func(
        [a, v, te.compute((16,), lambda i: te.sum(a[i, k] * v[k], axis=k), name="y")])
    assert DirectConv().apply(matvec, host_target(), False) is None


def test_gemv_guard_rejects_one_pixel_convolution_and_keeps_plain_matvec():
    (conv,) = _fused_kernels(conv_module((1, 16, 3), 32, 3, 2, 0, 1, 1, "bias"))  # 1 output
    target = host_target()
    with target:
        assert DotProductGEMV().apply(conv, target, False) is None
        a = te.placeholder((64, 256), name="a")
        v = te.placeholder((256,), name="v")
        k = te.reduce_axis((0, 256), name="k")
        matvec = te.create_prim_func(
            [a, v, te.compute((64,), lambda i: te.sum(a[i, k] * v[k], axis=k), name="y")])
        assert DotProductGEMV().apply(matvec, target, False) is not None


def test_silero_builds_with_cpu_schedules_subprocess():
    """dlight GEMV on its one-pixel conv1d kernels made this build take 18-24 s (now ~2 s):
    the rule refuses them now (test_gemv_guard_rejects_one_pixel_convolution_and_keeps_plain_
    matvec). The build's time is measured by benchmarks/compile_time_bench.py; the
    subprocess's limit only guards against a hang."""
    path = shared_model("silero-vad-op18-ifless.onnx")
    call = ("import time, tvm; from relax_memplan.frontend import import_onnx; "
            "from relax_memplan.pipeline import get_pipeline; "
            "from relax_memplan.schedules import host_target; "
            f"mod, _ = import_onnx({str(path)!r}, {{'input': (1, 512), 'state': (2, 1, 128)}}); "
            "t = host_target(); t0 = time.perf_counter(); "
            "tvm.compile(mod, t, relax_pipeline=get_pipeline(t, schedule=True)); "
            "print('BUILT', time.perf_counter() - t0)")
    _run_isolated(call, "BUILT")


def test_small_convolution_runs_serially():
    """mnist's 5x5 convolutions (0.16 / 0.63 M multiply-adds) were slower with a parallel loop."""
    (small,) = _fused_kernels(conv_module((1, 8, 18, 18), 16, 5, 1, 2, 1, 1, "relu"))
    text = DirectConv().apply(small, host_target(), False).mod["main"].script()
    assert "T.parallel(" not in text and "T.vectorized(" in text
    (large,) = _fused_kernels(conv_module((1, 32, 28, 28), 32, 3, 1, 1, 1, 1, "relu"))
    assert "T.parallel(" in DirectConv().apply(large, host_target(), False).mod["main"].script()


def test_row_tile_takes_whole_rows_in_whole_vectors_or_less_than_one():
    assert _row_tile([12, 12], 16, 6) == 48  # 4 rows, 3 full vectors
    assert _row_tile([20, 20], 16, 6) == 80  # 4 rows, 5 full vectors
    assert _row_tile([14, 14], 16, 6) == 14  # 28 / 42 would be odd-width accumulators
    assert _row_tile([3, 3], 16, 6) == 9
    assert _row_tile([27, 27], 16, 6) == 0  # nothing fits: the columns are padded instead
    assert _row_tile([2, 14], 16, 6) == 14  # t must divide the height
    assert _row_tile([14], 16, 6) == 0  # one column loop: a plain matmul


def test_box_aligned_rejects_tiles_that_straddle_rows():
    assert _box_aligned([12, 12], 48) and _box_aligned([12, 12], 36)
    assert _box_aligned([4, 32], 16)
    assert not _box_aligned([14, 14], 32)  # 32 columns: two rows and a piece of a third
    assert not _box_aligned([10, 12], 48)  # 4 rows do not divide 10
    assert not _box_aligned([tirx.Var("h", "int64"), 12], 48)


@pytest.mark.parametrize("shape, filters", [((1, 20, 12, 12), 24), ((2, 16, 14, 14), 10),
                                            ((1, 12, 3, 3), 64)])
def test_1x1_conv_gets_the_matmul_tile_without_padded_columns(shape, filters):
    """A 1x1 conv is (Cout x Cin) . (Cin x HW): StaticMatmul tiles whole output rows instead of
    padding each row to a vector multiple (mobilenetv2's 12-wide map padded to 48: 4x work)."""
    (func,) = _fused_kernels(conv_module(shape, filters, 1, 1, 0, 1, 1, "clip"))
    avx512 = tvm.target.Target({"kind": "llvm", "mcpu": "skylake-avx512"})  # 16 lanes, FMA
    sch = StaticMatmul(min_parallel_macs=0).apply(func, avx512, False)
    assert sch is not None
    text = sch.mod["main"].script()
    assert "_pad" not in text and "T.vectorized(" in text and "_local" in text


def _conv_func(shape, filters, kernel, stride, padding, groups=1):
    (func,) = _fused_kernels(conv_module(shape, filters, kernel, stride, padding, 1, groups,
                                         "relu"))
    return func


def _input_layout(func) -> tuple:
    """Shape of the buffer the scheduled convolution reads its input from (the padding
    block's, or the input copy's)."""
    from tvm.s_tir.dlight.analysis import get_root_block

    sch = tvm.s_tir.Schedule(func)
    allocs = {b.name: b for b in sch.get(get_root_block(sch)).alloc_buffers}
    buffer = allocs["pad_temp"] if "pad_temp" in allocs else allocs["x_global"]
    return tuple(int(d) for d in buffer.shape)


@pytest.mark.parametrize("shape, stride, padding, want", [
    ((1, 3, 20, 64), 2, 1, (1, 3, 22, 2, 33)),  # yolov8n's stem: padded 66 -> 2 x 33
    ((1, 4, 11, 47), 3, 2, (1, 4, 15, 3, 17)),  # stride 3: 51 -> 3 x 17
    ((1, 4, 9, 63), 2, 0, (1, 4, 9, 63)),  # 63 is no multiple of 2: left as is
    ((1, 4, 9, 64), 1, 1, (1, 4, 11, 66)),  # stride 1: nothing to do
])
def test_strided_input_is_deinterleaved_by_stride_phase(shape, stride, padding, want):
    sch = DirectConv(min_parallel_macs=0, min_deinterleave_channels=0).apply(_conv_func(shape, 8, 3 if stride < 3 else 5,
                                                           stride, padding), host_target(), False)
    assert _input_layout(sch.mod["main"]) == want


def test_unpadded_input_parameter_is_deinterleaved_in_a_copy():
    """No padding block in the function (inlined here): the input is copied
    (``cache_read``) into the deinterleaved layout, and the result still matches."""
    func = _conv_func((1, 4, 9, 64), 8, 3, 2, 0)
    sch = tvm.s_tir.Schedule(func)
    sch.compute_inline(sch.get_sblock("pad_temp"))
    sch = DirectConv(min_parallel_macs=0, min_deinterleave_channels=0).apply(
        sch.mod["main"], host_target(), False)
    assert _input_layout(sch.mod["main"]) == (1, 4, 9, 2, 32)
    assert "x_global" in sch.mod["main"].script()
    _run_isolated("c.check_inlined_pad_deinterleaved()", "deinterleaved copy ok")


def test_deinterleave_can_be_turned_off():
    sch = DirectConv(min_parallel_macs=0, deinterleave_strided=False).apply(
        _conv_func((1, 3, 20, 64), 16, 3, 2, 1), host_target(), False)
    assert _input_layout(sch.mod["main"]) == (1, 3, 22, 66)


def test_deinterleave_skips_few_input_channels_and_depthwise():
    """The copy costs more than it saves there (yolov8n's 3-channel stem, depthwise 3x3 s2)."""
    rule = DirectConv(min_parallel_macs=0)
    stem = rule.apply(_conv_func((1, 3, 20, 64), 16, 3, 2, 1), host_target(), False)
    assert _input_layout(stem.mod["main"]) == (1, 3, 22, 66)
    depthwise = rule.apply(_conv_func((1, 16, 20, 64), 16, 3, 2, 1, groups=16), host_target(),
                           False)
    assert _input_layout(depthwise.mod["main"]) == (1, 16, 22, 66)
    wide = rule.apply(_conv_func((1, 16, 20, 64), 16, 3, 2, 1), host_target(), False)
    assert _input_layout(wide.mod["main"]) == (1, 16, 22, 2, 33)


@pytest.mark.parametrize("shape, direct", [((1, 32, 80, 80), True), ((1, 192, 20, 20), True),
                                           ((1, 256, 10, 10), False), ((1, 96, 12, 12), False)])
def test_1x1_conv_goes_to_direct_conv_on_large_maps_only(shape, direct):
    """DirectConv runs before StaticMatmul and declines 1x1 convolutions under 256 output
    pixels; a 3x3 convolution on a small map is still its own."""
    from relax_memplan.schedules import cpu_schedule_rules

    names = [type(r).__name__ for r in cpu_schedule_rules()]
    assert names.index("DirectConv") < names.index("StaticMatmul")
    (func,) = _fused_kernels(conv_module(shape, 16, 1, 1, 0, 1, 1, "relu"))
    assert (DirectConv().apply(func, host_target(), False) is not None) == direct
    assert DirectConv().apply(_conv_func((1, 8, 6, 6), 8, 3, 1, 1), host_target(),
                              False) is not None


def test_depthwise_keeps_tvms_kernel_unless_asked():
    """TVM's unscheduled depthwise kernel ran 2.4-4x faster than our tile on wide maps
    (ppocrv4-det): returned unchanged, so that no later rule takes it either; on maps under
    64 wide our tile wins and is kept."""
    func = _conv_func((1, 16, 10, 160), 16, 3, 2, 1, groups=16)  # 80 wide
    kept = DirectConv().apply(func, host_target(), False)
    tvm.ir.assert_structural_equal(kept.mod["main"], func)
    ours = DirectConv(min_parallel_macs=0, schedule_depthwise=True,
                      min_parallel_reduction=0).apply(func, host_target(), False)
    assert "T.parallel(" in ours.mod["main"].script()
    narrow = _conv_func((1, 32, 6, 40), 32, 3, 1, 1, groups=32)  # 40 wide: our tile wins
    text = DirectConv().apply(narrow, host_target(), False).mod["main"].script()
    assert "_local" in text or "_partition" in text  # our tile
    grouped = _conv_func((1, 16, 20, 64), 16, 3, 1, 1, groups=4)  # 4 channels per output
    text = DirectConv(min_parallel_macs=0).apply(grouped, host_target(), False).mod["main"].script()
    assert "T.parallel(" in text


def test_conv_with_few_multiply_adds_per_output_is_serial():
    # yolov8n's 3-channel stem (27 multiply-adds per output, 11 M in all): memory-bound,
    # 1.38 ms serial vs 1.47 parallel at one thread, 2.9 vs 4.8 at two (wall, loaded host)
    (stem,) = _fused_kernels(conv_module((1, 3, 320, 320), 16, 3, 2, 1, 1, 1, "relu"))
    text = DirectConv().apply(stem, host_target(), False).mod["main"].script()
    assert "T.parallel(" not in text and "T.vectorized(" in text
    # 16 input channels x 3 x 3 = 144 per output: parallel
    (conv,) = _fused_kernels(conv_module((1, 16, 80, 80), 32, 3, 1, 1, 1, 1, "relu"))
    assert "T.parallel(" in DirectConv().apply(conv, host_target(), False).mod["main"].script()
