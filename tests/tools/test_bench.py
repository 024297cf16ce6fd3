"""relax-memplan bench: ours vs TVM's default build vs onnxruntime, interleaved, as a table."""

import json

import pytest
from onnx import TensorProto, helper

from relax_memplan.cli import main
from relax_memplan.tools.bench import bench_onnx


def _model():
    graph = helper.make_graph(
        [helper.make_node("Relu", ["x"], ["r"]), helper.make_node("Exp", ["r"], ["e"]),
         helper.make_node("Add", ["e", "r"], ["y"])], "g",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["n", 64])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, ["n", 64])])
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])


def test_bench_times_three_runners_the_same_number_of_calls():
    pytest.importorskip("onnxruntime")
    result = bench_onnx(_model(), {"x": (4, 64)}, repeat=3, warmup=1)
    assert [r.name for r in result.rows] == ["relax_memplan", "TVM default", "onnxruntime"]
    assert all(len(r.times_ms) == 3 and 0 < r.min_ms <= r.median_ms <= r.max_ms
               for r in result.rows)
    assert result.input_shapes == {"x": [4, 64]}
    assert "median / ours" in result.format_text()
    # regression: a model given in memory was named by its whole proto text
    assert result.model == "graph 'g' (onnx.ModelProto)"


def test_bench_rejects_a_repeat_below_one():
    with pytest.raises(ValueError, match="repeat must be >= 1"):
        bench_onnx(_model(), repeat=0)


def test_bench_refuses_a_dim_no_shape_fixes_before_the_import(monkeypatch):
    """No silent size 1: bench timed n at 1 when no --shape fixed it."""
    from relax_memplan import frontend
    from relax_memplan.errors import UndeclaredDimError

    real_import = frontend.import_onnx

    def no_fixed_import(*args, **kwargs):  # the suggestions' checks import with symbolic dims
        assert kwargs.get("keep_dynamic"), "imported at a guessed shape"
        return real_import(*args, **kwargs)

    monkeypatch.setattr(frontend, "import_onnx", no_fixed_import)
    with pytest.raises(UndeclaredDimError) as info:
        bench_onnx(_model())
    assert str(info.value) == ("symbolic dim(s) n (axis 0 of x) not declared and bench does not "
                               "guess a size: fix them with --shape x=1,64 (placeholders: set "
                               "them to the sizes you will run)")


def test_cli_bench_prints_a_table_and_writes_json(tmp_path, capsys):
    path = tmp_path / "m.onnx"
    path.write_bytes(_model().SerializeToString())
    out = tmp_path / "t.json"
    assert main(["bench", str(path), "--shape", "x=2,64", "--repeat", "2", "--warmup", "0",
                 "--no-onnxruntime", "-q", "--json", str(out)]) == 0
    text = capsys.readouterr().out
    assert "relax_memplan" in text and "TVM default" in text and "onnxruntime" not in text
    assert [r["name"] for r in json.loads(out.read_text())["rows"]] == ["relax_memplan", "TVM default"]
    with pytest.raises(SystemExit):
        main(["bench", str(path), "--repeat", "0"])


def test_cli_bench_schedule_builds_both_with_our_schedules(tmp_path, capsys, monkeypatch):
    """Regression: bench could not time the scheduled build docs/benchmarks.md's latency table
    describes; --schedule gives both TVM builds our CPU schedules for the host CPU."""
    import relax_memplan.compile as compile_pkg

    seen = []
    real = compile_pkg.build

    def recording_build(mod, target, options, *args, **kw):
        seen.append((options.planner, str(target), options.schedule))
        return real(mod, target, options, *args, **kw)

    monkeypatch.setattr(compile_pkg, "build", recording_build)
    path = tmp_path / "m.onnx"
    path.write_bytes(_model().SerializeToString())
    assert main(["bench", str(path), "--shape", "x=2,64", "--repeat", "1", "--warmup", "0",
                 "--no-onnxruntime", "-q", "--schedule"]) == 0
    assert [(p, s) for p, _t, s in seen] == [("relax_memplan", True), ("tvm", True)]
    assert all('"mcpu"' in t for _p, t, _s in seen)


