"""SpatialFallback: which kernels it schedules and how (parallel only with enough work, short
unit-stride vectors only, symbolic shapes left alone), and numerics equal to the unscheduled
build (in a subprocess)."""

import os
import subprocess
import sys
from pathlib import Path

import pytest
import tvm
from tvm import relax, s_tir, te, tirx
from tvm.s_tir.dlight.analysis import get_root_block

from relax_memplan.schedules import SpatialFallback, host_target, simd_lanes, vector_codegen_risk
from relax_memplan.schedules._column_reduction import column_reduction_lead
from relax_memplan.schedules._dot_reduction import dot_loop, dot_width
from relax_memplan.schedules._fallback_inline import contiguous_in as _contiguous_in
from tests.schedules.fallback_checks import (CASES, LEFT_ALONE, _module, batch_norm_relu,
                                             concat_split_head, shared_exp)

REPO_ROOT = Path(__file__).resolve().parents[2]


def _fused_kernels(mod):
    seq = tvm.transform.Sequential([
        relax.transform.LegalizeOps(), relax.transform.AnnotateTIROpPattern(),
        relax.transform.FoldConstant(), relax.transform.FuseOps(), relax.transform.FuseTIR(),
    ])
    return [f for _, f in seq(mod).functions_items() if isinstance(f, tirx.PrimFunc)]


def _scheduled_text(func):
    sch = SpatialFallback().apply(func, host_target(), False)
    return None if sch is None else sch.mod["main"].script()


@pytest.mark.parametrize("case", CASES, ids=[c[0] for c in CASES])
def test_fallback_schedules_every_case(case):
    texts = [_scheduled_text(f) for f in _fused_kernels(case[1])]
    assert any(t is not None for t in texts) == (case[0] not in LEFT_ALONE), case[0]


@pytest.mark.parametrize("case", CASES, ids=[c[0] for c in CASES])
def test_fallback_schedules_pass_the_codegen_guard(case):
    # compile-time guard: no vector loop wider than 64 lanes or enclosing another loop
    for func in _fused_kernels(case[1]):
        sch = SpatialFallback().apply(func, host_target(), False)
        assert sch is None or vector_codegen_risk(sch.mod["main"]) is None, case[0]


def test_codegen_guard_flags_a_fallback_vector_too_wide():
    # the check above can fail: up to 64 registers make one 256-lane vector loop (any SIMD width)
    wide = SpatialFallback(max_vector_registers=64).apply(
        _fused_kernels(batch_norm_relu((1, 8, 4, 256)))[0], host_target(), False)
    assert "lanes" in vector_codegen_risk(wide.mod["main"])


def test_batch_norm_chain_is_one_parallel_vectorized_block():
    (func,) = _fused_kernels(batch_norm_relu((1, 64, 60, 40)))
    text = _scheduled_text(func)
    blocks = text.count("T.sblock(") - text.count("# with T.sblock(")
    assert blocks == 1  # the five intermediates inlined into the relu
    assert "T.parallel(" in text and "T.vectorized(T.int64(8))" in text  # 40 = 5 x 8


def test_small_kernel_gets_no_parallel_loop():
    (func,) = _fused_kernels(batch_norm_relu((1, 5, 7, 16)))
    text = _scheduled_text(func)
    assert text is not None and "T.parallel(" not in text and "T.vectorized(" in text


def test_strided_pooling_is_parallel_but_not_vectorized():
    x = relax.Var("x", relax.TensorType([1, 96, 109, 109], "float32"))
    bb = relax.BlockBuilder()
    with bb.function("main", [x]):
        with bb.dataflow():
            out = bb.emit_output(bb.emit(relax.op.nn.max_pool2d(x, 3, 2)))
        bb.emit_func_output(out)
    texts = [t for t in map(_scheduled_text, _fused_kernels(bb.get())) if t is not None]
    assert texts and all("T.vectorized(" not in t for t in texts)
    assert any("T.parallel(" in t for t in texts)


def test_stride_one_pooling_stays_serial():
    # yolov8n's SPPF 5x5 max-pool: LLVM vectorises the serial loop; in a parallel closure it
    # ran scalar, 0.089 ms against 0.016 ms unscheduled (one thread)
    mod = _module([(1, 128, 10, 10)], lambda x: relax.op.nn.max_pool2d(x, 5, 1, padding=2))
    texts = [_scheduled_text(f) for f in _fused_kernels(mod)]
    assert all(t is None or "T.parallel(" not in t for t in texts)
    # a wider window than max_serial_window is parallel again
    rule = SpatialFallback(max_serial_window=16)
    scheduled = [rule.apply(f, host_target(), False) for f in _fused_kernels(mod)]
    assert any(s is not None and "T.parallel(" in s.mod["main"].script() for s in scheduled)


