"""FuseAttention: matmul -> scale -> mask -> softmax -> matmul is one kernel, no score tensor."""

import re

import numpy as np
import pytest
import tvm
import tvm_ffi
from onnx import TensorProto, helper, numpy_helper
from tvm import relax
from tvm.script import ir as I, relax as R, tirx as T

from relax_memplan.frontend import import_onnx, make_random_inputs, run_onnxruntime
from relax_memplan.pipeline import get_pipeline
from relax_memplan.transform.fuse_attention import FuseAttention
from tests.conftest import shared_model


def _attention_module(second_reader=False):
    @I.ir_module
    class Before:
        @R.function
        def main(q: R.Tensor(("b", "s", 2, 8), "float32"),
                 k: R.Tensor(("b", "s", 2, 8), "float32"), v: R.Tensor(("b", "s", 2, 8), "float32"),
                 mask: R.Tensor(("b", 1, 1, "s"), "float32")):
            b, s = T.int64(), T.int64()
            with R.dataflow():
                qt = R.permute_dims(q, [0, 2, 1, 3])
                kt = R.permute_dims(k, [0, 2, 3, 1])
                vt = R.permute_dims(v, [0, 2, 1, 3])
                sc = R.matmul(qt, kt)
                sc2 = R.divide(sc, R.const(2.0, "float32"))
                sc3 = R.add(sc2, mask)
                p = R.nn.softmax(sc3, axis=-1)
                o = R.matmul(p, vt)
                ot = R.permute_dims(o, [0, 2, 1, 3])
                res = (ot, sc3) if second_reader else ot
                R.output(res)
            return res
    return Before


def _ops(mod):
    return re.findall(r"R\.(\w+(?:\.\w+)?)\(", mod["main"].script())


def test_attention_becomes_one_call_and_the_transposes_cancel():
    pass_ = FuseAttention()
    after = pass_(_attention_module())
    assert pass_.fused == 1
    ops = _ops(after)
    assert ops.count("call_tir") == 1
    for gone in ("matmul", "nn.softmax", "permute_dims", "divide", "add"):
        assert gone not in ops, ops
    kernels = [gv.name_hint for gv, f in after.functions_items() if isinstance(f, tvm.tirx.PrimFunc)]
    assert kernels == ["fused_attention"]


def test_scores_read_elsewhere_are_not_fused():
    pass_ = FuseAttention()
    before = _attention_module(second_reader=True)
    after = pass_(before)
    assert pass_.fused == 0 and after.same_as(before)


def test_bad_block_size_is_refused():
    with pytest.raises(ValueError, match="block_keys=0"):
        FuseAttention(block_keys=0)


def _onnx_attention(mask: bool, scale_op: str):
    """q, k, v (batch, seq, 2, 16) -> the importer's attention form, as BERT exports it."""
    perm = lambda x, axes: helper.make_node("Transpose", [x], [x + "t"], perm=axes)  # noqa: E731
    nodes = [perm("q", [0, 2, 1, 3]), perm("k", [0, 2, 3, 1]), perm("v", [0, 2, 1, 3]),
             helper.make_node("MatMul", ["qt", "kt"], ["s"]),
             helper.make_node(scale_op, ["s", "c"], ["s2"])]
    inputs = [helper.make_tensor_value_info(n, TensorProto.FLOAT, ["batch", "seq", 2, 16])
              for n in "qkv"]
    if mask:
        nodes.append(helper.make_node("Add", ["s2", "mask"], ["s3"]))
        inputs.append(helper.make_tensor_value_info("mask", TensorProto.FLOAT,
                                                    ["batch", 1, "seq", "seq"]))
    nodes += [helper.make_node("Softmax", ["s3" if mask else "s2"], ["p"], axis=-1),
              helper.make_node("MatMul", ["p", "vt"], ["o"]),
              helper.make_node("Transpose", ["o"], ["out"], perm=[0, 2, 1, 3])]
    graph = helper.make_graph(
        nodes, "attention", inputs,
        [helper.make_tensor_value_info("out", TensorProto.FLOAT, ["batch", "seq", 2, 16])],
        [numpy_helper.from_array(np.array(0.25 if scale_op == "Mul" else 4.0, "float32"), "c")])
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])


