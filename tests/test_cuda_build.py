"""CUDA builds: every kernel is a GPU kernel, and our planner's arena works for a device.

No GPU is needed: TVM 0.27 generates CUDA C source for the kernels (loaded and
compiled only on a GPU host; ``benchmarks/gpu_check.py`` runs them there). The
checks here are what can go wrong before that:

* after our pipeline's legalize phase (dlight GPU schedules for CUDA), every
  PrimFunc that stores to a buffer does so under a ``blockIdx``/``threadIdx``
  binding -- a kernel without a GPU schedule would silently become host code;
* the built executable's imported ``cuda`` module has a ``__global__`` function
  for every such PrimFunc;
* our planner places the intermediates in one device arena (bert-tiny static
  and with symbolic ``batch``/``seq``, the built-in example CNN) without stopping
  ``RewriteCUDAGraph`` from capturing the kernels that use it;
* the CLI builds for ``--target cuda`` and writes its report, and
  ``benchmarks/gpu_check.py`` exits cleanly without a GPU and builds with ``--build-only``.
"""

import importlib.util
import json
import re
import sys

import pytest
import tvm
import tvm_ffi
from tvm import tirx
from tvm.script import ir as I
from tvm.script import relax as R

from relax_memplan import frontend
from relax_memplan.cli import main
from relax_memplan.compile import BuildOptions, CheckOptions, build, compile_and_measure
from relax_memplan.compile.measure import ModelSource
from relax_memplan.config import load_config
from relax_memplan.frontend.examples import example_cnn
from relax_memplan.frontend.prepare import STEP_NAMES
from relax_memplan.pipeline import PipelineOptions, PipelinePasses, backend_phases, get_pipeline
from relax_memplan.targets import DEFAULT_CUDA_ARCH, cuda_source, installed_cuda_arch
from relax_memplan.transform.plan_dynamic_memory import PlanDynamicMemory
from relax_memplan.transform.plan_static_memory import PlanStaticMemory
from tests.conftest import REPO_ROOT, shared_model

# TVM 0.27 rejects target strings with options; a plain "cuda" would guess sm_50 here.
CUDA = tvm.target.Target({"kind": "cuda", "arch": "sm_80"})
BERT = "bert-tiny-randw.onnx"
BERT_INPUTS = ("input_ids", "attention_mask", "token_type_ids")
TIME_LIMIT_S = 0.2  # offset search per arena: these models reach their lower bound at once
_GLOBAL_FUNC = re.compile(r"__global__\s+void\s+(?:__launch_bounds__\(\d+\)\s+)?(\w+)\s*\(")
_BINDING_TAG = re.compile(r"^(blockIdx|threadIdx)\.[xyz]$")


def _legalized(mod, **phase_kwargs):
    """``mod`` after our CUDA pipeline's phases up to and including ``legalize``."""
    with CUDA:
        for name, passes in backend_phases(CUDA, **phase_kwargs):
            if name == "dataflow_lower":
                break
            mod = tvm.transform.Sequential(passes, name=name)(mod)
    return mod


def _stores_outside_kernels(func: tirx.PrimFunc):
    """(number of buffer stores, names of buffers stored outside any GPU thread binding)."""
    depth, count, outside = [0], [0], []

    def on_for(loop, visitor):
        bound = loop.kind == tirx.ForKind.THREAD_BINDING and bool(
            _BINDING_TAG.match(str(loop.thread_binding.thread_tag)))
        depth[0] += bound
        visitor.default_visit(loop)
        depth[0] -= bound

    def on_store(store, visitor):
        count[0] += 1
        if depth[0] == 0:
            outside.append(store.buffer.name)
        visitor.default_visit(store)

    tvm_ffi.structural_visit(func.body, [(tirx.For, on_for), (tirx.BufferStore, on_store)])
    return count[0], outside


