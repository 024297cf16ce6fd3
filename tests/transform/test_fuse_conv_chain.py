"""FuseConvChain: handmade Conv -> epilogue -> Conv(stride >= 2) models and real sub-graphs of
mobilenetv2-tiny and yolov8n vs onnxruntime, the refusals (another consumer, live bytes), and
the whole models' lower bound (slow)."""

import numpy as np
import onnx
import pytest
import tvm
from onnx import TensorProto, helper, numpy_helper

from relax_memplan.analysis.lowered_peak import lowered_live_bytes_by_step
from relax_memplan.frontend import import_onnx
from relax_memplan.pipeline import fusion_counts, fusion_passes, get_pipeline
from relax_memplan.runtime import run_and_measure
from relax_memplan.transform._conv_chain_kernel import ConvSpec, recompute_factor, scratch_bytes
from relax_memplan.transform.fuse_conv_chain import FuseConvChain
from tests.conftest import shared_model

ort = pytest.importorskip("onnxruntime")
_LLVM = tvm.target.Target("llvm")


def _conv(name, x, out, w, stride, pad, group=1, bias=None):
    inputs = [x, w.name] + ([bias.name] if bias is not None else [])
    return helper.make_node("Conv", inputs, [out], name=name, strides=[stride[0], stride[1]],
                            pads=list(pad), group=group, kernel_shape=list(w.dims[2:]))


def _weight(name, shape, rng):
    return numpy_helper.from_array((rng.standard_normal(shape) * 0.3).astype("float32"), name)


def _chain_model(c_in, hw, c_mid, k_a, stride_a, pad_a, c_out, k_b, stride_b, pad_b, group_b,
                 act="relu", extra_reader=False, seed=0):
    """x -> Conv(+bias) -> act -> Conv(stride_b, group_b)(+bias) -> Relu -> y (and, with
    ``extra_reader``, the intermediate also read by a Sigmoid output)."""
    rng = np.random.default_rng(seed)
    wa, ba = _weight("wa", (c_mid, c_in, k_a, k_a), rng), _weight("ba", (c_mid,), rng)
    wb = _weight("wb", (c_out, c_mid // group_b, k_b, k_b), rng)
    bb = _weight("bb", (c_out,), rng)
    nodes = [_conv("conv_a", "x", "a", wa, stride_a, pad_a, bias=ba)]
    if act == "relu":
        nodes.append(helper.make_node("Relu", ["a"], ["t"]))
    elif act == "relu6":
        lo = numpy_helper.from_array(np.array(0.0, "float32"), "lo")
        hi = numpy_helper.from_array(np.array(6.0, "float32"), "hi")
        nodes += [helper.make_node("Constant", [], ["lo"], value=lo),
                  helper.make_node("Constant", [], ["hi"], value=hi),
                  helper.make_node("Clip", ["a", "lo", "hi"], ["t"])]
    else:  # silu
        nodes += [helper.make_node("Sigmoid", ["a"], ["s"]),
                  helper.make_node("Mul", ["a", "s"], ["t"])]
    nodes += [_conv("conv_b", "t", "b", wb, stride_b, pad_b, group=group_b, bias=bb),
              helper.make_node("Relu", ["b"], ["y"])]
    outputs = [helper.make_tensor_value_info("y", TensorProto.FLOAT, None)]
    if extra_reader:
        nodes.append(helper.make_node("Sigmoid", ["t"], ["t2"]))
        outputs.append(helper.make_tensor_value_info("t2", TensorProto.FLOAT, None))
    graph = helper.make_graph(
        nodes, "chain", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, c_in] + hw)],
        outputs, initializer=[wa, ba, wb, bb])
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 13)])


def _build(model, shapes, passes):
    mod, _ = import_onnx(model, shapes)
    return tvm.compile(mod, _LLVM, relax_pipeline=get_pipeline(
        _LLVM, fusion=True, fusion_pass_list=passes))


