"""relax-memplan compile: the main job on the built-in example, and clear one-line errors."""

import json
import warnings

import numpy as np
import pytest
import tvm
from tvm import relax

from relax_memplan.cli import EXIT_ERROR, main
from tests.conftest import mlp_model, shared_model

REQUIRED_KEYS = ("lower_bound_bytes", "arena_bytes", "tvm_default_bytes", "runtime_alloc_bytes",
                 "max_abs_error")


@pytest.fixture(scope="module")
def example_run(tmp_path_factory):
    out = tmp_path_factory.mktemp("cli")
    args = ["compile", "--verify", "-q", "--report", str(out / "r.json"), "-o", str(out / "lib.so"),
            "--plot", str(out / "plan.png"), "--time-limit", "0.2"]
    return main(args), out


def test_example_report_json_has_the_keys_tools_read(example_run):
    status, out = example_run
    assert status == 0
    report = json.loads((out / "r.json").read_text())
    for key in REQUIRED_KEYS:
        assert isinstance(report[key], (int, float)), key
    assert report["arena_bytes"] <= report["tvm_default_bytes"]
    assert report["lower_bound_bytes"] <= report["arena_bytes"]
    assert report["runtime_matches_plan"] is True
    assert report["verified"] is True
    assert report["functions"]["main"]["arena_bytes"] == report["arena_bytes"]


def test_static_report_is_the_one_row_case(example_run):
    """A fixed shape is a build without symbolic dims: one row, dims {}, same bytes as main."""
    _, out = example_run
    report = json.loads((out / "r.json").read_text())
    assert report["strategy"] == "static" and report["dims"] == {}
    [row] = report["shapes"]
    assert row["dims"] == {} and row["verified"] is True
    for key in ("arena_bytes", "lower_bound_bytes", "runtime_alloc_bytes",
                "tvm_default_runtime_alloc_bytes", "max_abs_error"):
        assert row[key] == report[key], key


def test_report_lists_each_placed_tensor_and_those_live_at_the_peak(example_run):
    _, out = example_run
    report = json.loads((out / "r.json").read_text())
    tensors = {t["name"]: t for t in report["tensors"]}
    assert len(tensors) == report["num_planned"] > 0
    for t in tensors.values():
        assert t["producer"] and t["size_bytes"] > 0  # e.g. fused_conv2d_add_relu
        assert 0 <= t["offset_bytes"] and t["offset_bytes"] + t["size_bytes"] <= report["arena_bytes"]
        assert t["live_range"][0] < t["live_range"][1]
    live = [tensors[n] for n in report["live_at_peak"]]
    assert all("inside" not in t for t in live)  # a group's members are named under its root
    spans = [t.get("group_live_range", t["live_range"]) for t in live]
    assert all(start <= report["peak_step"] < end for start, end in spans)
    sizes = [t.get("group_size_bytes", t["size_bytes"]) for t in live]
    assert sum(sizes) <= report["lower_bound_bytes"]
    assert sizes == sorted(sizes, reverse=True)


def test_example_library_loads_and_runs(example_run):
    _, out = example_run
    lib = tvm.runtime.load_module(str(out / "lib.so"))
    vm = relax.VirtualMachine(lib, tvm.cpu())
    x = tvm.runtime.tensor(np.zeros((1, 3, 96, 96), "float32"))
    probs = vm["main"](x).numpy()
    assert probs.shape == (1, 10)
    np.testing.assert_allclose(probs.sum(), 1.0, rtol=1e-5)


def test_run_with_a_number_fills_the_input_and_q_prints_nothing(example_run, capsys):
    _, out = example_run
    assert main(["run", str(out / "lib.so"), "--input", "image=0", "--output",
                 str(out / "zeros.npz")]) == 0
    assert "output0: float32 [1, 10]" in capsys.readouterr().out
    lib = tvm.runtime.load_module(str(out / "lib.so"))
    expected = relax.VirtualMachine(lib, tvm.cpu())["main"](
        tvm.runtime.tensor(np.zeros((1, 3, 96, 96), "float32"))).numpy()
    np.testing.assert_array_equal(np.load(out / "zeros.npz")["output0"], expected)
    assert main(["run", str(out / "lib.so"), "--input", "image=0.5", "-q"]) == 0
    assert capsys.readouterr().out == ""


_LOAD_AND_RUN = """
import sys
import numpy as np
import tvm
from tvm import relax
vm = relax.VirtualMachine(tvm.runtime.load_module(sys.argv[1]), tvm.cpu())
shape = tuple(int(d) for d in sys.argv[2].split(",")) if len(sys.argv) > 2 else (1, 3, 96, 96)
print(vm["main"](tvm.runtime.tensor(np.zeros(shape, "float32"))).numpy().shape)
"""


