"""The one compile path: a fixed shape is the one-row case; several strategies share one
import, one TVM build and the same inputs."""

from relax_memplan import frontend
from relax_memplan.compile import BuildOptions, CheckOptions, compile_model, compile_strategies
import relax_memplan.compile.model as model_module
from tests.conftest import mlp_model


TWO = BuildOptions(strategies=("upper_bound", "exact"))


def test_fixed_shape_is_one_row_with_the_static_plan():
    result = compile_model(mlp_model(), {"x": (3, 16)}, check=CheckOptions(verify=True))
    report = result.report
    assert report.strategy == "static" and report.is_static
    [row] = report.shapes
    assert row.dims == {} and row.verified
    assert (row.arena_bytes, row.lower_bound_bytes) == (report.main.arena_bytes,
                                                        report.main.lower_bound_bytes)
    assert report.main.runtime_alloc_bytes == row.runtime_alloc_bytes
    assert report.inputs == {"x": {"shape": [3, 16], "dtype": "float32"}}


def test_strategies_share_one_import_one_tvm_build_and_the_inputs(monkeypatch):
    imports, builds = [], []
    real_import, real_build = frontend.import_onnx, model_module.build
    monkeypatch.setattr(frontend, "import_onnx", lambda *a, **k: imports.append(1) or real_import(*a, **k))
    monkeypatch.setattr(model_module, "build", lambda mod, tgt, options, *a, **k:
                        builds.append(options.planner) or real_build(mod, tgt, options, *a, **k))
    results = compile_strategies(mlp_model(), None, {"n": (1, 6)}, options=TWO,
                                 check=CheckOptions(verify=True, sample_shapes=3))
    assert list(results) == ["upper_bound", "exact"]
    assert len(imports) == 1 and sorted(builds) == ["relax_memplan", "relax_memplan", "tvm"]
    upper, exact = (results[s].report for s in ("upper_bound", "exact"))
    assert [r.dims for r in upper.shapes] == [r.dims for r in exact.shapes] == [
        {"n": 1}, {"n": 6}, {"n": upper.shapes[2].dims["n"]}]
    for u, e in zip(upper.shapes, exact.shapes):
        assert u.tvm_default_runtime_alloc_bytes == e.tvm_default_runtime_alloc_bytes is not None
        assert u.verified and e.verified
        assert e.lower_bound_bytes <= e.arena_bytes <= u.arena_bytes


def test_report_names_an_in_memory_model_by_its_graph_not_its_text():
    """Tutorial 04: a ModelProto given to compile_model put its whole text (every node and
    weight) in the report's first line."""
    from relax_memplan.report.text import format_report

    result = compile_model(mlp_model(), {"x": (2, 16)}, check=CheckOptions(measure=False))
    assert result.report.model == "graph 'mlp' (onnx.ModelProto)"
    first = format_report(result.report).splitlines()[0]
    assert first.endswith("graph 'mlp' (onnx.ModelProto)") and "node {" not in first


def test_tvm_comparison_build_gets_the_same_fusion_passes_as_ours(monkeypatch):
    """TVM's comparison build ran the default fusion list (conv chains ``auto`` without
    schedules) whatever the build's ``fusion_conv_chain``/``schedule``: with ``off`` ours fused
    no conv chain while TVM's did, so the kernels (and TVM's bytes) differed."""
    seen = {}
    real_build = model_module.build

    def recording(mod, tgt, options, passes, *a, **k):
        seen[options.planner] = [p.info.name for p in passes.fusion or []]
        return real_build(mod, tgt, options, passes, *a, **k)

    monkeypatch.setattr(model_module, "build", recording)
    compile_model(mlp_model(), {"x": (3, 16)}, options=BuildOptions(fusion_conv_chain="off"),
                  check=CheckOptions(measure=False))
    assert seen["tvm"] == seen["relax_memplan"] and "FuseConvChain" not in seen["tvm"]
    assert "FuseAttention" in seen["tvm"]