def _check_against_ort(model, shapes, seed=1, conv_chain="memory"):
    """Build with our fusion passes, compare every output with onnxruntime; the passes."""
    passes = fusion_passes(_LLVM, conv_chain)
    ex = _build(model, shapes, passes)
    name, shape = next(iter(shapes.items()))
    x = np.random.default_rng(seed).standard_normal(shape).astype("float32")
    refs = ort.InferenceSession(model.SerializeToString(),
                                providers=["CPUExecutionProvider"]).run(None, {name: x})
    outs = run_and_measure(ex, [x]).outputs
    for out, ref in zip(outs, refs):
        np.testing.assert_allclose(out, ref, rtol=1e-4, atol=1e-4 * np.abs(ref).max())
    return passes, outs


# dense / depthwise consumer, odd sizes, padding 0/1, stride 2 and 3 (and (3, 2)), producer
# strides 1 and 2, ReLU / ReLU6 (the importer's maximum/minimum kernels) / SiLU
CASES = [
    dict(c_in=3, hw=[13, 11], c_mid=5, k_a=3, stride_a=(1, 1), pad_a=(1, 1, 1, 1), c_out=7,
         k_b=3, stride_b=(2, 2), pad_b=(1, 1, 1, 1), group_b=1, act="relu"),
    dict(c_in=4, hw=[17, 15], c_mid=6, k_a=1, stride_a=(1, 1), pad_a=(0, 0, 0, 0), c_out=6,
         k_b=3, stride_b=(3, 3), pad_b=(0, 0, 0, 0), group_b=6, act="relu6"),
    dict(c_in=3, hw=[19, 21], c_mid=8, k_a=3, stride_a=(2, 2), pad_a=(1, 1, 1, 1), c_out=8,
         k_b=3, stride_b=(2, 2), pad_b=(1, 1, 1, 1), group_b=8, act="silu"),
    dict(c_in=2, hw=[40, 9], c_mid=4, k_a=3, stride_a=(1, 1), pad_a=(0, 1, 0, 1), c_out=3,
         k_b=3, stride_b=(3, 2), pad_b=(1, 0, 0, 1), group_b=1, act="silu"),
]


@pytest.mark.parametrize("case", CASES, ids=["dense_s2_pad1", "dw_s3_pad0_relu6",
                                             "dw_s2_producer_s2_silu", "dense_s3x2_odd_pad"])
def test_chain_matches_onnxruntime(case):
    model = _chain_model(**case)
    passes, _ = _check_against_ort(model, {"x": (1, case["c_in"], *case["hw"])})
    assert fusion_counts(passes)["conv_chain"] == 1


def test_consumer_kernel_below_its_stride_is_left_to_tvm():
    """A 2-row kernel at stride 3 reads rows with gaps: not fused, and still right."""
    case = dict(CASES[3], k_b=2)
    passes, _ = _check_against_ort(_chain_model(**case), {"x": (1, 2, *case["hw"])})
    chain = [p for p in passes if p.info.name == "FuseConvChain"][0]
    assert chain.fused == 0 and chain.skipped == {"kernel_below_stride": 1}


def test_tolerance_catches_a_wrong_result():
    """The comparison above fails on a result that is off (a weight of conv_a changed)."""
    case = CASES[0]
    model = _chain_model(**case)
    wrong = onnx.ModelProto()
    wrong.CopyFrom(model)
    w = numpy_helper.to_array(wrong.graph.initializer[0]).copy()
    w[0, 0, 1, 1] += 0.5
    wrong.graph.initializer[0].CopyFrom(numpy_helper.from_array(w, "wa"))
    shapes = {"x": (1, case["c_in"], *case["hw"])}
    ex = _build(model, shapes, fusion_passes(_LLVM, "memory"))
    x = np.random.default_rng(1).standard_normal(shapes["x"]).astype("float32")
    ref = ort.InferenceSession(wrong.SerializeToString(),
                               providers=["CPUExecutionProvider"]).run(None, {"x": x})[0]
    out = run_and_measure(ex, [x]).outputs[0]
    with pytest.raises(AssertionError):
        np.testing.assert_allclose(out, ref, rtol=1e-4, atol=1e-4 * np.abs(ref).max())