def _check_all_kernels_bound(mod):
    """Names of the PrimFuncs that do work; fails naming any with host-side stores."""
    working, unbound = [], {}
    for gv, func in mod.functions_items():
        if not isinstance(func, tirx.PrimFunc):
            continue
        stores, outside = _stores_outside_kernels(func)
        if stores:
            working.append(gv.name_hint)
        if outside:
            unbound[gv.name_hint] = sorted(set(outside))
    assert working, "no PrimFunc does any work: the legalize phase did not run"
    assert not unbound, f"kernels left as host code (stores outside blockIdx/threadIdx): {unbound}"
    return working


def _cuda_source(executable) -> str:
    """CUDA C source of the executable's imported device module."""
    source = cuda_source(executable)
    assert source, "the executable imports no cuda module"
    return source


def _check_global_kernels(executable, prim_funcs):
    kernels = set(_GLOBAL_FUNC.findall(_cuda_source(executable)))
    missing = [n for n in prim_funcs
               if not any(k == f"{n}_kernel" or k.startswith(f"{n}_kernel_") for k in kernels)]
    assert not missing, f"no __global__ kernel for {missing}; kernels: {sorted(kernels)}"


def _plan_pass():
    return PlanStaticMemory(time_limit_s=TIME_LIMIT_S)


def _compile_module(mod):
    """Our build of a fixed-shape Relax module for CUDA with its report (nothing run)."""
    options = BuildOptions(target=CUDA, plan_pass=_plan_pass(), compare_with_tvm=False)
    return compile_and_measure(ModelSource(mod=mod), {}, [{}], options,
                               CheckOptions(measure=False), lambda _msg: None)["static"]


def _bert_shapes(seq):
    return {name: (1, seq) for name in BERT_INPUTS}


def test_example_cnn_builds_gpu_kernels_and_a_device_arena():
    mod, _ = frontend.import_onnx(example_cnn())
    working = _check_all_kernels_bound(_legalized(mod))
    assert any(n.startswith("fused_conv2d") for n in working)
    result = _compile_module(mod)
    _check_global_kernels(result.executable, working)
    main_plan = result.report.main
    assert result.report.target == "cuda"
    assert main_plan.num_planned == main_plan.num_tensors - 1  # all but the output
    assert main_plan.lower_bound_bytes <= main_plan.arena_bytes


def test_bert_tiny_static_builds_gpu_kernels_and_a_device_arena():
    path = shared_model(BERT)
    mod, _ = frontend.import_onnx(path, _bert_shapes(16), prepare_steps=STEP_NAMES)
    working = _check_all_kernels_bound(_legalized(mod))
    assert any(n.startswith("fused_matmul") for n in working)
    result = _compile_module(mod)
    _check_global_kernels(result.executable, working)
    main_plan = result.report.main
    assert main_plan.num_planned == main_plan.num_tensors - 1  # all but the output
    assert main_plan.lower_bound_bytes <= main_plan.arena_bytes


def test_bert_tiny_dynamic_dims_build_gpu_kernels_and_a_device_arena_at_the_bounds():
    # upper_bound: tensors of symbolic shape at constant offsets in one arena. The exact
    # strategy (symbolic offsets, computed on the host by VMShapeLower) builds for CUDA too,
    # but its shape sampling takes ~15 s of CPU here; benchmarks/gpu_check.py runs it.
    path = shared_model(BERT)
    mod, _ = frontend.import_onnx(path, keep_dynamic=True, prepare_steps=STEP_NAMES)
    ranges = {"batch": (1, 2), "seq": (1, 128)}
    working = _check_all_kernels_bound(_legalized(mod, dim_ranges=ranges))
    dyn = PlanDynamicMemory(strategy="upper_bound", time_limit_s=TIME_LIMIT_S)
    ex = build(mod, CUDA, PipelineOptions(dim_ranges=ranges),
               PipelinePasses(plan=_plan_pass(), dynamic=dyn))
    _check_global_kernels(ex, working)
    plan = dyn.plans["main"]
    assert plan.planned, plan.fallback_reason
    arena_small, lower_small, _ = plan.bytes_at({"batch": 1, "seq": 16})
    arena_big, lower_big, _ = plan.bytes_at({"batch": 2, "seq": 128})
    assert arena_small == arena_big  # one constant arena, sized at the bounds
    assert lower_small < lower_big <= arena_big