def test_producer_read_by_two_consumers_is_not_inlined():
    # ultraface's box decoding: an exp read by four slices, inlined, ran four times
    (func,) = _fused_kernels(shared_exp((1, 4420, 4)))
    text = _scheduled_text(func)
    assert text is not None and text.count("T.exp(") == 1


def test_shared_producer_without_vector_loop_is_left_to_tvm():
    # yolov8n's head: the concat of flattened maps, read by both halves of a split, kept with
    # its div/mod indices and no vector loop ran 0.339 ms against 0.105 ms unscheduled
    # (the halves not rejoined: FuseOps makes three kernels, the concat and split one shared)
    (head,) = [f for f in _fused_kernels(concat_split_head(rejoin=False)) if len(f.params) > 3]
    assert _scheduled_text(head) is None


def test_concat_read_once_after_inlining_keeps_its_layout_loops():
    # the halves rejoined: once they are inlined the concat has one consumer, which reads each
    # element once, but the concat's div/mod reads stay a block of their own (all inlined:
    # 1.3-1.6x slower than TVM's; so, 0.057 vs 0.065 ms and, at yolov8n's size, 0.64 vs
    # 0.72 ms, one thread)
    (func,) = _fused_kernels(concat_split_head())
    text = _scheduled_text(func)
    assert 'T.sblock("T_concat")' in text and "T.vectorized(" in text


def _column_sum(shape, square=False):
    return _module([shape], lambda x: relax.op.sum(
        relax.op.multiply(x, x) if square else x, axis=[1]))


def test_column_reduction_reads_vectors_inside_the_reduction_loop():
    # magika's sum over the sequence axis: 0.13 ms as TVM's kernel (a scalar strided read per
    # add), 0.021 ms with the columns inside the reduction loop
    (func,) = _fused_kernels(_column_sum((1, 512, 256)))
    text = _scheduled_text(func)
    assert text is not None and "T.parallel(" not in text  # 131,072 iterations: serial
    update = text[text.index('_update"') - 400:]
    assert "for k" in update.split("T.vectorized(T.int64(16))")[0]  # k outside the vector loop
    wide = SpatialFallback(min_parallel_reduction_work=1).apply(func, host_target(), False)
    assert "T.parallel(" in wide.mod["main"].script()


def test_element_wise_block_read_by_several_is_inlined_once_they_are_one():
    # magika's tanh-GELU: x + b read by five blocks that are inlined into one; then x + b too
    # (2.0 -> 0.44 ms with the max over each row, one thread); its squeeze reads x[0, c, i, 0]
    def body(x, b):
        y = relax.op.add(relax.op.squeeze(x, axis=[3]), b)
        inner = relax.op.multiply(relax.op.add(y, relax.op.multiply(
            relax.const(0.044715, "float32"), relax.op.multiply(y, relax.op.multiply(y, y)))),
            relax.const(0.79788456, "float32"))
        gelu = relax.op.multiply(relax.op.multiply(y, relax.const(0.5, "float32")),
                                 relax.op.add(relax.op.tanh(inner), relax.const(1.0, "float32")))
        return relax.op.max(gelu, axis=[2])
    (func,) = _fused_kernels(_module([(1, 64, 36, 1), (1, 64, 1)], body))
    text = _scheduled_text(func)
    spatial = text[:text.index('T.sblock("')] + text[text.index('T.sblock("'):].split(
        "_red")[0]
    assert text.count("T.sblock(") - text.count("# with T.sblock(") == 2, text  # GELU, max
    assert "T.vectorized(" in spatial


def test_producer_is_inlined_into_a_column_reduction_reading_it_once():
    (func,) = _fused_kernels(_column_sum((1, 64, 32), square=True))
    text = _scheduled_text(func)
    blocks = text.count("T.sblock(") - text.count("# with T.sblock(")
    assert blocks == 2  # init and update: the square computed inside
    assert "T.vectorized(" in text