def test_intermediate_with_another_consumer_is_refused():
    case = dict(CASES[0], extra_reader=True)
    passes, _ = _check_against_ort(_chain_model(**case), {"x": (1, 3, 13, 11)})
    chain = [p for p in passes if p.info.name == "FuseConvChain"][0]
    assert chain.fused == 0 and chain.skipped == {"other_consumer": 1}
    assert fusion_counts(passes)["conv_chain_refused"] == 1


def _late_consumer_module():
    """A 1-channel intermediate ``a`` of a 16-channel tensor ``p``, then a wide unrelated
    tensor ``u``, then the strided conv of ``a``: fused, ``p`` stays live across ``u``."""
    from tvm import relax

    rng = np.random.default_rng(0)
    const = lambda *shape: relax.const(rng.standard_normal(shape).astype("float32"))
    bb = relax.BlockBuilder()
    x = relax.Var("x", relax.TensorType((1, 16, 16, 16), "float32"))
    with bb.function("main", [x]):
        with bb.dataflow():
            p = bb.emit(relax.op.nn.relu(x))
            a = bb.emit(relax.op.nn.conv2d(p, const(1, 16, 1, 1)))
            u = bb.emit(relax.op.nn.conv2d(x, const(16, 16, 1, 1)))
            m = bb.emit(relax.op.mean(relax.op.nn.relu(u), axis=[1], keepdims=True))
            b = bb.emit(relax.op.nn.conv2d(a, const(1, 1, 3, 3), strides=[2, 2],
                                           padding=[1, 1, 1, 1]))
            pooled = bb.emit(relax.op.nn.max_pool2d(m, pool_size=[2, 2], strides=[2, 2]))
            y = bb.emit_output(relax.op.add(b, pooled))
        bb.emit_func_output(y)
    return bb.get()


def test_refused_where_live_bytes_would_rise():
    """The same site is fused with the check off, so the live-bytes rule is what refuses it."""
    mod = _late_consumer_module()
    checked, unchecked = FuseConvChain(target=_LLVM), FuseConvChain(memory_check=False)
    checked(mod)
    assert checked.fused == 0 and checked.skipped == {"peak": 1}
    fused = unchecked(mod)
    assert unchecked.fused == 1
    assert max(lowered_live_bytes_by_step(fused, "main")) > \
        max(lowered_live_bytes_by_step(mod, "main"))


def test_auto_mode_leaves_dense_consumers_to_our_schedules():
    """``auto`` with our CPU schedules leaves a dense consumer without the register-blocked
    kernel unfused (5 -> 7 channels: the generic kernel, measured slower fused) and fuses a
    depthwise one; without schedules it fuses both; ``off`` runs no FuseConvChain."""
    mod, _ = import_onnx(_chain_model(**CASES[0]), {"x": (1, 3, 13, 11)})
    for schedule, fused, skipped in ((True, 0, {"dense_consumer": 1}), (False, 1, {})):
        (chain,) = [p for p in fusion_passes(_LLVM, "auto", schedule)
                    if p.info.name == "FuseConvChain"]
        chain(mod)
        assert (chain.fused, chain.skipped) == (fused, skipped)
    mod, _ = import_onnx(_chain_model(**CASES[1]), {"x": (1, 4, 17, 15)})
    (chain,) = [p for p in fusion_passes(_LLVM, "auto", True) if p.info.name == "FuseConvChain"]
    chain(mod)
    assert chain.fused == 1
    assert "conv_chain" not in fusion_counts(fusion_passes(_LLVM, "off"))


def test_get_pipeline_default_fusion_follows_schedule():
    # get_pipeline(schedule=True) without a fusion_pass_list fused dense consumers on the
    # generic kernel too (the unscheduled choice): yolov8n ran 40.4 ms instead of 27.0 ms
    mod, _ = import_onnx(_chain_model(**CASES[0]), {"x": (1, 3, 13, 11)})
    for schedule, chains in ((True, 0), (False, 1)):
        with _LLVM:
            out = get_pipeline(_LLVM, schedule=schedule)(mod)
        names = [gv.name_hint for gv, _f in out.functions_items()]
        assert sum(n.startswith("conv_chain") for n in names) == chains, (schedule, names)