def _load_and_run(library, *args):
    """Load ``library`` and run it in a fresh process: (stdout, stderr)."""
    import subprocess
    import sys

    proc = subprocess.run([sys.executable, "-c", _LOAD_AND_RUN, str(library), *args],
                          capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr
    return proc.stdout.strip(), proc.stderr


def test_library_written_before_the_run_loads_without_warnings(example_run):
    """A library exported after a VM ran the executable printed one ``Scope Loaded`` warning
    per constant on every load; ours is written before the measurement run."""
    _, out = example_run
    stdout, stderr = _load_and_run(out / "lib.so")
    assert stdout == "(1, 10)"
    assert stderr == "", stderr


def test_example_plot_is_a_png(example_run):
    _, out = example_run
    assert (out / "plan.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def _one_line_error(capsys, argv):
    status = main(argv)
    err = capsys.readouterr().err.strip()
    assert status == EXIT_ERROR
    assert "Traceback" not in err
    lines = [line for line in err.splitlines() if not line.startswith("[relax-memplan]")]
    assert len(lines) == 1, err
    assert lines[0].startswith("relax-memplan: error: ")
    return lines[0]


def test_missing_file(capsys, tmp_path):
    line = _one_line_error(capsys, ["compile", str(tmp_path / "nope.onnx"), "-q"])
    assert "nope.onnx" in line


def test_file_that_is_not_onnx(capsys, tmp_path):
    bad = tmp_path / "notes.onnx"
    bad.write_text("this is not a model\n")
    line = _one_line_error(capsys, ["compile", str(bad), "-q"])
    assert "notes.onnx" in line


@pytest.mark.parametrize("spec", ["image", "image=", "image=1,3,x,96", "image=1,3,-96,96", "=1,2"])
def test_malformed_shape(capsys, spec):
    line = _one_line_error(capsys, ["compile", "--shape", spec, "-q"])
    assert "shape" in line.lower()


def test_shape_for_unknown_input(capsys):
    line = _one_line_error(capsys, ["compile", "--shape", "pixels=1,3,96,96", "-q"])
    assert "pixels" in line and "image" in line


def test_unknown_config_key(capsys, tmp_path):
    cfg = tmp_path / "c.yaml"
    cfg.write_text("planner:\n  time_limit: 3\n")
    line = _one_line_error(capsys, ["compile", "--config", str(cfg), "-q"])
    assert "planner.time_limit" in line


@pytest.mark.parametrize(
    "model, shapes, node, op",
    [
        ("bert-tiny-randw.onnx", ["input_ids=2,16", "attention_mask=2,16", "token_type_ids=2,16"],
         "/m/ConstantOfShape", "ConstantOfShape"),
        ("gpt2-tiny-randw.onnx", ["input_ids=2,16"], "node_Reshape_54", "Reshape"),
        ("magika-1.0.3.onnx", ["bytes=1,2048"], "MagikaV2/Reshape", "Reshape"),
    ],
)
def test_unimportable_model_names_node_and_op(capsys, model, shapes, node, op):
    """TVM's importer alone (--no-prepare) fails on these; the error names node and op."""
    flags = [word for shape in shapes for word in ("--shape", shape)]
    line = _one_line_error(capsys, ["compile", str(shared_model(model)), "-q", "--no-prepare",
                                    *flags])
    assert node in line and f"op {op}" in line


def test_unwritable_output_fails_before_compiling_and_writes_nothing(capsys, tmp_path):
    report = tmp_path / "r.json"
    line = _one_line_error(capsys, ["compile", "-q", "-o", "/proc/nope/x.so", "--report", str(report)])
    assert "-o /proc/nope/x.so" in line
    assert not report.exists()


@pytest.mark.parametrize(
    "argv, words",
    [
        (["--target", "cuda", "--verify"], "--verify runs the build on the CPU"),
        (["--shape", "image=1,3,96,96", "--shape", "image=1,3,96,96"], "given twice"),
        (["--input", "image=99999999999999999999"], "too large"),
        (["--shape", "image=99999999999999999999,3,96,96"], "above 2147483647"),
        (["--input", "nosuch=1"], "unknown input"),
        (["--input", "image=1,2"], "'image' has shape (2,), expected (1, 3, 96, 96)"),
        (["--dump-ir", "/etc/passwd"], "not a directory"),
        # the built-in example has fixed shapes: a sample count would do nothing
        (["--sample-shapes", "4"], "--sample-shapes 4 samples the ranges of symbolic dims"),
    ],
)
def test_more_bad_input_is_one_line(capsys, argv, words):
    line = _one_line_error(capsys, ["compile", "-q", "--no-measure"] + argv)
    assert words in line


@pytest.mark.parametrize("argv", [
    ["compile", "-o", "a.so", "-o", "b.so"],
    ["compile", "--report", "a.json", "--report", "b.json"],
    ["run", "x.so", "--output", "a.npz", "--output", "b.npz"],
    ["bench", "--json", "a.json", "--json", "b.json"],
])
def test_a_file_option_given_twice_is_refused(capsys, tmp_path, monkeypatch, argv):
    """argparse keeps the last of two: one of the two files named would never be written."""
    monkeypatch.chdir(tmp_path)
    with pytest.raises(SystemExit) as exit_info:
        main(argv)
    assert exit_info.value.code == 2
    assert f"{argv[-2]} is given twice ({argv[-3]} and {argv[-1]}): give it once" in \
        capsys.readouterr().err
    assert not list(tmp_path.iterdir())


@pytest.mark.parametrize("flag", ["--report", "--dump-ir"])
def test_an_output_named_like_the_libraries_manifest_is_refused_before_the_build(
        capsys, tmp_path, flag):
    """`-o a.so --report a.so.json` overwrote the manifest written beside the library, and
    `run` then refused the library; with --dump-ir the build failed after writing."""
    lib = tmp_path / "a.so"
    line = _one_line_error(capsys, ["compile", "-q", "--no-measure", "-o", str(lib), flag,
                                    str(tmp_path / "a.so.json")])
    assert line == (f"relax-memplan: error: the manifest of -o {lib}.json and {flag} "
                    f"{lib}.json are the same file: give each output its own name")
    assert not list(tmp_path.iterdir())


def test_run_output_must_be_named_npz(capsys, tmp_path):
    """numpy.savez appends .npz: `--output out.txt` used to write out.txt.npz."""
    out = tmp_path / "out.txt"
    line = _one_line_error(capsys, ["run", str(tmp_path / "x.so"), "--output", str(out)])
    assert line == (f"relax-memplan: error: --output {out}: the outputs are written as a "
                    f"NumPy .npz archive; give a file name ending in .npz")
    assert not list(tmp_path.iterdir())


@pytest.mark.parametrize("measure", [[], ["--no-measure"]])
def test_input_value_that_does_not_fit_the_dtype_is_refused_with_or_without_measuring(
        capsys, measure):
    """Review: with --no-measure a value changed by the cast to the input's dtype (1e300 for
    a float32 input) passed silently; measured, it was refused only after the build."""
    line = _one_line_error(capsys, ["compile", "-q", "--input", "image=1e300"] + measure)
    assert line == ("relax-memplan: error: value for input 'image' changes when cast to "
                    "float32: finite values overflow to infinity")


def test_float64_values_for_a_float32_input_are_rounded_not_refused():
    """Review: a float64 .npy of ordinary random data for a float32 input was refused as
    'changes when cast'; an integer input still refuses a fractional value."""
    from relax_memplan.frontend.reference import cast_value
    from relax_memplan.errors import ShapeSpecError

    data = np.random.default_rng(0).standard_normal((2, 3))
    out = cast_value("x", data, "float32")
    assert out.dtype == np.float32 and np.array_equal(out, data.astype(np.float32))
    with pytest.raises(ShapeSpecError, match="changes when cast to int64"):
        cast_value("n", np.array([1.5]), "int64")
    with warnings.catch_warnings():  # regression: numpy's RuntimeWarning leaked first
        warnings.simplefilter("error")
        with pytest.raises(ShapeSpecError, match="overflow to infinity"):
            cast_value("x", np.array([1.0, 1e300]), "float32")


def test_binary_config_is_one_line(capsys, tmp_path):
    cfg = tmp_path / "bin.yaml"
    cfg.write_bytes(b"\x00\xff\xfe")
    assert "not a text" in _one_line_error(capsys, ["compile", "--config", str(cfg), "-q"])


@pytest.mark.parametrize("value", ["-1", "0", "nan", "inf", "abc"])
def test_bad_time_limit_is_a_usage_error(capsys, value):
    with pytest.raises(SystemExit) as exc:
        main(["compile", "--time-limit", value])
    assert exc.value.code == 2
    assert "--time-limit" in capsys.readouterr().err


def test_dynamic_dims_measured_at_range_ends(tmp_path):
    report = tmp_path / "dyn.json"
    status = main(["compile", str(shared_model("mobilenetv2-tiny.onnx")), "--dim", "batch=1..4",
                   "--sample-shapes", "2", "--verify", "-q", "--report", str(report),
                   "--time-limit", "0.2"])
    assert status == 0
    data = json.loads(report.read_text())
    assert data["strategy"] == "exact"
    assert [s["dims"]["batch"] for s in data["shapes"]] == [1, 4]
    for s in data["shapes"]:
        assert s["arena_over_lower_bound"] <= 1.02
        assert s["runtime_alloc_bytes"] < s["tvm_default_runtime_alloc_bytes"]
        assert s["max_abs_error"] < 1e-4
    _check_dynamic_tensors(data)
    # conv chains are static-only: the report says so (no concat in mobilenetv2: not listed)
    assert data["not_applied"] == {"conv_chain": "static shapes only (FuseConvChain sizes its row "
                                   "tiles at compile time); 4 strided convolution(s) with "
                                   "symbolic shapes"}


def _check_dynamic_tensors(data):
    """The per-tensor table of a dynamic report: at each shape the tensors live at the peak
    are live at its step, lie apart in the arena and fit under the lower bound."""
    tensors = {t["name"]: t for t in data["tensors"]}
    assert len(tensors) == data["planned_tensors"] > 0
    for k, s in enumerate(data["shapes"]):
        live = [tensors[n] for n in s["live_at_peak"]]
        assert live and all(t["live_range"][0] <= s["peak_step"] < t["live_range"][1] for t in live)
        spans = sorted((t["offset_bytes_at_shapes"][k],
                        t["offset_bytes_at_shapes"][k] + t["size_bytes_at_shapes"][k]) for t in live)
        assert all(a[1] <= b[0] for a, b in zip(spans, spans[1:])), spans
        assert spans[-1][1] <= s["arena_bytes"]
        assert sum(t["size_bytes_at_shapes"][k] for t in live) <= s["lower_bound_bytes"]


@pytest.mark.parametrize(
    "dim, words",
    [("batch", "NAME=LO..HI"), ("batch=a..4", "integers"), ("batch=5..4", "LO <= HI"),
     ("seq=1..4", "not a symbolic dim"), ("batch=1..4:0", "step must be >= 1"),
     ("batch=1..:2", "needs HI"), ("batch=1..4:", "NAME=LO..HI:STEP"),
     ("batch=1..8:3", "HI must be LO + k * STEP (e.g. 1..7:3 or 1..10:3)")],
)
def test_bad_dim_spec_is_one_line(capsys, dim, words):
    line = _one_line_error(capsys, ["compile", str(shared_model("mobilenetv2-tiny.onnx")),
                                    "--dim", dim, "-q"])
    assert words in line


@pytest.mark.slow  # 25 s: three dynamic builds; each strategy has its own faster tests
def test_all_strategies_side_by_side_with_buckets_and_size_classes(tmp_path, capsys):
    report = tmp_path / "all.json"
    status = main(["compile", str(shared_model("mobilenetv2-tiny.onnx")), "--dim", "batch=1..4",
                   "--strategy", "all", "--bucket", "batch=2,9", "--size-classes", "--sample-shapes", "3",
                   "-q", "--report", str(report), "--time-limit", "0.2", "-o", str(tmp_path / "m.so"),
                   "--plot", str(tmp_path / "shapes.png")])
    assert status == 0
    out = capsys.readouterr().out
    assert f"bytes per sampled shape drawn to {tmp_path / 'shapes.png'}" in out
    assert (tmp_path / "shapes.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    # one table, a column group per strategy, the bucket values in its header
    assert out.count("relax-memplan dynamic report") == 1 and "strategies side by side" in out
    # 9 is outside batch's range: skipped with a note, not in the header (regression)
    assert "batch in [1, 4]; buckets batch=2;" in out
    assert "bucket values [9] of 'batch' are outside its declared range" in out
    assert [line.split() for line in out.splitlines() if line.strip().startswith("upper_bound")
            and "not applied" not in line] == [["upper_bound", "exact", "buckets"]]
    # what a strategy does not apply is said under the table: once for all (conv chains),
    # or prefixed with the strategy (upper_bound: no in-place reuse)
    assert "  upper_bound: in-place reuse: not applied, the upper_bound strategy does no " \
        "in-place reuse (exact and buckets do)" in out
    assert out.count("conv chains: not applied, static shapes only") == 1
    assert len([line for line in out.splitlines() if line.strip().startswith("batch=")]) == 3
    for name in ("upper_bound", "exact", "buckets"):  # -o: one library per strategy, each named
        assert (tmp_path / f"m.{name}.so").exists()
        assert f"library ({name}) written to {tmp_path / f'm.{name}.so'}" in out
    # written before the runs at the sampled shapes: loads without a warning, runs in range
    assert _load_and_run(tmp_path / "m.exact.so", "3,3,96,96") == ("(3, 100)", "")
    data = json.loads(report.read_text())["strategies"]
    assert data["buckets"]["buckets"] == {"batch": [2]}
    tvm_bytes = {n: [s["tvm_default_runtime_alloc_bytes"] for s in d["shapes"]] for n, d in data.items()}
    assert tvm_bytes["upper_bound"] == tvm_bytes["exact"] == tvm_bytes["buckets"]  # TVM's build run once
    assert sorted(data) == ["buckets", "exact", "upper_bound"]
    assert data["exact"]["ratio_check"]["enumerated"] and data["exact"]["ratio_check"]["shapes"] == 4
    upper = {tuple(s["dims"].values()): s for s in data["upper_bound"]["shapes"]}
    for name in ("exact", "buckets"):
        for s in data[name]["shapes"]:
            # size classes: the arena of the batch's class (1, 4), never below the lower bound
            assert s["lower_bound_bytes"] <= s["arena_bytes"] <= upper[tuple(s["dims"].values())]["arena_bytes"]
    assert "size classes: batch in [1, 4]" in data["exact"]["notes"]


@pytest.mark.parametrize(
    "argv, words",
    [(["--bucket", "batch=2"], "need symbolic dims"),
     (["--dim", "batch=1..4", "--strategy", "buckets"], "needs --bucket"),
     (["--dim", "batch=1..4", "--bucket", "batch=2"], "add --strategy buckets (or all)"),
     (["--dim", "batch=1..4", "--bucket", "seq=2"], "--bucket seq: not a dim given with --dim"),
     (["--dim", "batch=1..4", "--bucket", "batch=a"], "expected NAME=V1,V2"),
     (["--dim", "batch=1..4", "--dispatch", "batch=0"],
      "--dispatch 'batch=0': values of batch must be >= 1 (got 0)"),
     (["--dim", "batch=1..4", "--bucket", "batch=0,2"],
      "--bucket 'batch=0,2': values of batch must be >= 1 (got 0)")],
)
def test_bad_bucket_and_dispatch_options_are_one_line(capsys, argv, words):
    line = _one_line_error(capsys, ["compile", str(shared_model("mobilenetv2-tiny.onnx")), "-q"] + argv)
    assert words in line


def _mlp_model(path):
    """The small MLP of :func:`tests.conftest.mlp_model` with a symbolic ``batch``, saved to
    ``path`` (for tests where the model is incidental)."""
    import onnx

    onnx.save(mlp_model("batch"), str(path))
    return str(path)


def test_stepped_dim_without_running_reports_the_plan(tmp_path):
    """Regression: a --dim with :STEP crashed the text report after the whole build (the
    model is incidental: a small MLP, was mobilenetv2-tiny)."""
    report = tmp_path / "step.json"
    status = main(["compile", _mlp_model(tmp_path / "mlp.onnx"), "--dim", "batch=1..7:3",
                   "--no-measure", "-q", "--report", str(report), "--time-limit", "0.2"])
    assert status == 0
    data = json.loads(report.read_text())
    assert data["dims"] == {"batch": [1, 7, 3]}
    assert [s["dims"]["batch"] for s in data["shapes"]][:2] == [1, 7]
    assert all(s["dims"]["batch"] in (1, 4, 7) for s in data["shapes"])
    assert all(s["runtime_alloc_bytes"] is None for s in data["shapes"])  # --no-measure: not run
    assert data["ratio_check"] == {"shapes": 3, "enumerated": True, "max_ratio": 1.0, "pinned": 0}
    _check_dynamic_tensors(data)


def test_every_symbolic_dim_needs_a_range(capsys):
    line = _one_line_error(capsys, ["compile", str(shared_model("bert-tiny-randw.onnx")),
                                    "--dim", "seq=1..16", "-q"])
    assert "missing --dim for batch" in line


def test_dynamic_table_keeps_columns_apart_at_large_ratios():
    """Regression: a ratio >= 100 ran into the next column ('917,504292.571')."""
    from relax_memplan.report import CompileReport, ShapeMeasurement

    report = CompileReport(model="m", strategy="upper_bound", dims={"seq": (1, 128)})
    report.shapes.append(ShapeMeasurement(dims={"seq": 1}, runtime_alloc_bytes=918_016,
                                          arena_bytes=917_504, lower_bound_bytes=3_136))
    row = report.format_text().splitlines()[3]
    assert row.split() == ["seq=1", "3,136", "917,504", "292.571", "918,016", "-", "-"]


def _two_input_model(path):
    """y = x @ z^T with x[h, 4] and z[w, 4]: two independent symbolic dims."""
    import onnx
    from onnx import TensorProto, helper

    graph = helper.make_graph(
        [helper.make_node("Transpose", ["z"], ["zt"], perm=[1, 0]),
         helper.make_node("MatMul", ["x", "zt"], ["y"])],
        "g",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["h", 4]),
         helper.make_tensor_value_info("z", TensorProto.FLOAT, ["w", 4])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, ["h", "w"])],
    )
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    model.ir_version = 8
    onnx.save(model, str(path))
    return str(path)