def test_cli_bench_takes_fusion_and_config(tmp_path, capsys, monkeypatch):
    """Regression: bench had no --fusion or --config, so a configured build could not be
    timed. --no-fusion reaches both builds; a config's planner and schedule are used; a bad
    config key is one clear error."""
    import relax_memplan.compile as compile_pkg

    seen = []
    real = compile_pkg.build

    def recording_build(mod, target, options, passes, *args, **kw):
        seen.append((options.planner, options.fusion, options.schedule,
                     getattr(passes.plan, "time_limit_s", None)))
        return real(mod, target, options, passes, *args, **kw)

    monkeypatch.setattr(compile_pkg, "build", recording_build)
    path = tmp_path / "m.onnx"
    path.write_bytes(_model().SerializeToString())
    config = tmp_path / "c.yaml"
    config.write_text("planner:\n  time_limit_s: 0.25\nschedule: true\n")
    run = ["bench", str(path), "--shape", "x=2,64", "--repeat", "1", "--warmup", "0",
           "--no-onnxruntime", "-q"]
    assert main(run + ["--no-fusion", "--config", str(config)]) == 0
    assert seen == [("relax_memplan", False, True, 0.25), ("tvm", False, True, None)]
    # regression: bench did not say which settings it applied
    assert capsys.readouterr().out.splitlines()[0] == (
        f"settings (config {config}, --fusion given): schedule on, fusion off, "
        "fusion_conv_chain off (no fusion), planner algorithms default, time limit 0.25 s, "
        "in-place on, reorder on, index checks on")
    seen.clear()
    assert main(run + ["--config", str(config), "--no-schedule"]) == 0
    assert [(f, s) for _p, f, s, _t in seen] == [(True, False), (True, False)]
    config.write_text("planner:\n  time_limit: 1\n")
    assert main(run + ["--config", str(config)]) == 1
    assert "time_limit" in capsys.readouterr().err


def test_cli_bench_honours_config_shapes_and_planner_and_refuses_dims_and_target(
        tmp_path, capsys, monkeypatch):
    """Regression: bench --config used the planner/schedule/fusion settings but not the
    config's shapes (x ran at 1x64), dims or target. Shapes are used (--shape wins), the
    planner's concat_inplace/reorder and fusion_conv_chain reach the build; dims, dispatch and a
    non-llvm target are refused, naming the key."""
    import relax_memplan.compile as compile_pkg

    seen = []
    real = compile_pkg.build

    def recording_build(mod, target, options, passes, *args, **kw):
        chain = [p for p in passes.fusion or [] if p.info.name == "FuseConvChain"]
        seen.append((options.planner, getattr(passes.plan, "concat_inplace", None),
                     passes.reorder is not None, len(chain)))
        return real(mod, target, options, passes, *args, **kw)

    monkeypatch.setattr(compile_pkg, "build", recording_build)
    path = tmp_path / "m.onnx"
    path.write_bytes(_model().SerializeToString())
    config = tmp_path / "c.yaml"
    config.write_text("shapes:\n  x: [3, 64]\nplanner:\n  concat_inplace: false\n  reorder: true\n"
                      "fusion_conv_chain: 'off'\n")
    out = tmp_path / "t.json"
    run = ["bench", str(path), "--repeat", "1", "--warmup", "0", "--no-onnxruntime", "-q",
           "--config", str(config)]
    assert main(run + ["--json", str(out)]) == 0
    assert json.loads(out.read_text())["input_shapes"] == {"x": [3, 64]}
    assert seen == [("relax_memplan", False, True, 0), ("tvm", None, False, 0)]
    assert main(run + ["--json", str(out), "--shape", "x=5,64"]) == 0  # --shape wins
    assert json.loads(out.read_text())["input_shapes"] == {"x": [5, 64]}
    capsys.readouterr()
    for text, key in (("dims:\n  n: [1, 8]\n", "key 'dims'"),
                      ("target: cuda\n", "target 'cuda' is not supported by bench")):
        config.write_text(text)
        assert main(run) == 1
        err = capsys.readouterr().err.strip()
        assert len(err.splitlines()) == 1 and key in err and str(config) in err