# channel counts multiples of the SIMD width: the register-blocked kernel (dense and depthwise
# consumers, SiLU through fast_sigmoid, 5x5 stride 2, a producer with padding and stride 2)
BLOCKED_CASES = [
    dict(c_in=3, hw=[20, 18], c_mid=16, k_a=3, stride_a=(2, 2), pad_a=(1, 1, 1, 1), c_out=32,
         k_b=3, stride_b=(2, 2), pad_b=(1, 1, 1, 1), group_b=1, act="silu"),
    dict(c_in=8, hw=[14, 30], c_mid=32, k_a=1, stride_a=(1, 1), pad_a=(0, 0, 0, 0), c_out=32,
         k_b=3, stride_b=(2, 2), pad_b=(1, 1, 1, 1), group_b=32, act="relu6"),
    dict(c_in=16, hw=[30, 30], c_mid=48, k_a=1, stride_a=(1, 1), pad_a=(0, 0, 0, 0), c_out=48,
         k_b=5, stride_b=(2, 2), pad_b=(2, 2, 2, 2), group_b=48, act="silu"),
]


@pytest.mark.parametrize("case", BLOCKED_CASES, ids=["dense_stem_silu", "dw_relu6", "dw5x5_silu"])
def test_blocked_chain_kernel_matches_onnxruntime_with_schedules(case):
    """The pipeline with our CPU schedules for the host CPU (``auto``: the blocked kernel takes
    dense consumers too) against onnxruntime; the pair gets the register-blocked kernel."""
    from relax_memplan.schedules import host_target

    model = _chain_model(**case)
    shape = (1, case["c_in"], *case["hw"])
    target = host_target()
    passes = fusion_passes(target, "auto", schedule=True)
    mod, _ = import_onnx(model, {"x": shape})
    ex = tvm.compile(mod, target, relax_pipeline=get_pipeline(
        target, schedule=True, fusion_pass_list=passes))
    (chain,) = [p for p in passes if p.info.name == "FuseConvChain"]
    assert chain.fused == 1
    assert chain.plan(*_site_specs(case)) is not None
    x = np.random.default_rng(2).standard_normal(shape).astype("float32")
    ref = ort.InferenceSession(model.SerializeToString(),
                               providers=["CPUExecutionProvider"]).run(None, {"x": x})[0]
    out = run_and_measure(ex, [x]).outputs[0]
    np.testing.assert_allclose(out, ref, rtol=1e-4, atol=1e-4 * np.abs(ref).max())


def _site_specs(case):
    a = ConvSpec(case["c_in"], case["c_mid"], tuple(case["hw"]), (case["k_a"],) * 2,
                 case["stride_a"], case["pad_a"], 1)
    b = ConvSpec(case["c_mid"], case["c_out"], a.out_hw, (case["k_b"],) * 2, case["stride_b"],
                 case["pad_b"], case["group_b"])
    return a, b


def test_pack_weight_layout():
    from relax_memplan.transform._conv_chain_blocked import pack_weight

    w = np.arange(32 * 3 * 2 * 2, dtype="float32").reshape(32, 3, 2, 2)
    packed = pack_weight(w, 16)
    assert packed.shape == (2, 2, 2, 3, 16)
    assert packed[1, 0, 1, 2, 5] == w[16 + 5, 2, 0, 1]
    dw = pack_weight(w[:, :1], 16, depthwise=True)
    assert dw.shape == (2, 2, 2, 16) and dw[1, 1, 0, 3] == w[19, 0, 1, 0]


def test_config_modes_are_the_pipeline_modes():
    from relax_memplan import config
    from relax_memplan.pipeline import CONV_CHAIN_MODES

    assert tuple(CONV_CHAIN_MODES) == config._CONV_CHAIN_MODES  # pylint: disable=protected-access