def test_bert_tiny_seq1_builds_gpu_kernels_with_both_planners():
    # dlight's GEMV rule asserts on the attention matmul(probs, V) when the reduction (seq)
    # has length 1; our pipeline's GPU rules then fall through to the next rule.
    path = shared_model(BERT)
    mod, _ = frontend.import_onnx(path, _bert_shapes(1), prepare_steps=STEP_NAMES)
    working = _check_all_kernels_bound(_legalized(mod))
    for planner, plan_pass in (("relax_memplan", _plan_pass()), ("tvm", None)):
        ex = build(mod, CUDA, PipelineOptions(planner=planner), PipelinePasses(plan=plan_pass))
        _check_global_kernels(ex, working)


def test_bert_tiny_dynamic_with_dispatch_builds_gpu_kernels():
    # SpecializeKernels leaves reshape/copy kernels alone (RewriteDataflowReshape must still
    # recognise them) and specializes matmul/softmax/layer norm, each branch a GPU kernel.
    from relax_memplan.transform.specialize_kernels import (  # pylint: disable=import-outside-toplevel
        SpecializeKernels,
        backend_schedule,
    )

    path = shared_model(BERT)
    mod, _ = frontend.import_onnx(path, keep_dynamic=True)
    ranges = {"batch": (1, 2), "seq": (1, 128)}
    dispatch = SpecializeKernels({"seq": [32, 128]}, schedule=backend_schedule(CUDA))
    # without our fusion (its attention kernel is not specialized: see the fused test below)
    working = _check_all_kernels_bound(_legalized(mod, dim_ranges=ranges, dispatch_pass=dispatch,
                                                  fusion=False))
    assert any(k.startswith("softmax") for k in dispatch.specialized)
    assert not any(k.startswith("reshape") for k in dispatch.specialized)
    ex = build(mod, CUDA, PipelineOptions(dim_ranges=ranges, dispatch={"seq": (32, 128)},
                                          fusion=False), PipelinePasses(plan=_plan_pass()))
    _check_global_kernels(ex, working)


@I.ir_module
class MatmulChain:
    @R.function
    def main(x: R.Tensor((64, 64), "float32")) -> R.Tensor((64, 64), "float32"):
        with R.dataflow():
            a = R.matmul(x, x)
            b = R.matmul(a, a)
            c = R.matmul(b, a)  # a and b live together: one of them is at a non-zero offset
            d = R.matmul(c, x)
            R.output(d)
        return d


def _cuda_graph_captured_kernels(planner):
    """Kernel calls inside ``main``'s CUDA graph capture function (none if not captured)."""
    plan_pass = _plan_pass() if planner == "relax_memplan" else None
    with tvm.transform.PassContext(config={"relax.backend.use_cuda_graph": True}):
        mod = get_pipeline(CUDA, planner=planner, plan_pass=plan_pass)(MatmulChain)
    names = {gv.name_hint for gv in mod.get_global_vars()}
    if "main_cuda_graph_capture" not in names:
        return 0, ""
    capture = mod["main_cuda_graph_capture"].script()
    return capture.count("matmul("), capture


def test_arena_views_keep_cuda_graph_capture():
    # RewriteCUDAGraph ends a capture region at any vm.builtin.* call; our views are the
    # R.memory.ensure_zero_offset op (lowered later), so the kernels are still captured:
    # the two in the middle, as with TVM's planner (the first and last read the input x).
    ours, capture = _cuda_graph_captured_kernels("relax_memplan")
    theirs, _ = _cuda_graph_captured_kernels("tvm")
    assert ours == theirs == 2
    assert "ensure_zero_offset" in capture


