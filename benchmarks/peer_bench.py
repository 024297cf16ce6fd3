"""Our library against onnxruntime and OpenVINO as a user would compare them: each runtime in
its own fresh process, with its own default settings and the same thread count.

For each model (the shared models at their typical shapes, the full-size set at batch 1,
sequence 128: ``_peer_models.py``):

1. our library is built as a user builds it, ``relax-memplan compile MODEL --shape ... -o
   LIB.so --no-compare --no-measure -q`` plus the flags of each ``--build`` (``default``: none,
   our schedules for this machine's CPU; ``no-schedule``: ``--no-schedule``; ``portable``:
   ``--portable``; ``--build-flags NAME=...`` adds others), the compile's wall time and peak RSS
   recorded;
2. one set of inputs is drawn and saved (``_peer_models.draw_inputs``);
3. in each of ``--rounds`` rounds every runtime runs once in a fresh process
   (``_peer_runner.py``: load, one call whose outputs are kept, ``--warmup`` calls, then up
   to ``--calls`` timed calls, at least ``--min-calls``, stopping after ``--max-seconds``),
   the order rotated by one each round so that none is always first after a quiet spell;
4. every runtime's outputs are compared with onnxruntime's: ``max |ours - ort| <= rtol *
   max |ort| + atol`` (``--rtol 1e-3 --atol 1e-4``; OpenVINO's default bf16 precision is
   reported with its error, not failed).

Reported per model and runtime: the median over all timed calls of all rounds, the spread
(10th-90th percentile over the median), the per-round medians, resident memory (RSS) after
loading and after the run, and what loading and running added to it (``added``: RSS after the
run minus RSS after the imports); then the ratios ours / onnxruntime, ours / OpenVINO and ours
/ the faster of the two (``min``). The libraries are loaded with our loader (``ours``: the
manifest checked, the embedded constants' file pages released); ``--runtimes`` may add
``tvm`` (the same library loaded with plain TVM) to see what that costs.

Usage: python benchmarks/peer_bench.py [--set shared|full|all] [--only NAME ...]
       [--build default] [--build no-schedule] [--threads 2] [--rounds 3] [--json PATH]
       [--work /tmp/peer_bench] [--reuse]
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import time
from pathlib import Path

import numpy as np

HERE = Path(__file__).resolve().parent
REPO = HERE.parent
sys.path.insert(0, str(HERE))

from _peer_models import SHARED_MODELS, draw_inputs, full_size_models  # noqa: E402
from _peer_report import format_table, summarize  # noqa: E402

BUILDS = {"default": [], "no-schedule": ["--no-schedule"], "portable": ["--portable"]}
"""Our builds by name: ``default`` (our schedules for this machine's CPU), ``no-schedule``
(TVM's unscheduled kernels) and ``portable`` (our schedules, any x86-64 CPU)."""
PEERS = ("onnxruntime", "openvino", "openvino-f32")


def _env(threads: int) -> dict:
    env = dict(os.environ, TVM_NUM_THREADS=str(threads), OMP_NUM_THREADS=str(threads))
    env["PYTHONPATH"] = str(REPO) + os.pathsep + env.get("PYTHONPATH", "")
    return env


def compile_library(model, build: str, flags, work: Path, reuse: bool, threads: int) -> dict:
    """Build our library with the CLI; ``{"library", "compile_s", "compile_peak_rss",
    "library_bytes"}`` or ``{"error"}``."""
    library = work / f"{model.name}.{build}.so"
    record = work / f"{model.name}.{build}.compile.json"
    if reuse and library.exists() and record.exists():
        return json.loads(record.read_text())
    command = [sys.executable, "-m", "relax_memplan.cli", "compile", str(model.path), "-o",
               str(library), "--no-compare", "--no-measure", "-q"]
    for name, shape in model.shapes.items():
        if shape:
            command += ["--shape", f"{name}={','.join(str(d) for d in shape)}"]
    command += flags
    start = time.perf_counter()
    proc = subprocess.run(["/usr/bin/time", "-f", "%M", *command], capture_output=True,
                          text=True, env=_env(threads), cwd=REPO)
    elapsed = time.perf_counter() - start
    if proc.returncode != 0:  # the last lines are /usr/bin/time's: skip them
        lines = [l for l in proc.stderr.splitlines() if l.strip()
                 and not l.startswith("Command exited") and not l.strip().isdigit()]
        return {"error": lines[-1] if lines else f"exit {proc.returncode}"}
    out = {"library": str(library), "compile_s": round(elapsed, 1),
           "compile_peak_rss": int(proc.stderr.split()[-1]) * 1024,
           "library_bytes": library.stat().st_size, "flags": flags}
    record.write_text(json.dumps(out))
    return out


def run_once(runtime: str, model, library, inputs: Path, outputs: Path, args) -> dict:
    """One fresh runner process; its JSON, or ``{"error"}``."""
    command = [sys.executable, str(HERE / "_peer_runner.py"), runtime, str(model.path),
               str(inputs), str(outputs), "--threads", str(args.threads), "--warmup",
               str(args.warmup), "--calls", str(args.calls), "--min-calls",
               str(args.min_calls), "--max-seconds", str(args.max_seconds)]
    if library:
        command += ["--library", library]
    proc = subprocess.run(command, capture_output=True, text=True, env=_env(args.threads),
                          cwd=REPO)
    if proc.returncode != 0:
        lines = [l for l in proc.stderr.splitlines() if l.strip()]
        return {"error": (lines[-1] if lines else f"exit {proc.returncode}")[:300]}
    return json.loads(proc.stdout.strip().splitlines()[-1])


def compare(outputs: Path, reference: Path, rtol: float, atol: float) -> dict:
    """Largest difference of each output from onnxruntime's, and the verdict."""
    with np.load(outputs) as got, np.load(reference) as want:
        if len(got.files) != len(want.files):
            return {"ok": False, "why": f"{len(got.files)} outputs, onnxruntime {len(want.files)}"}
        worst, ok = 0.0, True
        for key in want.files:
            a, b = got[key].astype(np.float64), want[key].astype(np.float64)
            if a.shape != b.shape:
                return {"ok": False, "why": f"{key} shape {a.shape}, onnxruntime {b.shape}"}
            err = float(np.max(np.abs(a - b))) if a.size else 0.0
            tol = rtol * float(np.max(np.abs(b))) + atol if b.size else atol
            worst, ok = max(worst, err), ok and err <= tol
        return {"ok": ok, "max_abs_error": worst}


def _flags(build: str, args):
    """The compile flags of one of our builds."""
    return BUILDS[build] if build in BUILDS else args.flags[build]


def bench_model(model, args, work: Path) -> dict:
    """Build, run every runtime ``--rounds`` times in rotating order, compare."""
    entry = {"model": model.name, "shapes": {k: list(v) for k, v in model.shapes.items()},
             "full_size": model.full_size, "builds": {}, "runs": {}}
    inputs = work / f"{model.name}.inputs.npz"
    np.savez(inputs, **draw_inputs(model))
    runners = []
    for build in args.build:
        built = compile_library(model, build, _flags(build, args), work, args.reuse,
                                args.threads)
        entry["builds"][build] = built
        print(f"  {model.name} {build}: " + (built.get("error") or
              f"{built['compile_s']} s, library {built['library_bytes'] / 2**20:.1f} MiB"),
              flush=True)
        for loader in args.loaders:
            if "library" in built:
                runners.append((f"{loader}:{build}" if loader != "ours" else build, loader,
                                built["library"]))
    runners += [(peer, peer, None) for peer in args.runtimes]
    for name, _, _ in runners:
        entry["runs"][name] = {"rounds": []}
    for r in range(args.rounds):
        order = runners[r % len(runners):] + runners[:r % len(runners)]
        for name, runtime, library in order:
            out = work / f"{model.name}.{name.replace(':', '_')}.outputs.npz"
            result = run_once(runtime, model, library, inputs, out, args)
            entry["runs"][name]["rounds"].append(result)
            if "error" not in result:
                entry["runs"][name]["outputs"] = str(out)
    reference = entry["runs"].get("onnxruntime", {}).get("outputs")
    for name, run in entry["runs"].items():
        if reference and run.get("outputs") and name != "onnxruntime":
            run["check"] = compare(Path(run["outputs"]), Path(reference), args.rtol, args.atol)
    return summarize(entry)


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--set", choices=["shared", "full", "all"], default="all")
    parser.add_argument("--only", nargs="*", default=None)
    parser.add_argument("--build", action="append", default=None,
                        help="our build(s): " + ", ".join(BUILDS) + " or a --build-flags name")
    parser.add_argument("--build-flags", action="append", default=[],
                        help="NAME='--flag ...': a build with these compile flags")
    parser.add_argument("--loaders", default="ours", help="ours,tvm: how our library is loaded")
    parser.add_argument("--runtimes", default=",".join(PEERS))
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--warmup", type=int, default=2)
    parser.add_argument("--calls", type=int, default=10)
    parser.add_argument("--min-calls", type=int, default=3)
    parser.add_argument("--max-seconds", type=float, default=15.0)
    parser.add_argument("--rtol", type=float, default=1e-3)
    parser.add_argument("--atol", type=float, default=1e-4)
    parser.add_argument("--work", default="/tmp/peer_bench")
    parser.add_argument("--reuse", action="store_true", help="keep libraries built before")
    parser.add_argument("--json", default=str(HERE / "results" / "peer_bench.json"))
    args = parser.parse_args(argv)
    args.flags = dict(f.split("=", 1) for f in args.build_flags)
    args.flags = {k: v.split() for k, v in args.flags.items()}
    args.build = args.build or ["default"]
    args.loaders = [x for x in args.loaders.split(",") if x]
    args.runtimes = [x for x in args.runtimes.split(",") if x]
    models = ((SHARED_MODELS if args.set in ("shared", "all") else [])
              + (full_size_models() if args.set in ("full", "all") else []))
    models = [m for m in models if args.only is None or m.name in args.only]
    work = Path(args.work)
    work.mkdir(parents=True, exist_ok=True)
    results = []
    for model in models:
        print(f"{model.name}", flush=True)
        results.append(bench_model(model, args, work))
        Path(args.json).parent.mkdir(parents=True, exist_ok=True)
        Path(args.json).write_text(json.dumps(_document(args, results), indent=1) + "\n")
    print(format_table(results, args.build))
    print(f"written to {args.json}")
    return 0


def _document(args, results) -> dict:
    return {"benchmark": "peer_bench", "threads": args.threads, "rounds": args.rounds,
            "calls": args.calls, "min_calls": args.min_calls, "max_seconds": args.max_seconds,
            "builds": {b: _flags(b, args) for b in args.build},
            "loadavg": os.getloadavg(), "cpu": _cpu(), "models": results}


def _cpu() -> str:
    try:
        with open("/proc/cpuinfo", encoding="ascii", errors="replace") as f:
            names = [l.split(":", 1)[1].strip() for l in f if l.startswith("model name")]
        return f"{names[0]} x {len(names)}" if names else "unknown"
    except OSError:
        return "unknown"


if __name__ == "__main__":
    sys.exit(main())
