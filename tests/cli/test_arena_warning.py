"""The warning of compile --dim when the arena at the upper bounds exceeds the memory."""

import numpy as np
from onnx import TensorProto, helper, numpy_helper, save

from relax_memplan.cli import main
from relax_memplan.report import CompileReport, ShapeMeasurement
from relax_memplan.cli.arena_warning import large_arena_warning, machine_memory_bytes


def _report(rows):
    report = CompileReport(model="m", strategy="exact",
                           dims={"batch": (1, 1_000_000), "seq": (8, 128)})
    for dims, arena in rows:
        report.shapes.append(ShapeMeasurement(dims=dims, runtime_alloc_bytes=None,
                                              arena_bytes=arena, lower_bound_bytes=arena))
    return report


def test_an_arena_above_the_limit_names_the_shape_and_the_dims_driving_it():
    report = _report([({"batch": 1, "seq": 8}, 393_216),
                      ({"batch": 1_000_000, "seq": 128}, 393_216_000_000)])
    line = large_arena_warning([report], limit_bytes=64 * 1024 ** 3)
    assert line == ("the arena at batch=1000000, seq=128 is 393,216,000,000 B (366.2 GiB), more "
                    "than the limit (64.0 GiB); it grows with batch=1000000 (1,000,000x its "
                    "lower bound 1), seq=128 (16x its lower bound 8): lower the upper bound "
                    "of --dim")


def test_an_arena_at_or_below_the_limit_gives_no_warning():
    report = _report([({"batch": 1_000_000, "seq": 128}, 393_216_000_000)])
    assert large_arena_warning([report], limit_bytes=393_216_000_000) is None
    assert large_arena_warning([report], limit_bytes=393_215_999_999) is not None
    assert large_arena_warning([_report([])], limit_bytes=1) is None


def test_the_default_limit_is_this_machines_memory():
    memory = machine_memory_bytes()
    assert memory is not None and memory > 1024 ** 3  # Linux: sysconf knows it
    report = _report([({"batch": 1_000_000, "seq": 128}, memory + 1)])
    assert "more than this machine's memory" in large_arena_warning([report])
    assert large_arena_warning([_report([({"batch": 2, "seq": 8}, memory)])]) is None


def test_cli_compile_with_a_huge_dim_range_warns_once_before_the_report(tmp_path,
                                                                         monkeypatch):
    """Regression: --dim batch=1..1000000 planned hundreds of GB without a word; then the
    warning came after the report's table, where it scrolled by unseen.
    y = relu(x @ W) @ W, x: [batch, 64]: the arena holds batch * 256 B at the upper bound."""
    import io
    import sys

    terminal = io.StringIO()  # stdout and stderr in one stream, as a terminal shows them
    monkeypatch.setattr(sys, "stdout", terminal)
    monkeypatch.setattr(sys, "stderr", terminal)
    w = numpy_helper.from_array(np.eye(64, dtype="float32"), "W")
    graph = helper.make_graph(
        [helper.make_node("MatMul", ["x", "W"], ["a"]), helper.make_node("Relu", ["a"], ["r"]),
         helper.make_node("MatMul", ["r", "W"], ["y"])], "g",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["batch", 64])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, ["batch", 64])], [w])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    model.ir_version = 8
    save(model, str(tmp_path / "m.onnx"))
    upper = 4 * machine_memory_bytes() // 256  # an arena of 4x the memory at the upper bound
    argv = ["compile", str(tmp_path / "m.onnx"), "--dim", f"batch=1..{upper}", "--no-measure"]
    assert main(argv) == 0
    lines = terminal.getvalue().splitlines()
    warnings = [line for line in lines if "warning" in line]
    report = next(k for k, line in enumerate(lines) if line.startswith("relax-memplan dynamic"))
    assert lines.index(warnings[0]) < report, lines
    assert warnings == [f"relax-memplan: warning: the arena at batch={upper} is "
                        f"{upper * 256:,} B ({upper * 256 / 1024 ** 3:,.1f} GiB), more than this "
                        f"machine's memory ({machine_memory_bytes() / 1024 ** 3:,.1f} GiB); it "
                        f"grows with batch={upper} ({upper:,}x its lower bound 1): lower the "
                        "upper bound of --dim"], warnings