def test_producer_read_for_every_broadcast_row_is_not_inlined_into_a_reduction():
    # the reduction reads m[0, k, j] for both values of i: inlined, m would be computed twice
    a = te.placeholder((2, 16, 32), name="a")
    m = te.compute((1, 16, 32), lambda i, k, j: a[0, k, j] * a[0, k, j], name="m")
    k = te.reduce_axis((0, 16), name="k")
    s = te.compute((2, 32), lambda i, j: te.sum(m[0, k, j] * a[i, k, j], axis=k), name="s")
    text = SpatialFallback().apply(te.create_prim_func([a, s]), host_target(), False)
    assert text is not None and 'T.sblock("m")' in text.mod["main"].script()


def test_row_reduction_is_not_interchanged():
    # the reduced axis is the innermost one: already unit-stride, no column plan
    mod = _module([(1, 256, 512)], lambda x: relax.op.sum(x, axis=[2]))
    (func,) = _fused_kernels(mod)
    sch = s_tir.Schedule(func)
    (block,) = sch.get_child_blocks(get_root_block(sch))
    assert column_reduction_lead(sch, block, _contiguous_in) is None
    column = s_tir.Schedule(_fused_kernels(_column_sum((1, 256, 512)))[0])
    (block,) = column.get_child_blocks(get_root_block(column))
    assert column_reduction_lead(column, block, _contiguous_in) == 2


def test_symbolic_and_long_vector_kernels():
    n = tirx.Var("n", "int64")
    a = te.placeholder((n, 64), name="a")
    symbolic = te.create_prim_func([a, te.compute((n, 64), lambda i, j: a[i, j] * 2.0)])
    assert SpatialFallback().apply(symbolic, host_target(), False) is None
    b = te.placeholder((256, 256), name="b")
    func = te.create_prim_func([b, te.compute((256, 256), lambda i, j: b[i, j] + 1.0)])
    text = SpatialFallback().apply(func, host_target(), False).mod["main"].script()
    assert "T.vectorized(T.int64(64))" not in text and "T.vectorized(" in text


def test_fallback_kernels_match_unscheduled_build_subprocess():
    env = dict(os.environ, PYTHONPATH=str(REPO_ROOT), TVM_NUM_THREADS="2")
    src = ("from tests.schedules import fallback_checks as c; "
           "c.check_fallback_cases('host'); c.check_fallback_cases('llvm')")
    proc = subprocess.run([sys.executable, "-c", src], env=env, cwd=REPO_ROOT,
                          capture_output=True, text=True, timeout=600)
    tail = (proc.stdout + proc.stderr)[-3000:]
    assert proc.returncode == 0 and proc.stdout.count("FALLBACK OK") == 2, tail


def _case(label):
    return next(mod for name, mod in CASES if name == label)


def test_transpose_over_a_cache_slab_is_tiled_serially():
    # vad-lstm's (1, 64, 256) -> (256, 1, 64): 12 us as TVM's kernel, 16 us with the host
    # CPU's flags, 5 us in 16 x 16 tiles (one thread)
    (func,) = _fused_kernels(_case("transpose 1x64x256 -> 256x1x64 (vad-lstm)"))
    text = _scheduled_text(func)
    assert text is not None and "T.parallel(" not in text
    # both transposed loops split by 16, their inner parts innermost
    assert "for ax0_0, ax2_0, ax1, ax0_1, ax2_1 in T.grid(T.int64(16), T.int64(4), " \
        "T.int64(1), T.int64(16), T.int64(16))" in text
    # NCHW -> NHWC of a 6 KiB slab per row: TVM's kernel (8.6 us against 14.7 tiled)
    (small,) = _fused_kernels(_case("transpose nchw->nhwc"))
    assert SpatialFallback().apply(small, host_target(), False) is None
    assert SpatialFallback(min_transpose_slab_bytes=0).apply(small, host_target(), False) \
        is not None


def test_transpose_tile_divides_both_loops():
    (func,) = _fused_kernels(_case("transpose odd 96x104 tiled by 8"))
    text = _scheduled_text(func)
    assert text is not None and "T.int64(8)" in text and "T.int64(16)" not in text


def test_nearest_resize_stays_serial():
    # ppocrv4-det's nearest resize of 96 x 10 x 10: 2.9 us serial, 18.9 us parallel (1 thread)
    for label in ("resize nearest x2", "resize nearest x2 96x10x10 (ppocr)"):
        for func in _fused_kernels(_case(label)):
            assert _scheduled_text(func) is None, label