def test_cli_compile_target_cuda_writes_a_report(tmp_path, capsys):
    report_path = tmp_path / "cuda.json"
    status = main(["compile", "--target", "cuda", "--no-measure", "-q", "--time-limit", "0.2",
                   "--report", str(report_path)])
    assert status == 0
    installed = installed_cuda_arch()
    arch = installed or DEFAULT_CUDA_ARCH  # no GPU here: the documented default
    out = capsys.readouterr().out
    assert f"target cuda ({arch})" in out
    if installed is None:
        assert (f"built for cuda {arch} (the default: no CUDA GPU here; set --cuda-arch), not "
                "run: no CUDA device was found here (checked: tvm.cuda(0).exist is false), so "
                "the build was compiled only; the arena and lower bound come from the plan; for "
                "run-time bytes and verification compile with --target llvm") in out
    else:
        assert "not run: compile runs and verifies CPU builds only" in out
    report = json.loads(report_path.read_text())
    assert report["target"] == "cuda" and report["arch"] == arch
    assert report["runtime_alloc_bytes"] is None  # built only: nothing ran
    assert 0 < report["lower_bound_bytes"] <= report["arena_bytes"] <= report["tvm_default_bytes"]


def test_cuda_yaml_is_a_cuda_config():
    config = load_config(REPO_ROOT / "configs" / "cuda.yaml")
    assert config.target == "cuda"
    assert config.planner.alignment_bytes == 256
    assert config.dims == {}


def test_cli_refuses_verify_for_cuda(capsys):
    assert main(["compile", "--target", "cuda", "--verify", "-q"]) == 1
    assert "--verify" in capsys.readouterr().err


def _gpu_check():
    """benchmarks/gpu_check.py as a module (benchmarks/ is not a package)."""
    if "gpu_check" not in sys.modules:
        path = REPO_ROOT / "benchmarks" / "gpu_check.py"
        spec = importlib.util.spec_from_file_location("gpu_check", path)
        module = importlib.util.module_from_spec(spec)
        sys.modules["gpu_check"] = module  # its dataclasses look their module up there
        spec.loader.exec_module(module)
    return sys.modules["gpu_check"]


@pytest.mark.skipif(tvm.cuda(0).exist, reason="a GPU is present: gpu_check would run")
def test_gpu_check_exits_cleanly_without_a_gpu(capsys, tmp_path):
    assert _gpu_check().main(["--json", str(tmp_path / "g.json")]) == 0
    assert "no CUDA GPU" in capsys.readouterr().out
    assert not (tmp_path / "g.json").exists()


def test_gpu_check_builds_bert_both_ways_without_a_gpu(tmp_path):
    shared_model(BERT)
    out = tmp_path / "gpu_check.json"
    gpu_check = _gpu_check()
    assert gpu_check.main(["--build-only", "--cases", "bert", "--arch", "sm_80",
                           "--models", str(REPO_ROOT.parent / "shared" / "models"),
                           "--json", str(out)]) == 0
    rows = json.loads(out.read_text())["rows"]
    assert [r["planner"] for r in rows] == ["relax_memplan", "tvm"]
    ours, theirs = rows
    assert not ours["error"] and not theirs["error"]
    assert ours["lower_bound_bytes"] <= ours["planned_bytes"] < theirs["planned_bytes"]
    assert ours["median_ms"] is None  # nothing ran


def test_source_scan_sees_every_kernel():
    # guards the regex the kernel checks rely on
    text = ('extern "C" __global__ void __launch_bounds__(256) fused_add_kernel(float* a) {}\n'
            'extern "C" __global__ void mean_kernel_1(float* a);')
    assert set(_GLOBAL_FUNC.findall(text)) == {"fused_add_kernel", "mean_kernel_1"}
    assert all(_BINDING_TAG.match(t) for t in ("blockIdx.x", "threadIdx.z"))
    assert not _BINDING_TAG.match("vthread.x")


# -- the fused attention kernel (FuseAttention with its CUDA schedule)
CUDA_SM90 = tvm.target.Target({"kind": "cuda", "arch": "sm_90"})
_SM90_LIMITS = {"max_shared_memory_per_block": 49152, "max_threads_per_block": 1024,
                "max_thread_x": 1024, "max_thread_y": 1024, "max_thread_z": 64,
                "max_local_memory_per_block": 2**31 - 1}


@pytest.mark.parametrize("model, full_build", [("bert-tiny-randw.onnx", True),
                                               ("gpt2-tiny-randw.onnx", False)])
