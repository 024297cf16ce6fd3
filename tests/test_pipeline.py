"""The pipeline's phase lists: what runs before our fusion passes (compile time)."""

import tvm
from relax_memplan.pipeline import backend_phases, fusion_passes
from tests.transform.test_fold_constants_first import _Constant

LLVM = tvm.target.Target("llvm")


def _legalize_names(**kwargs):
    return [p.info.name for p in dict(backend_phases(LLVM, **kwargs))["legalize"]]


def test_constants_are_folded_once_before_the_fusion_passes():
    # the fusion passes' peak checks lower trial modules; a constant subgraph left unfolded was
    # evaluated again by FoldConstant in every one of them (gpt2-tiny: 1.9 CPU s each)
    names = _legalize_names(fusion=True)
    assert names[:3] == ["RefuseSelfDefiningCasts", "ClampEmptySlices", "FoldConstantsFirst"]
    fusion = [p.info.name for p in fusion_passes(LLVM)]
    assert names[3:3 + len(fusion)] == fusion
    # TVM's own FoldConstant still runs after LegalizeOps (what becomes foldable there)
    assert names.index("FoldConstant") > names.index("LegalizeOps")


def test_without_fusion_the_legalize_phase_keeps_tvms_order():
    names = _legalize_names(fusion=False)
    assert names.count("FoldConstant") == 1
    assert names.index("FoldConstant") > names.index("LegalizeOps")
    assert names[:2] == ["RefuseSelfDefiningCasts", "ClampEmptySlices"]


def test_the_fusion_passes_see_a_constant_subgraph_folded():
    seen = []

    @tvm.transform.module_pass(opt_level=0, name="Spy")
    def spy(mod, _ctx):
        seen.append(mod)
        return mod

    phases = backend_phases(LLVM, fusion=True, fusion_pass_list=[spy])
    with LLVM:
        tvm.transform.Sequential(dict(phases)["legalize"][:4])(_Constant)
    (body,) = seen[0]["main"].body.blocks[0].bindings
    assert isinstance(body.value.args[1], tvm.ir.GenericConst)



# The phases are written out in order (relax_memplan/pipeline/phases.py); these tests hold
# them to TVM's backend lists and to the options.

import pytest
from tvm.relax.backend.cpu_generic import pipeline as tvm_cpu
from tvm.relax.backend.cuda import pipeline as tvm_cuda

from relax_memplan.pipeline import (PipelineOptions, PipelinePasses, build_pipeline,
                                    format_pass_order, get_pipeline, pass_order)

CUDA = tvm.target.Target({"kind": "cuda", "arch": "sm_80"})
TVM_PHASES = ("library_dispatch_passes", "legalize_passes", "dataflow_lower_passes",
              "finalize_passes")


def _tvm_lists(backend, target):
    return [[p.info.name for p in getattr(backend, name)(target)] for name in TVM_PHASES]


@pytest.mark.parametrize("target, backend", [(LLVM, tvm_cpu), (CUDA, tvm_cuda)])
@pytest.mark.parametrize("options", [
    PipelineOptions(), PipelineOptions(planner="tvm"), PipelineOptions(schedule=False),
    PipelineOptions(fusion=False, dim_ranges={"n": (1, 8)}, dispatch={"n": (4,)})])
def test_without_our_passes_each_phase_is_tvms_backend_list(target, backend, options):
    """A TVM release that changes its backend lists fails here, not silently in a build."""
    tvm_names = set(sum(_tvm_lists(backend, target), []))
    # (on cuda, dlight's ApplyDefaultSchedule is ours with a guard, under the same name)
    ours = [[n for n in names if n in tvm_names] for _, names in pass_order(target, options)]
    assert ours == _tvm_lists(backend, target)


def test_pass_order_follows_the_options():
    names = lambda **kw: sum((n for _, n in pass_order(LLVM, PipelineOptions(**kw))), [])  # noqa
    default = names()
    assert {"CPUSchedule", "FastBoundedMath", "PlanStaticMemory", "HoistLoopStorage",
            "FuseAttention"} <= set(default)
    assert "CPUSchedule" not in names(schedule=False)
    assert not {"PlanStaticMemory", "HoistLoopStorage", "InsertDimRangeCheck"} & set(
        names(planner="tvm"))
    assert "FuseAttention" not in names(fusion=False)
    dims = names(dim_ranges={"n": (1, 8)})
    assert dims[0] == "AnnotateDimRanges"
    assert "PlanDynamicMemory" in dims and "PlanDynamicMemory" not in default
    assert dims.index("PlanDynamicMemory") < dims.index("PlanStaticMemory")
    text = format_pass_order(LLVM)
    assert "*  PlanStaticMemory" in text.replace("* ", "*  ") and "  StaticPlanBlockMemory" in text


def test_bad_options_are_refused_by_name():
    with pytest.raises(ValueError, match="unknown planner 'mine'"):
        PipelineOptions(planner="mine")
    with pytest.raises(ValueError, match="conv_chain must be one of"):
        PipelineOptions(fusion_conv_chain="sometimes")
    with pytest.raises(TypeError, match=r"unknown pipeline option\(s\) \['schedul'\]"):
        get_pipeline(LLVM, schedul=False)
    with pytest.raises(ValueError, match="target kind 'opencl' is not supported"):
        pass_order(tvm.target.Target("opencl"))