def test_bad_arguments_name_the_argument():
    with pytest.raises(ValueError, match="tile_rows"):
        FuseConvChain(tile_rows=0)
    with pytest.raises(ValueError, match="lanes"):
        FuseConvChain(lanes=0)
    with pytest.raises(ValueError, match="consumers"):
        FuseConvChain(consumers="dense")
    assert FuseConvChain(consumers="blocked").consumers == "blocked"
    with pytest.raises(ValueError, match="conv_chain must be one of"):
        fusion_passes(_LLVM, "fast")


def test_scratch_and_recompute_of_mobilenet_site():
    """mobilenetv2's expand 1x1 (16 -> 96 ch at 48x48) into the 3x3 stride-2 depthwise: 2
    output rows per tile read 5 intermediate rows (96 ch x (48 + 50 padded) columns x 4 B) +
    the 2 x 24 accumulator; 5 rows computed per 4 new ones."""
    a = ConvSpec(16, 96, (48, 48), (1, 1), (1, 1), (0, 0, 0, 0), 1)
    b = ConvSpec(96, 96, (48, 48), (3, 3), (2, 2), (1, 1, 1, 1), 96)
    assert scratch_bytes(a, b, 2) == 4 * (5 * 96 * (48 + 50) + 2 * 24) == 188352
    assert recompute_factor(b, 2) == 1.25 and recompute_factor(b, 1) == 1.5


def test_site_whose_scratch_is_not_smaller_than_the_intermediate_is_refused():
    """The scratch (TVM workspace, one per running thread) is outside the lower bound, so the
    live-bytes rule cannot see it: a site is refused when the scratch of all threads is not
    smaller than the intermediate it removes. mobilenetv2's first site: 188,352 B per thread
    against 884,736 B, fused up to 4 threads, refused from 5."""
    a = ConvSpec(16, 96, (48, 48), (1, 1), (1, 1), (0, 0, 0, 0), 1)
    b = ConvSpec(96, 96, (48, 48), (3, 3), (2, 2), (1, 1, 1, 1), 96)
    assert not FuseConvChain(threads=4)._scratch_exceeds(a, b)
    assert FuseConvChain(threads=5)._scratch_exceeds(a, b)
    model = _chain_model(**CASES[0])
    mod, _ = import_onnx(model, {"x": (1, CASES[0]["c_in"], *CASES[0]["hw"])})
    many, one = FuseConvChain(target=_LLVM, threads=64), FuseConvChain(target=_LLVM, threads=1)
    many(mod)
    one(mod)
    assert (many.fused, many.skipped) == (0, {"scratch": 1})
    assert one.fused == 1
    with pytest.raises(ValueError, match="threads"):
        FuseConvChain(threads=0)


def _submodel(path, tmp_path, inputs, outputs):
    out = tmp_path / "sub.onnx"
    onnx.utils.extract_model(str(path), str(out), inputs, outputs)
    return onnx.load(str(out))


def test_mobilenetv2_first_stride2_block_matches_onnxruntime(tmp_path):
    """Real weights: mobilenetv2-tiny's first stride-2 block from its input (16 x 48 x 48) to
    its depthwise output (the expand conv + ReLU6 fused into the depthwise conv + ReLU6)."""
    model = _submodel(shared_model("mobilenetv2-tiny.onnx"), tmp_path, ["/Add_output_0"],
                      ["/blocks.1/blocks.1.5/Clip_output_0"])
    passes, _ = _check_against_ort(model, {"/Add_output_0": (1, 16, 48, 48)},
                                   conv_chain="auto")
    assert fusion_counts(passes)["conv_chain"] == 1