def _build(mod, fusion, dims):
    ex = tvm.compile(mod, "llvm", relax_pipeline=get_pipeline(
        "llvm", fusion=fusion, dim_ranges=dims))
    return relax.VirtualMachine(ex, tvm.cpu())


@pytest.mark.parametrize("mask, scale_op", [(True, "Mul"), (False, "Div")])
def test_small_attention_matches_onnxruntime_at_symbolic_seq(mask, scale_op):
    model = _onnx_attention(mask, scale_op)
    mod, _ = import_onnx(model, keep_dynamic=True)
    pass_ = FuseAttention()
    assert pass_(mod) is not None and pass_.fused == 1
    vm = _build(mod, True, {"seq": (1, 256), "batch": (1, 4)})
    rng = np.random.default_rng(0)
    for batch, seq in [(1, 1), (3, 77), (2, 128), (1, 200)]:
        feed = {n: rng.standard_normal((batch, seq, 2, 16)).astype("float32") for n in "qkv"}
        if mask:
            feed["mask"] = np.where(rng.random((batch, 1, seq, seq)) < 0.3,
                                    np.finfo(np.float32).min, 0).astype("float32")
        expected = run_onnxruntime(model, feed)[0]
        got = vm["main"](*[tvm.runtime.tensor(x) for x in feed.values()]).numpy()
        np.testing.assert_allclose(got, expected, rtol=1e-4, atol=1e-5)


def _legalized_kernels(mod, fusion, tmp_path, dims):
    dump = tmp_path / f"dump_{fusion}"
    ex = tvm.compile(mod, "llvm", relax_pipeline=get_pipeline(
        "llvm", fusion=fusion, dim_ranges=dims, dump_dir=dump))
    text = (dump / "1_legalize.py").read_text()
    return ex, re.findall(r"R\.call_tir\(cls\.(\w+)", text[text.index("def main"):])


def test_bert_tiny_fused_matches_onnxruntime_at_seq_1_77_128(tmp_path):
    path = shared_model("bert-tiny-randw.onnx")
    mod, info = import_onnx(path, keep_dynamic=True)
    dims = {"seq": (1, 128), "batch": (1, 2)}
    _, plain = _legalized_kernels(mod, False, tmp_path, dims)
    ex, fused = _legalized_kernels(mod, True, tmp_path, dims)
    assert fused.count("fused_attention") == 2
    assert not any("softmax" in k for k in fused)
    # per layer 11 kernels become 1: QK^T matmul (with scale and mask), softmax, PV matmul, and
    # the 4 transposes and 4 reshape copies of q, k, v and the output around them
    assert len(plain) - len(fused) == 2 * 10
    vm = relax.VirtualMachine(ex, tvm.cpu())
    for batch, seq in [(1, 1), (2, 77), (1, 128)]:
        shaped = info.__class__(**{**info.__dict__, "input_shapes": {
            n: (batch, seq) for n in info.input_shapes}})
        feed = make_random_inputs(path, shaped, seed=seq)
        expected = run_onnxruntime(path, feed)[0]
        got = vm["main"](*[tvm.runtime.tensor(x) for x in feed.values()]).numpy()
        rel = np.abs(got - expected).max() / np.abs(expected).max()
        assert rel <= 1e-4, (batch, seq, rel)