def test_build_pipeline_returns_what_its_passes_recorded():
    from tvm.script import relax as R

    @tvm.script.ir_module
    class Chain:
        @R.function
        def main(x: R.Tensor((16, 16), "float32")):
            with R.dataflow():
                a = R.exp(x)
                b = R.add(a, a)
                c = R.multiply(b, x)
                R.output(c)
            return c

    pipeline, passes = build_pipeline(LLVM, PipelineOptions(fusion=False))
    assert isinstance(passes, PipelinePasses) and passes.plan is not None
    tvm.compile(Chain, LLVM, relax_pipeline=pipeline)
    assert "main" in passes.plan.plans
    _, theirs = build_pipeline(LLVM, PipelineOptions(planner="tvm"))
    assert theirs.plan is None and theirs.hoist is None and theirs.fusion


def test_inspect_pipeline_prints_the_order_compile_runs(capsys):
    from relax_memplan.cli import EXIT_ERROR, main

    assert main(["inspect", "--pipeline"]) == 0
    out = capsys.readouterr().out
    lines = [line.split()[-1] for line in out.splitlines() if line.startswith("  ")]
    assert lines.index("PlanStaticMemory") < lines.index("StaticPlanBlockMemory")
    assert "ReorderForMemory" in lines and "CPUSchedule" in lines  # the config's defaults
    assert main(["inspect", "--pipeline", "--no-schedule", "--planner", "tvm"]) == 0
    plain = capsys.readouterr().out
    assert "CPUSchedule" not in plain and "PlanStaticMemory" not in plain
    assert main(["inspect", "--pipeline", "model.onnx"]) == EXIT_ERROR
    assert "takes no model" in capsys.readouterr().err
    assert main(["inspect", "--no-fusion", "model.onnx"]) == EXIT_ERROR
    assert "only with --pipeline" in capsys.readouterr().err


def test_inspect_pipeline_with_a_declared_dim_shows_the_dynamic_passes(capsys, tmp_path):
    from relax_memplan.cli import EXIT_ERROR, main

    assert main(["inspect", "--pipeline", "--dim", "seq=1..128"]) == 0
    names = [line.split()[-1] for line in capsys.readouterr().out.splitlines()
             if line.startswith("  ")]
    assert names.index("AnnotateDimRanges") < names.index("PlanDynamicMemory") \
        < names.index("PlanStaticMemory")
    assert main(["inspect", "--pipeline", "--dim", "seq=9..2"]) == EXIT_ERROR
    assert "bad dim spec 'seq=9..2'" in capsys.readouterr().err
    config = tmp_path / "c.yaml"
    config.write_text("dims:\n  seq: [1, 64]\nschedule: false\n")
    assert main(["inspect", "--pipeline", "--config", str(config)]) == 0
    out = capsys.readouterr().out
    assert "PlanDynamicMemory" in out and "CPUSchedule" not in out


def test_config_gives_the_pipeline_options_the_cli_and_python_api_use():
    from relax_memplan.config import Config

    config = Config(schedule=False, fusion_conv_chain="off", dims={"seq": (1, 64)},
                    dispatch={"seq": (32,)}, check_indices=False)
    options = config.pipeline_options("tvm")
    assert options == PipelineOptions(planner="tvm", schedule=False, fusion_conv_chain="off",
                                      check_indices=False, dim_ranges={"seq": (1, 64)},
                                      dispatch={"seq": (32,)})
    assert Config().pipeline_options() == PipelineOptions()
    with pytest.raises(ValueError, match="planner"):
        Config().pipeline_options("nobody")


def test_the_pass_orders_in_docs_are_the_printed_ones(capsys):
    """docs/pipeline.md shows the order for the defaults, --no-schedule, --dim and --target
    cuda: each block is what inspect --pipeline prints now (the CPU name in the first line
    is the machine's, left out)."""
    import re

    from relax_memplan.cli import main
    from tests.conftest import REPO_ROOT

    text = (REPO_ROOT / "docs" / "pipeline.md").read_text(encoding="utf-8")
    blocks = re.findall(r"```\nrelax_memplan pipeline for .*?\n(.*?)```", text, re.S)
    flags = [[], ["--no-schedule"], ["--dim", "seq=1..512"], ["--target", "cuda"]]
    assert len(blocks) == len(flags)
    for block, extra in zip(blocks, flags):
        assert main(["inspect", "--pipeline", *extra]) == 0
        printed = capsys.readouterr().out.split("\n", 1)[1]
        assert block.strip() == printed.strip(), extra


def test_declared_dims_alone_plan_the_symbolic_tensors_in_our_arena():
    """get_pipeline(dim_ranges=...) with no dynamic pass given still plans the tensors sized
    by the declared dim (the compile path and inspect --pipeline add PlanDynamicMemory too)."""
    import numpy as np
    from tvm import relax
    from tvm.script import relax as R

    @tvm.script.ir_module
    class Mod:
        @R.function
        def main(x: R.Tensor(("n", 64), "float32")) -> R.Tensor(("n", 64), "float32"):
            with R.dataflow():
                a = R.exp(x)
                b = R.multiply(a, a)
                c = R.add(b, x)
                R.output(c)
            return c

    built, passes = build_pipeline(LLVM, PipelineOptions(schedule=False, fusion=False,
                                                         dim_ranges={"n": (1, 16)}))
    ex = tvm.compile(Mod, LLVM, relax_pipeline=built)
    assert passes.dynamic is not None and passes.dynamic.plans, "nothing planned"
    vm = relax.VirtualMachine(ex, tvm.cpu())
    x = np.random.default_rng(0).standard_normal((5, 64)).astype("float32")
    got = vm["main"](tvm.runtime.tensor(x)).numpy()
    np.testing.assert_allclose(got, np.exp(x) ** 2 + x, rtol=1e-5)