def test_yolov8n_stem_matches_onnxruntime(tmp_path):
    """Real weights: yolov8n's stem conv0 3x3 s2 + SiLU fused into conv1 3x3 s2 + SiLU."""
    model = _submodel(shared_model("yolov8n-nudenet-320n.onnx"), tmp_path, ["images"],
                      ["/model.1/act/Mul_output_0"])
    passes, _ = _check_against_ort(model, {"images": (1, 3, 320, 320)})
    assert fusion_counts(passes)["conv_chain"] == 1


def _static_bound(path, shapes, conv_chain: str):
    from relax_memplan.transform.plan_static_memory import PlanStaticMemory

    mod, _ = import_onnx(path, shapes)
    plan, passes = PlanStaticMemory(), fusion_passes(_LLVM, conv_chain=conv_chain)
    get_pipeline(_LLVM, plan_pass=plan, fusion_pass_list=passes)(mod)
    return plan.plans["main"].lower_bound_bytes, fusion_counts(passes)


@pytest.mark.slow
def test_mobilenetv2_lower_bound_drops():
    """1,105,920 B (expand output 96x48x48 + stride-2 depthwise output 96x24x24) -> 718,848."""
    path = shared_model("mobilenetv2-tiny.onnx")
    before, _ = _static_bound(path, {"x": (1, 3, 96, 96)}, conv_chain="off")
    after, counts = _static_bound(path, {"x": (1, 3, 96, 96)}, conv_chain="auto")
    assert (before, after, counts["conv_chain"]) == (1105920, 718848, 3)


@pytest.mark.slow
def test_yolov8n_stem_leaves_the_concat_peak():
    """The stem pair no longer sets the peak; the C2f Concat that tied with it (2,457,600 B)
    still does, so the bound stays until the Concat is written in place."""
    path = shared_model("yolov8n-nudenet-320n.onnx")
    mod, _ = import_onnx(path, {"images": (1, 3, 320, 320)})
    chain = FuseConvChain(target=_LLVM)
    fused = chain(mod)
    before = sorted(lowered_live_bytes_by_step(mod, "main"), reverse=True)
    after = sorted(lowered_live_bytes_by_step(fused, "main"), reverse=True)
    assert chain.fused == 2 and chain.skipped.get("other_consumer") == 4
    assert before[:4] == [2457600] * 4 and after[:2] == [2457600] * 2 and after[2] < 2457600


def test_relax_clip_batch_two_and_a_chain_of_two_strided_convs():
    """``R.clip`` epilogue, batch 2, conv -> s2 depthwise -> s2 depthwise: the first pair is
    fused, the second (its producer already fused) is left; same result as TVM unfused."""
    from tvm import relax

    rng = np.random.default_rng(0)
    const = lambda *shape: relax.const(rng.standard_normal(shape).astype("float32"))
    bb = relax.BlockBuilder()
    x = relax.Var("x", relax.TensorType((2, 4, 11, 11), "float32"))
    with bb.function("main", [x]):
        with bb.dataflow():
            a = bb.emit(relax.op.nn.conv2d(x, const(6, 4, 3, 3), padding=[1, 1, 1, 1]))
            t = bb.emit(relax.op.clip(a, 0.0, 6.0))
            b = bb.emit(relax.op.nn.conv2d(t, const(6, 1, 3, 3), strides=[2, 2],
                                           padding=[1, 1, 1, 1], groups=6))
            c = bb.emit(relax.op.nn.conv2d(b, const(6, 1, 3, 3), strides=[2, 2],
                                           padding=[1, 1, 1, 1], groups=6))
            y = bb.emit_output(relax.op.nn.relu(c))
        bb.emit_func_output(y)
    mod = bb.get()
    chain = FuseConvChain(memory_check=False)
    fused = chain(mod)
    assert chain.fused == 1 and chain.skipped == {"overlap": 1}
    xv = tvm.runtime.tensor(rng.standard_normal((2, 4, 11, 11)).astype("float32"))
    run = lambda m: relax.VirtualMachine(tvm.compile(m, "llvm"), tvm.cpu())["main"](xv).numpy()
    ref = run(mod)
    np.testing.assert_allclose(run(fused), ref, rtol=1e-5, atol=1e-5 * np.abs(ref).max())
