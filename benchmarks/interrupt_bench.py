"""Seconds from Ctrl-C to the end of ``relax-memplan compile`` while TVM's C++ code builds.

yolov8n (a build of tens of seconds) is compiled in a fresh process; one second into the
build of our pipeline the process gets SIGINT, and the time to its exit is measured, with
the exit status and what it printed after the signal. ``exit_on_interrupt``
(``relax_memplan/cli/interrupt.py``) gives the main thread 0.5 s, then ends the process;
without it the build ran to its end (17 s to 46 s). The machine is shared: the seconds move
with the load average printed beside them.

Usage: python benchmarks/interrupt_bench.py [--rounds 3] [--json benchmarks/results/interrupt.json]
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
MODEL = REPO.parent / "shared" / "models" / "yolov8n-nudenet-320n.onnx"


def _one_round() -> dict:
    with tempfile.TemporaryDirectory() as tmp:
        lib = Path(tmp) / "y.so"
        proc = subprocess.Popen(
            [sys.executable, "-m", "relax_memplan.cli", "compile", str(MODEL), "--shape",
             "images=1,3,320,320", "-o", str(lib)], cwd=REPO, stdout=subprocess.PIPE,
            stderr=subprocess.PIPE, text=True)
        for line in proc.stderr:
            if line.startswith("[relax-memplan] building"):
                break
        time.sleep(1.0)
        os.kill(proc.pid, signal.SIGINT)
        sent = time.perf_counter()
        status = proc.wait(timeout=600)
        seconds = time.perf_counter() - sent
        return {"seconds": round(seconds, 3), "status": status,
                "after_signal": proc.stderr.read().strip(), "library_left": lib.exists()}


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--json", default=str(REPO / "benchmarks" / "results" / "interrupt.json"))
    args = parser.parse_args(argv)
    load_before = os.getloadavg()
    rounds = [_one_round() for _ in range(args.rounds)]
    result = {"model": MODEL.name, "rounds": rounds,
              "max_seconds": max(r["seconds"] for r in rounds),
              "load_before": load_before, "load_after": os.getloadavg()}
    print(json.dumps(result, indent=2))
    Path(args.json).write_text(json.dumps(result, indent=2) + "\n", encoding="utf-8")
    return 0


if __name__ == "__main__":
    sys.exit(main())