def test_shape_fixes_one_input_while_dim_ranges_the_other(tmp_path):
    """Regression: --shape with --dim was refused; now x is fixed and w stays symbolic."""
    report = tmp_path / "mixed.json"
    status = main(["compile", _two_input_model(tmp_path / "two.onnx"), "--shape", "x=3,4",
                   "--dim", "w=1..6", "--sample-shapes", "2", "--verify", "-q",
                   "--report", str(report), "--time-limit", "0.2"])
    assert status == 0
    data = json.loads(report.read_text())
    assert data["dims"] == {"w": [1, 6]}
    assert [s["dims"] for s in data["shapes"]] == [{"w": 1}, {"w": 6}]
    assert all(s["max_abs_error"] < 1e-5 for s in data["shapes"])


def test_dim_fixed_by_shape_and_ranged_is_one_line(capsys, tmp_path):
    line = _one_line_error(capsys, ["compile", _two_input_model(tmp_path / "two.onnx"), "-q",
                                    "--shape", "x=3,4", "--dim", "h=1..4", "--dim", "w=1..4"])
    assert line == ("relax-memplan: error: --dim h: dim 'h' is fixed to 3 by --shape; give it "
                    "a --shape value or a --dim range, not both")


def test_shape_of_one_bert_input_fixes_the_dims_all_inputs_share(capsys):
    """bert-tiny's three inputs share (batch, seq): --shape of one fixes both everywhere."""
    line = _one_line_error(capsys, ["compile", str(shared_model("bert-tiny-randw.onnx")), "-q",
                                    "--shape", "input_ids=1,16", "--dim", "seq=1..32"])
    assert "--dim seq: dim 'seq' is fixed to 16 by --shape" in line