def test_fused_attention_is_a_global_kernel_with_thread_bindings(model, full_build):
    mod, _ = frontend.import_onnx(shared_model(model), keep_dynamic=True)
    with CUDA_SM90:
        legal = _legalized(mod, fusion=True)
    attention = [f for gv, f in legal.functions_items() if gv.name_hint == "fused_attention"]
    assert len(attention) == 1 and attention[0].attrs["tirx.is_scheduled"]
    assert "softmax" not in str([gv.name_hint for gv in legal.get_global_vars()])
    _check_all_kernels_bound(legal)  # also the fused kernel: no host-side stores
    assert legal.script().count("R.call_tir(cls.fused_attention") == 2  # 2 layers each
    if not full_build:  # the same kernel builder; one full CUDA build is enough
        return
    batch, seq = (str(d) for d in mod["main"].params[0].ty.shape.values)
    executable = build(mod, CUDA_SM90, PipelineOptions(dim_ranges={batch: (1, 2), seq: (1, 128)}),
                       PipelinePasses(plan=_plan_pass()))
    _check_global_kernels(executable, ["fused_attention"])
    source = _cuda_source(executable)
    kernel = source[source.rindex("fused_attention_kernel("):]
    assert "threadIdx.x" in kernel and "blockIdx.x" in kernel and "__shared__" in kernel
    assert "__syncthreads()" in kernel


def _attention_forms():
    from tests.transform import attention_models as forms

    return {"sdpa": forms.bert_sdpa(2, 13), "causal": forms.gpt2_causal(1, 20),
            "in_proj": forms.vit_in_proj(1, 11), "gqa": forms.llama_gqa(1, 9),
            "cross": forms.cross_attention(2, 3), "relative": forms.t5_relative_bias(1, 12),
            "windows": forms.swin_windows(1), "boolean": forms.boolean_mask(1, 10),
            "contrib": forms.contrib_attention(1, 7), "dim80": forms.bert_sdpa(1, 9, dim=80)}


_QUICK_FORMS = ("sdpa", "gqa", "windows")  # the others behind slow: ~30 s each under load


@pytest.mark.parametrize("form", [f if f in _QUICK_FORMS else pytest.param(f, marks=pytest.mark.slow)
                                  for f in sorted(_attention_forms())])
def test_fused_attention_cuda_kernel_of_every_form_passes_verify_gpu_code(form):
    # each matched form's CUDA kernel (static shapes): well-formed, within sm_90's limits, and
    # compiled to CUDA C with its thread bindings and shared-memory tiles
    from tvm.s_tir.analysis import verify_gpu_code, verify_well_formed
    from tvm.s_tir.pipeline import default_s_tir_pipeline

    from relax_memplan.transform.fuse_attention import FuseAttention

    model, feeds = _attention_forms()[form]
    mod, _ = frontend.import_onnx(model, {n: v.shape for n, v in feeds.items()})
    pass_ = FuseAttention(target=CUDA_SM90)
    fused = pass_(mod)
    assert pass_.fused == 1, pass_.records[0].refused
    (func,) = [f for gv, f in fused.functions_items() if gv.name_hint == "fused_attention"]
    assert verify_well_formed(func)
    kernel = tvm.IRModule({"main": func.with_attr("target", CUDA_SM90)
                           .with_attr("global_symbol", "main")})
    with CUDA_SM90:
        lowered = default_s_tir_pipeline()[0](kernel)["main"]
    assert verify_gpu_code(lowered, _SM90_LIMITS)
    # the verifier can fail: K/V tiles of 16 keys take 2 KB and more, 32 threads per block
    assert not verify_gpu_code(lowered, {**_SM90_LIMITS, "max_shared_memory_per_block": 1024})
    assert not verify_gpu_code(lowered, {**_SM90_LIMITS, "max_threads_per_block": 16})
    source = _cuda_source(tvm.compile(kernel, CUDA_SM90))
    assert "__global__" in source and "__shared__" in source and "__syncthreads()" in source