def test_fusion_lowers_the_lower_bound_where_the_scores_dominate():
    from relax_memplan.compile import build
    from relax_memplan.pipeline import PipelineOptions, PipelinePasses
    from relax_memplan.transform.plan_static_memory import PlanStaticMemory

    model = _onnx_attention(True, "Mul")
    shapes = {n: (1, 128, 2, 16) for n in "qkv"}
    mod, _ = import_onnx(model, {**shapes, "mask": (1, 1, 128, 128)})
    bounds = {}
    for fusion in (False, True):
        plan = PlanStaticMemory()
        build(mod, "llvm", PipelineOptions(fusion=fusion), PipelinePasses(plan=plan))
        bounds[fusion] = plan.plans["main"].lower_bound_bytes
    # without fusion two (1, 2, 128, 128) float32 score tensors are live at once
    assert bounds[False] >= 2 * 2 * 128 * 128 * 4
    assert bounds[True] < bounds[False] / 4, bounds


# -- real models: static shapes, symbolic ranges (ends and middle), dispatch buckets
_BLOCK = 32  # FuseAttention's default query/key block on CPU: 77 is not a multiple of it


def _dims_of(mod):
    """(batch, seq) var names of the model's first input."""
    return tuple(str(d) for d in mod["main"].params[0].ty.shape.values[:2])


def _check_runs(path, vm, info, seqs, seed=0):
    for seq in seqs:
        shaped = info.__class__(**{**info.__dict__, "input_shapes": {
            n: (1, seq) for n in info.input_shapes}})
        feed = make_random_inputs(path, shaped, seed=seed + seq)
        expected = run_onnxruntime(path, feed)[0]
        got = vm["main"](*[tvm.runtime.tensor(x) for x in feed.values()])
        got = (got[0] if isinstance(got, tvm.ir.Array) else got).numpy()
        rel = np.abs(got - expected).max() / np.abs(expected).max()
        assert rel <= 1e-4, (path.name, seq, rel)


@pytest.mark.parametrize("model", ["bert-tiny-randw.onnx", "gpt2-tiny-randw.onnx"])
def test_fused_model_matches_onnxruntime_with_dispatch_buckets(model):
    # symbolic seq in [1, 128] specialized to buckets: the fused kernel (already scheduled) is
    # left symbolic by SpecializeKernels, the other kernels get their bucket versions
    from relax_memplan.transform.specialize_kernels import SpecializeKernels

    path = shared_model(model)
    mod, info = import_onnx(path, keep_dynamic=True)
    batch, seq = _dims_of(mod)
    dispatch = SpecializeKernels({seq: [16, 64, 128]})
    fusion = [FuseAttention()]
    ex = tvm.compile(mod, "llvm", relax_pipeline=get_pipeline(
        "llvm", fusion=True, fusion_pass_list=fusion, dispatch_pass=dispatch,
        dim_ranges={batch: (1, 1), seq: (1, 128)}))
    assert fusion[0].fused == 2
    assert dispatch.specialized and "fused_attention" not in dispatch.specialized
    # seq 1 and 128 are the ends of the range; 77 (middle) is no multiple of the block
    _check_runs(path, relax.VirtualMachine(ex, tvm.cpu()), info, [1, 77, 128])


def test_gpt2_tiny_causal_fused_matches_onnxruntime_at_static_and_symbolic_seq():
    path = shared_model("gpt2-tiny-randw.onnx")
    mod, info = import_onnx(path, keep_dynamic=True)
    batch, seq = _dims_of(mod)
    fusion = [FuseAttention()]
    ex = tvm.compile(mod, "llvm", relax_pipeline=get_pipeline(
        "llvm", fusion=True, fusion_pass_list=fusion, dim_ranges={batch: (1, 1), seq: (1, 128)}))
    assert fusion[0].fused == 2  # the causal mask (where on a triangle) fused as a mask
    _check_runs(path, relax.VirtualMachine(ex, tvm.cpu()), info, [1, 77, 128])
    static, static_info = import_onnx(path, {"input_ids": (1, _BLOCK + 13)})
    ex = tvm.compile(static, "llvm", relax_pipeline=get_pipeline("llvm", fusion=True))
    _check_runs(path, relax.VirtualMachine(ex, tvm.cpu()), static_info, [_BLOCK + 13])