# --- issue 8: checked before any work, one line each ------------------------
@pytest.mark.parametrize("argv, expected", [
    (["--plot", "{tmp}/plan.txt"], "--plot {tmp}/plan.txt: the file name must end in one of"),
    (["-o", "{tmp}/lib.txt"], "-o {tmp}/lib.txt: a compiled library must end in .so"),
    (["--verify", "--no-measure"], "--verify runs the build; it cannot be combined with --no-measure"),
])
def test_output_and_option_mistakes_are_refused_up_front(capsys, tmp_path, argv, expected):
    argv = [a.format(tmp=tmp_path) for a in argv]
    line = _one_line_error(capsys, ["compile", "-q"] + argv)
    assert line.startswith("relax-memplan: error: " + expected.format(tmp=tmp_path)), line
    assert not any(tmp_path.iterdir())


def test_a_zero_dim_range_is_refused(capsys, tmp_path):
    """Regression: --dim seq=0..8 compiled, the plan silently skipped seq=0 ("16 shapes in
    range" of 18) and the library failed at seq=0."""
    from relax_memplan.config import ConfigError, load_config
    from relax_memplan.compile import parse_dim_spec

    line = _one_line_error(capsys, ["compile", str(shared_model("bert-tiny-randw.onnx")), "-q",
                                    "--dim", "batch=1..1", "--dim", "seq=0..8"])
    assert line == "relax-memplan: error: bad dim spec 'seq=0..8': need 1 <= LO <= HI"
    assert parse_dim_spec("seq=..8") == ("seq", (1, 8))
    config = tmp_path / "c.yaml"
    config.write_text("dims:\n  seq: [0, 8]\n")
    with pytest.raises(ConfigError, match=r"dims.seq\[0\]"):
        load_config(config)