def test_gpu_check_attention_builds_fused_and_unfused_without_a_gpu(tmp_path):
    shared_model(BERT)
    out = tmp_path / "gpu_check.json"
    assert _gpu_check().main(["--build-only", "--cases", "attention", "--arch", "sm_90",
                              "--attention-models", "bert-tiny",
                              "--models", str(REPO_ROOT.parent / "shared" / "models"),
                              "--json", str(out)]) == 0
    rows = json.loads(out.read_text())["attention_rows"]
    assert {(r["build"], r["seq"]) for r in rows} == {
        ("fused static", 77), ("unfused static", 77)} | {
        (f"{f} symbolic", s) for f in ("fused", "unfused") for s in (1, 77, 128)}
    assert not any(r["error"] for r in rows)
    assert all(r["max_rel_error"] is None for r in rows)  # nothing ran


def test_gpu_check_attention_tolerance_fails_a_wrong_value():
    gpu_attention = _gpu_check().check_attention.__module__
    row_type = sys.modules[gpu_attention].AttentionRow
    fmt = sys.modules[gpu_attention].format_attention
    assert row_type("m", "fused static", 77, max_rel_error=9e-5).verified is True
    assert row_type("m", "fused static", 77, max_rel_error=2e-4).verified is False
    assert row_type("m", "unfused static", 77, max_rel_error=2e-4).verified is None
    text = fmt([row_type("m", "fused symbolic", 1, error="run failed: boom")])
    assert "FAILED: m fused symbolic seq 1: run failed: boom" in text


def test_fused_attention_composes_with_dispatch_buckets_on_cuda():
    # SpecializeKernels skips the fused kernel (already scheduled, stays symbolic) and
    # specializes the rest; every kernel, the fused one included, stays a GPU kernel
    from relax_memplan.transform.specialize_kernels import SpecializeKernels, backend_schedule

    mod, _ = frontend.import_onnx(shared_model(BERT), keep_dynamic=True)
    dispatch = SpecializeKernels({"seq": [32, 128]}, schedule=backend_schedule(CUDA_SM90))
    with CUDA_SM90:
        legal = _legalized(mod, dim_ranges={"batch": (1, 2), "seq": (1, 128)},
                           dispatch_pass=dispatch, fusion=True)
    working = _check_all_kernels_bound(legal)
    assert "fused_attention" in working and "fused_attention" not in dispatch.specialized
    assert dispatch.specialized and not any(k.startswith("softmax") for k in working)


@I.ir_module
class ResidualLayerNorm:
    @R.function
    def main(p: R.Tensor(("n", 16, 768), "float32"), q: R.Tensor(("n", 16, 768), "float32"),
             g: R.Tensor((768,), "float32"), b: R.Tensor((768,), "float32")):
        with R.dataflow():
            x = R.nn.softmax(p, axis=-1)
            s = R.add(x, q)
            y = R.nn.layer_norm(s, g, b, axes=[-1], epsilon=1e-5)
            R.output(y)
        return y


def test_fused_add_layer_norm_builds_a_gpu_kernel_for_sm90():
    # our fusion passes for cuda: FuseAddLayerNorm's compute kernel, scheduled by dlight
    # (a block per row, the reductions across threads as warp shuffles)
    from relax_memplan.pipeline import fusion_counts, fusion_passes  # pylint: disable=import-outside-toplevel

    sm90 = tvm.target.Target({"kind": "cuda", "arch": "sm_90"})
    passes = fusion_passes(sm90)
    with sm90:
        legal = ResidualLayerNorm
        for name, phase in backend_phases(sm90, fusion=True, fusion_pass_list=passes):
            if name == "dataflow_lower":
                break
            legal = tvm.transform.Sequential(phase, name=name)(legal)
    assert fusion_counts(passes) == {"attention": 0, "dropout": 0, "layer_norm": 0,
                                     "rms_norm": 0, "add_layer_norm": 1, "add_rms_norm": 0,
                                     "matmul_reshape": 0, "feed_forward_chunked": 0}
    records = {r.name: r for p in passes for r in p.records}
    assert (records["add_layer_norm"].candidates, records["add_layer_norm"].fused) == (1, 1)
    working = _check_all_kernels_bound(legal)
    fused = [n for n in working if "add_layer_norm" in n]
    assert fused, working
    ex = build(ResidualLayerNorm, sm90, PipelineOptions(), PipelinePasses(plan=_plan_pass()))
    _check_global_kernels(ex, fused)
    source = _cuda_source(ex)
    kernels = set(_GLOBAL_FUNC.findall(source))
    assert {k for k in kernels if k.startswith("add_layer_norm")} == {"add_layer_norm_kernel"}
    body = source[source.index("add_layer_norm_kernel(float"):]
    body = body[:body.index("\n}\n")]
    assert "__shfl_down_sync" in body and "blockIdx.x" in body  # a block per row, warp sums