def test_bert_tiny_fused_matches_onnxruntime_at_a_static_seq():
    path = shared_model("bert-tiny-randw.onnx")
    mod, info = import_onnx(path, {n: (1, 77) for n in ("input_ids", "attention_mask",
                                                       "token_type_ids")})
    fusion = [FuseAttention()]
    ex = tvm.compile(mod, "llvm", relax_pipeline=get_pipeline(
        "llvm", fusion=True, fusion_pass_list=fusion, schedule=True))
    assert fusion[0].fused == 2
    _check_runs(path, relax.VirtualMachine(ex, tvm.cpu()), info, [77])


def test_fast_exp_of_the_kernel_is_exact_to_float_rounding():
    # the kernel's polynomial exp against numpy over the range the softmax sees (x <= 0),
    # including -inf (keys past the end, 40 keys in blocks of 32) and large negative scores
    @I.ir_module
    class Block:
        @R.function
        def main(q: R.Tensor((1, 40, 1, 4), "float32"), k: R.Tensor((1, 40, 1, 4), "float32"),
                 v: R.Tensor((1, 40, 1, 4), "float32")):
            with R.dataflow():
                s = R.matmul(R.permute_dims(q, [0, 2, 1, 3]), R.permute_dims(k, [0, 2, 3, 1]))
                o = R.matmul(R.nn.softmax(s, axis=-1), R.permute_dims(v, [0, 2, 1, 3]))
                R.output(o)
            return o

    pass_ = FuseAttention()
    fused = pass_(Block)
    assert pass_.fused == 1
    rng = np.random.default_rng(0)
    q = rng.standard_normal((1, 40, 1, 4)).astype("float32") * 6
    k = rng.standard_normal((1, 40, 1, 4)).astype("float32") * 6
    v = np.eye(40, 4, dtype="float32")[None, :, None, :] + rng.random((1, 40, 1, 4), "float32")
    vm = relax.VirtualMachine(tvm.compile(fused, "llvm"), tvm.cpu())
    out = vm["main"](*[tvm.runtime.tensor(x) for x in (q, k, v)]).numpy()
    s = np.einsum("bihd,bjhd->bhij", q.astype("float64"), k.astype("float64"))
    p = np.exp(s - s.max(-1, keepdims=True))
    expected = np.einsum("bhij,bjhd->bhid", p / p.sum(-1, keepdims=True), v)
    np.testing.assert_allclose(out, expected, rtol=2e-5, atol=2e-6)


def test_check_runs_fails_an_output_off_by_more_than_its_tolerance():
    path = shared_model("bert-tiny-randw.onnx")
    _, info = import_onnx(path, {n: (1, 8) for n in ("input_ids", "attention_mask",
                                                     "token_type_ids")})

    class OffBy:  # a "VM" returning onnxruntime's output plus rel * max|output|
        def __init__(self, rel):
            self.rel = rel

        def __getitem__(self, _name):
            def call(*args):
                feed = dict(zip(info.input_shapes, (a.numpy() for a in args)))
                ref = run_onnxruntime(path, feed)[0]
                return tvm.runtime.tensor(ref + self.rel * np.abs(ref).max())
            return call

    _check_runs(path, OffBy(5e-5), info, [8])
    with pytest.raises(AssertionError):
        _check_runs(path, OffBy(2e-4), info, [8])


def _kernel_calls(mod, fusion):
    """Kernel calls in ``main`` after our pipeline's dataflow_lower phase (reshapes are views
    by then); these models are straight-line, so it is the count per call."""
    from relax_memplan.pipeline import backend_phases

    target = tvm.target.Target("llvm")
    with target:
        for name, passes in backend_phases(target, fusion=fusion):
            mod = tvm.transform.Sequential(passes, name=name)(mod)
            if name == "dataflow_lower":
                break
    return len(re.findall(r"\bcls\.\w+\(", mod.script()))


_SLOW = pytest.mark.slow  # 20-40 s each on 2 cores (conv-heavy legalization)