def test_a_float_input_holding_nan_is_accepted():
    """Regression: a float32 .npy with a NaN was refused as 'changes when cast to float32'."""
    from relax_memplan import frontend
    from relax_memplan.frontend.examples import example_cnn

    model = example_cnn()
    _mod, info = frontend.import_onnx(model)
    name = next(iter(info.input_shapes))
    value = np.zeros(info.input_shapes[name], dtype="float32")
    value.flat[0] = np.nan
    feed = frontend.make_random_inputs(model, info, values={name: value})
    assert np.isnan(feed[name].flat[0]) and feed[name].dtype == np.float32


def test_output_under_a_file_names_the_file(capsys, tmp_path):
    """Regression: '-o out/r.json/m.so' said 'cannot write: File exists'."""
    (tmp_path / "r.json").write_text("{}")
    line = _one_line_error(capsys, ["compile", "-q", "-o", str(tmp_path / "r.json" / "m.so")])
    assert line.endswith(f"{tmp_path / 'r.json'} is a file, not a directory")


def test_a_closed_pipe_ends_quietly(capsys, monkeypatch):
    """Regression: `relax-memplan inspect --json model | head` printed a BrokenPipeError
    traceback."""
    import relax_memplan.cli.entry as cli

    def closed_pipe(_args):
        raise BrokenPipeError(32, "Broken pipe")

    monkeypatch.setitem(cli.COMMANDS, "inspect", closed_pipe)
    assert main(["inspect", "x.onnx"]) == cli.EXIT_BROKEN_PIPE
    assert "Traceback" not in capsys.readouterr().err