@I.ir_module
class ResidualRmsNorm:
    @R.function
    def main(p: R.Tensor(("n", 16, 768), "float32"), q: R.Tensor(("n", 16, 768), "float32"),
             w: R.Tensor((768,), "float32")):
        with R.dataflow():
            x = R.nn.softmax(p, axis=-1)
            s = R.add(x, q)
            ms = R.mean(R.power(s, R.const(2.0, "float32")), axis=[-1], keepdims=True)
            r = R.divide(R.const(1.0, "float32"), R.sqrt(R.add(ms, R.const(1e-6, "float32"))))
            y = R.multiply(w, R.multiply(s, r))
            R.output(y)
        return y


def test_fused_add_rms_norm_builds_a_gpu_kernel_for_sm90():
    # Llama's RMS norm steps become rms_norm (FuseNormalization), then one kernel with the
    # residual add (FuseAddLayerNorm's compute), scheduled by dlight as a block per row
    from relax_memplan.pipeline import fusion_counts, fusion_passes  # pylint: disable=import-outside-toplevel

    sm90 = tvm.target.Target({"kind": "cuda", "arch": "sm_90"})
    passes = fusion_passes(sm90)
    ex = build(ResidualRmsNorm, sm90, PipelineOptions(),
               PipelinePasses(plan=_plan_pass(), fusion=passes))
    counts = fusion_counts(passes)
    assert (counts["rms_norm"], counts["add_rms_norm"]) == (1, 1)
    source = _cuda_source(ex)
    kernels = set(_GLOBAL_FUNC.findall(source))
    assert {k for k in kernels if k.startswith("add_rms_norm")} == {"add_rms_norm_kernel"}
    body = source[source.index("add_rms_norm_kernel(float"):]
    body = body[:body.index("\n}\n")]
    assert "__shfl_down_sync" in body and "blockIdx.x" in body  # a block per row, warp sums


def test_cuda_leaves_a_pair_apart_when_the_sum_is_read_again():
    # dlight's fallback would make the compute with a 2nd output 4 kernels: no gain
    from relax_memplan.transform.fuse_add_layer_norm import FuseAddLayerNorm  # pylint: disable=import-outside-toplevel

    @I.ir_module
    class SumReadAgain:
        @R.function
        def main(p: R.Tensor(("n", 768), "float32"), q: R.Tensor(("n", 768), "float32"),
                 g: R.Tensor((768,), "float32"), b: R.Tensor((768,), "float32")):
            with R.dataflow():
                x = R.nn.softmax(p, axis=-1)
                s = R.add(x, q)
                y = R.nn.layer_norm(s, g, b, axes=[-1], epsilon=1e-5)
                out = (y, s)
                R.output(out)
            return out

    pass_ = FuseAddLayerNorm(kernel="compute", target=CUDA)
    pass_(SumReadAgain)
    assert pass_.fused == 0 and pass_.skipped == {"sum_output": 1}


def test_gpu_check_layernorm_kernel_builds_without_a_gpu():
    say = lambda _msg: None  # noqa: E731
    sm90 = tvm.target.Target({"kind": "cuda", "arch": "sm_90"})
    row = _gpu_check().check_layernorm_kernel(sm90, tvm.cuda(0), False, 1, 1, say)
    assert row.case == "add+LN kernel 1024x768" and row.error is None and row.median_ms is None


