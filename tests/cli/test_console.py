"""Progress lines with seconds and a total; TVM's native log lines shown once each."""

import io
import os

from relax_memplan.cli.console import PhaseProgress, native_log, summarize_native_log


def test_progress_prints_each_phase_with_seconds_and_the_total():
    out = io.StringIO()
    progress = PhaseProgress(out)
    progress("importing m.onnx")
    progress("building")
    progress.finish()
    lines = out.getvalue().splitlines()
    # not a terminal: a line when each phase starts (regression: long silences), one
    # with its seconds when it ends
    assert lines[0] == "[relax-memplan] importing m.onnx ..."
    assert lines[1].startswith("[relax-memplan] importing m.onnx: ") and lines[1].endswith(" s")
    assert lines[2] == "[relax-memplan] building ..."
    assert lines[3].startswith("[relax-memplan] building: ") and lines[3].endswith(" s")
    assert lines[4].startswith("[relax-memplan] total ") and len(lines) == 5


def test_native_log_lines_are_summarized_once_with_a_count():
    text = ("[21:16:05] /project/include/tvm/topi/transform.h:1261: Warning: Fast mode\n"
            "[21:16:06] /project/include/tvm/topi/transform.h:1261: Warning: Fast mode\n"
            "[21:16:06] /project/src/relax/ir/block_builder.cc:67: Warning: BlockBuilder\n")
    assert summarize_native_log(text) == ["TVM: Warning: Fast mode (2 times)",
                                          "TVM: Warning: BlockBuilder"]


def test_native_log_once_collects_fd2_and_prints_each_line_once(capfd):
    with native_log("once"):
        for _ in range(3):
            os.write(2, b"[21:16:05] /x.cc:1: Warning: repeated\n")
    err = capfd.readouterr().err
    assert err.count("repeated") == 1 and "(3 times)" in err


def test_native_log_mute_drops_and_verbose_keeps(capfd):
    with native_log("mute"):
        os.write(2, b"dropped\n")
    with native_log("verbose"):
        os.write(2, b"kept\n")
    err = capfd.readouterr().err
    assert "dropped" not in err and "kept" in err


def test_native_log_collects_what_objects_left_in_cycles_log_when_freed(capfd):
    """Regression: with -q, ultraface's failed first import left a BlockBuilder in a
    reference cycle; freed after the capture, its C++ warning reached the terminal raw."""
    import gc

    from tvm import relax

    with native_log("mute"):
        builder = relax.BlockBuilder()
        builder._begin_dataflow_block()
        cycle = [builder]
        cycle.append(cycle)
        del builder, cycle
    gc.collect()  # what would free it later (or interpreter exit)
    assert "BlockBuilder destroyed" not in capfd.readouterr().err


def test_native_log_summary_leaves_out_the_block_builder_of_a_stopped_import():
    """Regression: after bench on ultraface (its opset-9 import fails and is retried) and
    after Ctrl-C, 'TVM: Warning: BlockBuilder destroyed with remaining blocks!' was shown."""
    text = ("[21:16:05] /project/src/relax/ir/block_builder.cc:67: Warning: BlockBuilder "
            "destroyed with remaining blocks!\n"
            "[21:16:06] /project/include/tvm/topi/transform.h:1261: Warning: Fast mode\n")
    assert summarize_native_log(text) == ["TVM: Warning: Fast mode"]


def test_the_fast_mode_gather_warning_says_what_our_index_checks_do():
    text = ("[21:16:05] /project/include/tvm/topi/transform.h:1261: Warning: Fast mode segfaults "
            "when there are out-of-bounds indices. Make sure input indices are in bound\n") * 3
    (line,) = summarize_native_log(text)
    assert line.startswith("TVM: Warning: Fast mode segfaults") and "(3 times)" in line
    assert line.endswith("stop an out-of-range index with an error before such a kernel runs")