def test_dynamic_index_error_has_no_shape_hint_and_input_with_dim_says_why(capsys, tmp_path):
    """Regression: an out-of-range id at a valid shape got the hint 'does the model accept
    this shape?'; a fixed --input value with --dim said only 'expected (1, 1)'."""
    model = str(shared_model("bert-tiny-randw.onnx"))
    ids = tmp_path / "ids.npy"
    np.save(ids, np.full((1, 16), 5000, dtype=np.int64))
    line = _one_line_error(capsys, ["compile", model, "-q", "--dim", "batch=1..1",
                                    "--dim", "seq=16..16", "--input", f"input_ids={ids}"])
    assert line.endswith("Gather node '/m/embeddings/word_embeddings/Gather': valid [-1000, 999]")
    line = _one_line_error(capsys, ["compile", model, "-q", "--dim", "batch=1..1",
                                    "--dim", "seq=1..16", "--input", f"input_ids={ids}"])
    assert "has shape (1, 16), expected (1, 1) at a sampled shape (with --dim" in line


def test_a_failed_run_at_a_sampled_shape_keeps_no_library(capsys, tmp_path):
    """Regression: when a run at a shape of the declared ranges failed, the -o library
    (which cannot serve those ranges) stayed written."""
    model = str(shared_model("bert-tiny-randw.onnx"))
    ids = tmp_path / "ids.npy"
    np.save(ids, np.full((1, 8), 5000, dtype=np.int64))
    lib = tmp_path / "bert.so"
    line = _one_line_error(capsys, ["compile", model, "-q", "--dim", "batch=1..1", "--dim",
                                    "seq=8..8", "--input", f"input_ids={ids}", "-o", str(lib)])
    assert line.endswith(f"valid [-1000, 999]; {lib} not kept")
    assert not lib.exists()


def _no_import(monkeypatch):
    """Make TVM's import (and so any build) fail loudly: the checks must come before it."""
    from relax_memplan import frontend
    from relax_memplan.errors import RelaxMemplanError

    def refuse(*_args, **_kwargs):
        raise RelaxMemplanError("import started")

    monkeypatch.setattr(frontend, "import_onnx", refuse)