@pytest.mark.slow  # two CUDA builds of gpt2-tiny: about a minute on 2 shared cores
def test_gpu_check_layernorm_case_builds_without_a_gpu(tmp_path):
    shared_model("gpt2-tiny-randw.onnx")
    out = tmp_path / "gpu_check.json"
    assert _gpu_check().main(["--build-only", "--cases", "layernorm", "--arch", "sm_90",
                              "--models", str(REPO_ROOT.parent / "shared" / "models"),
                              "--json", str(out)]) == 0
    rows = json.loads(out.read_text())["rows"]
    assert [(r["case"], r["planner"]) for r in rows] == [
        ("add+LN kernel 1024x768", "relax_memplan"),
        ("gpt2-tiny fused b1 s16", "relax_memplan"), ("gpt2-tiny fused b1 s16", "tvm")]
    assert not any(r["error"] for r in rows)
    assert all(r["median_ms"] is None for r in rows)  # nothing ran


def test_gpu_check_a_failing_check_prints_failed_and_the_others_run(tmp_path, capsys,
                                                                    monkeypatch):
    gpu_check = _gpu_check()

    def broken(*_args):
        raise RuntimeError("kernel exploded")

    monkeypatch.setitem(gpu_check.EXTRA_CHECKS, "layernorm", broken)
    monkeypatch.setitem(gpu_check.CASES, "layernorm", gpu_check.Case("example again", None))
    out = tmp_path / "g.json"
    assert gpu_check.main(["--build-only", "--cases", "layernorm", "--arch", "sm_90",
                           "--json", str(out)]) == gpu_check.EXIT_FAILED
    assert "FAILED layernorm: RuntimeError: kernel exploded" in capsys.readouterr().out
    rows = json.loads(out.read_text())["rows"]
    assert [r["case"] for r in rows] == ["layernorm", "example again", "example again"]
    assert rows[0]["error"].startswith("FAILED") and not rows[1]["error"]


def test_gpu_check_tolerance_flags_a_wrong_value():
    row = _gpu_check().Row("c", "p", max_abs_error=2e-3, error_tolerance=1e-3)
    assert row.verified is False
    assert _gpu_check().Row("c", "p", max_abs_error=1e-4, error_tolerance=1e-3).verified


def test_chunked_feed_forward_builds_gpu_kernels():
    """ChunkFeedForward on the BERT case (batch 4, seq 32, thresholds 0 and 1 row): the slices, the
    per-chunk matmuls and the concat all get GPU schedules (dlight), none left as host code."""
    from relax_memplan.pipeline import fusion_counts, fusion_passes  # pylint: disable=import-outside-toplevel
    from relax_memplan.transform.chunk_feed_forward import ChunkFeedForward  # pylint: disable=import-outside-toplevel

    spec = importlib.util.spec_from_file_location("bert_case",
                                                  REPO_ROOT / "benchmarks" / "bert_case.py")
    bert_case = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(bert_case)
    mod, _ = frontend.import_onnx(bert_case.build_bert(64, 1, 2, 256), {
        "hidden_states": (4, 32, 64), "attention_mask": (4, 1, 1, 32)})
    passes = [p for p in fusion_passes(CUDA) if p.info.name != "ChunkFeedForward"] + \
        [ChunkFeedForward(min_hidden_bytes=0, min_chunk_rows=1, target=CUDA)]
    legal = _legalized(mod, fusion=True, fusion_pass_list=passes)
    assert fusion_counts(passes)["feed_forward_chunked"] == 1
    working = _check_all_kernels_bound(legal)
    assert any("concat" in n for n in working), working
    passes = passes[:-1] + [ChunkFeedForward(min_hidden_bytes=0, min_chunk_rows=1, target=CUDA)]
    executable = tvm.compile(mod, CUDA, relax_pipeline=get_pipeline(
        CUDA, fusion=True, fusion_pass_list=passes))
    assert fusion_counts(passes)["feed_forward_chunked"] == 1
    _check_global_kernels(executable, working)