def test_dot_product_gets_vector_partial_sums():
    # ppocrv4-det's squeeze-excitation 1x1 conv on a 1x1 map: 28 us as TVM's kernel (one
    # scalar sum per output), 2.3 us with 16 partial sums (one thread)
    (func,) = _fused_kernels(_case("dot conv 384->96 on 1x1 relu"))
    lanes = simd_lanes(host_target(), "float32")
    text = _scheduled_text(func)
    assert text is not None and "_rf" in text and f"T.vectorized(T.int64({lanes}))" in text
    assert "T.parallel(" not in text  # 36,864 iterations: serial
    wide = SpatialFallback(min_parallel_dot_work=1).apply(func, host_target(), False)
    assert "T.parallel(" in wide.mod["main"].script()


def test_dot_product_without_a_vector_width_is_serial_and_scalar():
    (func,) = _fused_kernels(_case("dot conv 18->33 on 1x1 (no vector width)"))
    text = _scheduled_text(func)
    assert text is None or ("_rf" not in text and "T.parallel(" not in text)


def test_dot_width_divides_the_loop_at_least_twice():
    assert dot_width(384, 16) == 16 and dot_width(24, 16) == 8 and dot_width(20, 16) == 4
    assert dot_width(16, 16) == 8 and dot_width(18, 16) is None and dot_width(4, 16) is None


def test_pooling_window_is_not_a_dot_product():
    # a max (or a plain sum) over a unit-stride window is no multiply-accumulate
    for pool in (relax.op.nn.max_pool2d, relax.op.nn.avg_pool2d):
        mod = _module([(1, 8, 16, 16)], lambda x, pool=pool: pool(x, 2, 2))
        for func in _fused_kernels(mod):
            sch = s_tir.Schedule(func)
            for block in sch.get_child_blocks(get_root_block(sch)):
                node = sch.get(block)
                extents = [int(lp.extent) for lp in map(sch.get, sch.get_loops(block))]
                if len(extents) == len(node.iter_vars):
                    assert dot_loop(node, extents) is None


def test_small_copy_is_vectorized_but_serial():
    # yolov8n's split of (1, 64, 40, 40): 9 us serial, 32 us parallel (two threads, wall time)
    mod = _module([(1, 64, 40, 40)], lambda x: relax.op.split(x, 2, axis=1))
    texts = [t for t in map(_scheduled_text, _fused_kernels(mod)) if t is not None]
    assert texts and all("T.parallel(" not in t and "T.vectorized(" in t for t in texts)
    # 819,200 elements moved: parallel (131 vs 81 us); and the same size of arithmetic is no copy
    big = _module([(1, 64, 80, 80)] * 2, lambda a, b: relax.op.concat([a, b], axis=1))
    assert "T.parallel(" in _scheduled_text(_fused_kernels(big)[0])
    add = _module([(1, 64, 80, 80)] * 2, lambda a, b: relax.op.add(a, b))
    assert "T.parallel(" in _scheduled_text(_fused_kernels(add)[0])


def test_element_wise_kernel_parallel_only_from_min_parallel_work():
    """Latency run (two threads, TVM's pool not spinning): vad-lstm's broadcast add of
    65,536 elements was parallel and read 1.75x TVM's serial kernel (5.5 vs 18.7 us alone);
    it stays serial now, and twice its size (131,072: 11.4 vs 6.5 us spinning) is parallel."""
    small = _module([(1, 256, 256), (1, 1, 256)], lambda a, b: relax.op.add(a, b))
    text = _scheduled_text(_fused_kernels(small)[0])
    assert text is not None and "T.parallel(" not in text and "T.vectorized(" in text
    big = _module([(1, 512, 256), (1, 1, 256)], lambda a, b: relax.op.add(a, b))
    assert "T.parallel(" in _scheduled_text(_fused_kernels(big)[0])


def test_small_strided_pooling_stays_serial():
    # squeezenet's 3x3 stride-2 max-pool of 256 x 27 x 27 (389,376 iterations): 1.17-1.18x
    # TVM's serial kernel at two threads in four model runs: TVM's kernel
    mod = _module([(1, 256, 27, 27)], lambda x: relax.op.nn.max_pool2d(x, 3, 2))
    assert all(_scheduled_text(f) is None for f in _fused_kernels(mod))
    rule = SpatialFallback(min_parallel_window_work=1)
    assert any(s is not None and "T.parallel(" in s.mod["main"].script()
               for s in (rule.apply(f, host_target(), False) for f in _fused_kernels(mod)))