@pytest.mark.parametrize("model, dim, missing", [
    ("gpt2-tiny-randw.onnx", "s27=1..64", "s77 (axis 0 of input_ids); add --dim s77=1..64 "
     "(placeholder range: set it to the values you will run), or --dim s77=1..1 to keep it fixed"),
    ("bert-tiny-randw.onnx", "seq=1..64", "batch (axis 0 of input_ids); add --dim batch=1..8 "
     "(placeholder range: set it to the values you will run), or --dim batch=1..1 to keep it "
     "fixed"),
    # an image side on the model's stride-32 grid: 1 does not import (it said 1..1)
    ("yolov8n-nudenet-320n.onnx", "batch=1..2", "height (axis 2 of images), width (axis 3 of "
     "images); add --dim height=32..320:32 --dim width=32..320:32 (placeholder ranges: set them "
     "to the values you will run), or --dim height=32..32 --dim width=32..32 to keep them fixed"),
])
def test_an_undeclared_dim_is_refused_before_the_import(capsys, monkeypatch, model, dim, missing):
    """Regression: a --dim naming one of two symbolic dims was refused after TVM's import.
    Review: the flags it suggested went by the dims' names only (s77: what is it? height=1..1
    does not import); it names each dim's input and axis and uses the model's grid."""
    _no_import(monkeypatch)
    line = _one_line_error(capsys, ["compile", str(shared_model(model)), "--dim", dim])
    assert line == ("relax-memplan: error: give a range for every symbolic dim of the model: "
                    f"missing --dim for {missing}")


def test_undeclared_dims_are_refused_before_the_import(capsys, monkeypatch):
    """No silent size 1: gpt2 compiled at seq 1 with a warning; refused with the flags."""
    _no_import(monkeypatch)
    line = _one_line_error(capsys, ["compile", str(shared_model("gpt2-tiny-randw.onnx"))])
    assert line == ("relax-memplan: error: symbolic dim(s) s77 (axis 0 of input_ids), s27 (axis "
                    "1 of input_ids) not declared and compile does not guess a size: add --dim "
                    "s77=1..64 --dim s27=1..64 to compile once for those ranges, or fix them "
                    "with --shape input_ids=1,1 (placeholders: set them to the sizes you will "
                    "run)")
    _one_line_error(capsys, ["compile", str(shared_model("gpt2-tiny-randw.onnx")), "-q"])


def test_undeclared_image_dims_suggest_values_on_the_models_grid(capsys, monkeypatch):
    """Review: the warning suggested --shape images=1,3,1,1, which does not import (yolov8n's
    stride-32 neck); it suggests the grid's first value, as inspect does."""
    _no_import(monkeypatch)
    line = _one_line_error(capsys, ["compile", str(shared_model("yolov8n-nudenet-320n.onnx"))])
    assert ": add --dim batch=1..8 --dim height=32..320:32 --dim width=32..320:32 to compile " \
        "once" in line
    assert "or fix them with --shape images=1,3,32,32 (placeholders" in line


def test_fixed_dims_are_not_refused(capsys, monkeypatch):
    _no_import(monkeypatch)
    line = _one_line_error(capsys, ["compile", str(shared_model("gpt2-tiny-randw.onnx")),
                                    "--shape", "input_ids=1,8"])
    assert line == "relax-memplan: error: import started"


def _not_run_cuda() -> str:
    """Why a cuda build is not run here (review: the reason must say plainly that no CUDA
    device was found and what was checked)."""
    from relax_memplan.targets import installed_cuda_arch

    why = ("compile runs and verifies CPU builds only" if installed_cuda_arch() else
           "no CUDA device was found here (checked: tvm.cuda(0).exist is false), so the build "
           "was compiled only")
    return (f"{why}; the arena and lower bound come from the plan; for run-time bytes and "
            "verification compile with --target llvm")


_NOT_RUN_CUDA = _not_run_cuda()


def test_dim_with_target_cuda_builds_and_reports_the_plan_without_run_rows(tmp_path, capsys):
    report = tmp_path / "cuda.json"
    status = main(["compile", _two_input_model(tmp_path / "two.onnx"), "--target", "cuda",
                   "--cuda-arch", "sm_90", "--dim", "h=1..4", "--dim", "w=1..6", "-q",
                   "--sample-shapes", "2", "--report", str(report), "--plot",
                   str(tmp_path / "shapes.png"), "--time-limit", "0.2"])
    assert status == 0
    out = capsys.readouterr().out
    assert "target cuda (sm_90); strategy exact; h in [1, 4], w in [1, 6]" in out
    assert "note: built for cuda sm_90, not run: " + _NOT_RUN_CUDA in out
    data = json.loads(report.read_text())
    assert (data["target"], data["arch"]) == ("cuda", "sm_90")
    assert [s["dims"] for s in data["shapes"]] == [{"h": 1, "w": 1}, {"h": 4, "w": 6}]
    for s in data["shapes"]:
        assert s["runtime_alloc_bytes"] is None and s["tvm_default_runtime_alloc_bytes"] is None
    assert (tmp_path / "shapes.png").exists()


def test_output_paths_create_missing_folders_and_say_so(tmp_path, capsys):
    """Regression: --report/--plot/-o created missing folders without a word. They are
    still created (as export_library users expect), with one line naming the first one."""
    from relax_memplan.cli.args import check_output_path

    target = tmp_path / "new" / "deeper" / "r.json"
    check_output_path("--report", str(target))
    err = capsys.readouterr().err
    assert err == f"relax-memplan: --report {target}: created missing folder {tmp_path / 'new'}\n"
    assert (tmp_path / "new" / "deeper").is_dir() and not target.exists()
    check_output_path("--report", str(target))  # the folder exists now: nothing said
    check_output_path("--dump-ir", str(tmp_path / "new"), directory=True)
    assert capsys.readouterr().err == ""
    check_output_path("--dump-ir", str(tmp_path / "ir" / "a"), directory=True)
    assert capsys.readouterr().err.endswith(f"created missing folder {tmp_path / 'ir'}\n")