@pytest.mark.parametrize("model, max_ratio", [
    ("bert-tiny-randw.onnx", 0.9), ("gpt2-tiny-randw.onnx", 0.8),
    ("magika-1.0.3.onnx", 1.0), ("squeezenet1.0-randw.onnx", 1.0), ("mnist-8/model.onnx", 1.0),
    pytest.param("mobilenetv2-tiny.onnx", 1.0, marks=_SLOW),
    pytest.param("ppocrv4-det.onnx", 1.0, marks=_SLOW),
    pytest.param("ultraface-rfb-320-opset9.onnx", 1.0, marks=_SLOW)])
def test_fusion_never_adds_kernels_and_cuts_a_fifth_on_transformers(model, max_ratio):
    # measured with our CPU schedules (the default build): bert-tiny 31 -> 27 kernels (0.87;
    # FastBoundedMath's softmax and erf kernels fuse into fewer unfused kernels than TVM's, 39
    # without schedules); the CNNs have no attention: equal
    from relax_memplan.frontend.prepare import STEP_NAMES

    mod, _ = import_onnx(shared_model(model), prepare_steps=STEP_NAMES)
    plain, fused = _kernel_calls(mod, False), _kernel_calls(mod, True)
    assert plain > 0 and fused <= max_ratio * plain, (model, plain, fused)


def test_identical_layers_build_their_kernel_once_and_different_specs_do_not_share(monkeypatch):
    """bert-tiny's two layers are one spec: one TVMScript build, one PrimFunc, two calls. A
    spec that differs in a plain field (the scale) or in an index (q read transposed) is not
    taken for it."""
    import dataclasses

    from relax_memplan.transform import _attention_kernel
    from relax_memplan.transform._attention_spec import Access

    built = []
    real = _attention_kernel.attention_kernel

    def counting(spec, *args):
        built.append(spec)
        return real(spec, *args)

    monkeypatch.setattr(_attention_kernel, "attention_kernel", counting)
    mod, _ = import_onnx(shared_model("bert-tiny-randw.onnx"), {"input_ids": (1, 32),
                                                                "attention_mask": (1, 32),
                                                                "token_type_ids": (1, 32)})
    pass_ = FuseAttention()
    after = pass_(mod)
    assert pass_.fused == 2 and len(built) == 1
    assert [gv.name_hint for gv, f in after.functions_items()
            if gv.name_hint.startswith("fused_attention")] == ["fused_attention"]
    assert len(re.findall(r"call_tir\(cls\.fused_attention\b", after.script())) == 2

    spec = built[0]
    plain, exprs = spec.fingerprint()

    def same(other):
        p, e = other.fingerprint()
        return p == plain and tvm_ffi.structural_equal(e, exprs, map_free_vars=True)

    assert same(dataclasses.replace(spec))
    assert not same(dataclasses.replace(spec, scale=spec.scale * 2))
    swapped = list(spec.q.index)
    swapped[-2], swapped[-1] = swapped[-1], swapped[-2]
    assert not same(dataclasses.replace(spec, q=Access(spec.q.input, swapped)))


@pytest.mark.parametrize("target, rows", [(None, 32), ({"kind": "llvm", "mcpu": "znver3"}, 16),
                                          ({"kind": "llvm", "mcpu": "haswell"}, 16),
                                          ({"kind": "llvm", "mcpu": "znver4"}, 32),
                                          ({"kind": "llvm", "mcpu": "skylake-avx512"}, 32),
                                          ("cuda", 32)])
def test_query_rows_per_task_follow_the_vector_registers(target, rows):
    """AVX2 (16 registers of 8 lanes) gets 16 query rows a task, so the register tiles do not
    spill; AVX-512, SSE (plain llvm) and CUDA 32; an explicit value is kept."""
    assert FuseAttention(target=target).block_queries == rows
    assert FuseAttention(block_queries=24, target=target).block_queries == 24
