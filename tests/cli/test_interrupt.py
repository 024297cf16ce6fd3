"""Ctrl-C ends the command line promptly, also while TVM's C++ code builds, and leaves no
output file half-written."""

import os
import signal
import subprocess
import sys
import time

from relax_memplan.cli.interrupt import EXIT_INTERRUPTED, INTERRUPTED_LINE, OutputGuard
from tests.conftest import REPO_ROOT, shared_model


def test_output_guard_removes_what_the_command_wrote_and_keeps_the_rest(tmp_path):
    kept, rewritten, created = tmp_path / "kept.json", tmp_path / "old.so", tmp_path / "new.so"
    kept.write_text("before")
    rewritten.write_text("before")
    guard = OutputGuard([str(kept), str(rewritten), str(created), None, str(tmp_path / "never")])
    rewritten.write_text("half a new libra")
    created.write_text("half")
    assert sorted(guard.remove_partial()) == sorted([str(rewritten), str(created)])
    assert kept.read_text() == "before" and not rewritten.exists() and not created.exists()


def test_sigint_during_the_build_ends_the_command_with_one_line_and_no_output(tmp_path):
    """Ctrl-C during yolov8n's build (C++ code, tens of seconds): status 130, one line, no
    collected 'TVM: BlockBuilder' line, no output file left. How soon the process ends is
    measured by benchmarks/interrupt_bench.py (the wait here only guards against a hang)."""
    model = shared_model("yolov8n-nudenet-320n.onnx")  # a build long enough to interrupt
    lib, report = tmp_path / "y.so", tmp_path / "y.json"
    proc = subprocess.Popen(
        [sys.executable, "-m", "relax_memplan.cli", "compile", str(model), "--shape",
         "images=1,3,320,320", "-o", str(lib), "--report", str(report)],
        cwd=REPO_ROOT, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        for line in proc.stderr:  # a pipe: a line when each phase starts
            if line.startswith("[relax-memplan] building"):
                break
        time.sleep(1.0)  # well inside the build of our pipeline
        assert proc.poll() is None, "the build ended before the signal"
        os.kill(proc.pid, signal.SIGINT)
        status = proc.wait(timeout=600)
        rest = proc.stderr.read()
    finally:
        if proc.poll() is None:
            proc.kill()
    assert status == EXIT_INTERRUPTED, rest
    assert rest.strip() == INTERRUPTED_LINE  # one line, no traceback, no "TVM:" line
    assert not lib.exists() and not report.exists()


def test_nested_recording_blocks_that_both_received_ctrl_c_exit_cleanly():
    """Regression: Ctrl-C while TVM's default build ran inside two nested
    recording_interrupts blocks gave 'ValueError: list.remove(x): x not in list' (the inner
    block removed the outer block's equal list [2]) and exit 1 instead of 130."""
    from relax_memplan.runtime import vm as runtime

    previous = signal.signal(signal.SIGINT, lambda *_: None)  # never ends pytest
    try:
        with runtime.recording_interrupts() as outer:
            with runtime.recording_interrupts() as inner:
                os.kill(os.getpid(), signal.SIGINT)
                time.sleep(0.05)
            assert inner == [signal.SIGINT] and any(r is outer for r in runtime._RECORDING)
        assert outer == [signal.SIGINT] and runtime._RECORDING == []
    finally:
        signal.signal(signal.SIGINT, previous)


def test_ctrl_c_while_the_command_imports_tvm_is_the_one_line(monkeypatch, capsys):
    # the first second of a command imports TVM (relax_memplan.runtime); a Ctrl-C there
    # printed KeyboardInterrupt's traceback
    import types

    from relax_memplan.cli import main

    class _Importing(types.ModuleType):
        def __getattr__(self, name):
            raise KeyboardInterrupt

    monkeypatch.setitem(sys.modules, "relax_memplan.runtime", _Importing("relax_memplan.runtime"))
    assert main(["inspect", str(shared_model("mnist-8/model.onnx"))]) == EXIT_INTERRUPTED
    assert capsys.readouterr().err.strip() == INTERRUPTED_LINE