def test_dynamic_table_widens_byte_columns_to_the_longest_number():
    """Regression: --dim batch=1..1000000 ran the cells together
    ('393,216,000,000393,216,000,000')."""
    from relax_memplan.report import CompileReport, ShapeMeasurement

    report = CompileReport(model="m", strategy="exact", dims={"batch": (1, 1_000_000)})
    report.shapes.append(ShapeMeasurement(dims={"batch": 1_000_000},
                                          runtime_alloc_bytes=393_216_000_064,
                                          arena_bytes=393_216_000_000,
                                          lower_bound_bytes=393_216_000_000))
    header, row = report.format_text().splitlines()[2:4]
    assert row.split() == ["batch=1000000", "393,216,000,000", "393,216,000,000", "1.000",
                           "393,216,000,064", "-", "-"]
    assert header.index("arena") + len("arena") == row.index("1.000") + len("1.000") - 9


def test_run_hint_after_o_pastes_as_one_command_with_spaces_and_quotes(capsys, tmp_path,
                                                                      monkeypatch):
    """Regression: the run hint printed after -o was not shell-quoted, so a path with a
    space or a quote broke when pasted."""
    import shlex

    import onnx

    model = tmp_path / "mlp.onnx"
    onnx.save(mlp_model(dim=2), model)
    lib = tmp_path / "my lib's" / "m.so"
    assert main(["compile", str(model), "-q", "--no-measure", "-o", str(lib)]) == 0
    line = capsys.readouterr().out.splitlines()[-1]
    command = line.split("run it with: ", 1)[1]
    assert command == f"relax-memplan run {shlex.quote(str(lib))} --input x=x.npy"
    monkeypatch.chdir(tmp_path)
    np.save(tmp_path / "x.npy", np.ones((2, 16), "float32"))
    words = shlex.split(command)  # what the shell hands over when it is pasted
    assert main(words[1:]) == 0
    assert "output0: float32 [2, 8]" in capsys.readouterr().out
    # the other way round: `run` given the model says how to compile it, quoted too
    quoted_model = lib.parent / "mlp.onnx"
    onnx.save(mlp_model(dim=2), quoted_model)
    assert main(["run", str(quoted_model)]) == EXIT_ERROR
    hint = capsys.readouterr().err.split("`")[1]
    assert shlex.split(hint) == ["relax-memplan", "compile", str(quoted_model), "-o",
                                 str(lib.parent / "mlp.so")]


def test_no_compare_skips_tvms_build_and_says_so(tmp_path, capsys):
    """Regression: TVM's comparison build (2-3x ours) could not be skipped."""
    import json

    report = tmp_path / "m.json"
    assert main(["compile", str(shared_model("mnist-8/model.onnx")), "--no-compare",
                 "--no-measure", "--report", str(report)]) == 0
    captured = capsys.readouterr()
    assert "StaticPlanBlockMemory" not in captured.err
    assert "  TVM default build, per call                 not built (--no-compare)" in \
        captured.out.splitlines()
    data = json.loads(report.read_text())
    assert data["tvm_default_bytes"] is None and data["saved_bytes"] is None
    assert data["arena_bytes"] > 0


@pytest.mark.parametrize("argv", [["compile", "--fusion", "--no-fusion"],
                                  ["compile", "--no-inplace", "--inplace"],
                                  ["bench", "m.onnx", "--schedule", "--no-schedule"]])
def test_on_and_off_flags_are_mutually_exclusive(argv, capsys):
    """Regression: --fusion --no-fusion was accepted, the last one winning."""
    with pytest.raises(SystemExit) as info:
        main(argv)
    assert info.value.code == 2
    assert "not allowed with argument" in capsys.readouterr().err


def test_on_off_flag_alone_sets_its_value():
    from relax_memplan.cli.parser import build_parser

    parse = build_parser().parse_args
    assert [parse(["compile", *a]).fusion for a in ([], ["--fusion"], ["--no-fusion"])] == [
        None, True, False]


def test_strategy_without_dims_is_refused(capsys):
    """Regression: --strategy all without --dim was silently ignored."""
    assert main(["compile", "--strategy", "all", "--no-measure"]) == EXIT_ERROR
    assert capsys.readouterr().err.strip() == (
        "relax-memplan: error: --strategy all plans symbolic dims: give --dim NAME=LO..HI "
        "(a fixed-shape build has one plan)")


@pytest.mark.parametrize("value", ["0", "-1", "two"])
def test_non_positive_tvm_num_threads_is_refused(value, monkeypatch, capsys):
    """Regression: TVM_NUM_THREADS=0 or -1 ran on one thread without a word."""
    monkeypatch.setenv("TVM_NUM_THREADS", value)
    assert main(["compile", "--no-measure"]) == EXIT_ERROR
    assert capsys.readouterr().err.strip() == (
        f"relax-memplan: error: TVM_NUM_THREADS='{value}': must be a positive integer (TVM "
        f"would use 1 thread); unset it to use every core")
