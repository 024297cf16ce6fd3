"""One dense kernel, static vs dynamic builds: does the specialized branch run at static speed?

``x (8, seq, 768) @ W (768, 3072)`` (W constant), our CPU schedules, host target, through the
Relax VM. Builds:

* ``static`` -- seq fixed (one build per measured seq);
* ``dynamic generic`` -- seq symbolic in [1, 128], generic kernel only;
* ``dynamic + dispatch`` -- as above with ``dispatch={"seq": [64, 128]}`` (``SpecializeKernels``:
  a static-shape branch per bucket inside the kernel);
* ``... without AnnotateNoAlias`` -- the two dynamic builds with that finalize pass removed:
  TVM 0.27's LLVM codegen then emits every kernel without ``noalias`` (the module's last
  symbol, ``shape_func``, is not ``tirx.noalias``; see
  :mod:`relax_memplan.transform.annotate_no_alias`).

Builds are timed in interleaved rounds (the machine is shared): per round, best of 3 runs
of 3 calls each; best and median over rounds are printed, with GFLOP/s, the number of
``noalias`` in each build's LLVM IR and ``static / build`` (the speed of a build relative
to the static one at that seq; target for ``dynamic + dispatch`` at a bucket: >= 0.95).
JSON goes to ``benchmarks/results/dispatch_micro.json``.

Usage: PYTHONPATH=. python benchmarks/dispatch_micro.py [--rounds 7] [--json PATH]
"""

from __future__ import annotations

import argparse
import json
import os
from pathlib import Path

os.environ.setdefault("TVM_THREAD_POOL_SPIN_COUNT", "0")

import numpy as np  # noqa: E402
import tvm  # noqa: E402
from tvm import relax  # noqa: E402

from relax_memplan.pipeline import backend_phases, get_pipeline  # noqa: E402
from relax_memplan.schedules import host_target  # noqa: E402

REPO = Path(__file__).resolve().parents[1]
SEQS = (64, 128, 100)
RANGES = {"seq": (1, 128)}
BUCKETS = {"seq": [64, 128]}


def _dense(seq, w):
    bb = relax.BlockBuilder()
    x = relax.Var("x", relax.TensorType([8, seq, 768], "float32"))
    with bb.function("main", [x]):
        with bb.dataflow():
            out = bb.emit_output(bb.emit(relax.op.matmul(x, relax.const(w))))
        bb.emit_func_output(out)
    return bb.get()


def _noalias(ex) -> int:
    for mod in [ex.mod] + list(getattr(ex.mod, "imports", []) or []):
        try:
            source = mod.inspect_source("ll")
        except Exception:  # noqa: BLE001 - modules without LLVM IR
            continue
        if "define" in source:
            return source.count("noalias")
    return -1


def _without_annotate_no_alias(tgt, **kwargs) -> tvm.transform.Pass:
    """Our pipeline with the ``AnnotateNoAlias`` pass left out (what TVM alone would emit)."""
    phases = [[p for p in passes if p.info.name != "AnnotateNoAlias"]
              for _name, passes in backend_phases(tgt, **kwargs)]

    @tvm.transform.module_pass(opt_level=0, name="WithoutAnnotateNoAlias")
    def _pipeline(mod, _ctx):
        with tgt:
            for passes in phases:
                mod = tvm.transform.Sequential(passes)(mod)
        return mod

    return _pipeline


def _builds(w, tgt):
    seq = tvm.tirx.Var("seq", "int64")
    out = {}
    for name, kwargs in [("dynamic generic", {}), ("dynamic + dispatch", {"dispatch": BUCKETS})]:
        out[name] = tvm.compile(_dense(seq, w), tgt, relax_pipeline=get_pipeline(
            tgt, schedule=True, dim_ranges=RANGES, **kwargs))
        out[f"{name} without AnnotateNoAlias"] = tvm.compile(
            _dense(seq, w), tgt,
            relax_pipeline=_without_annotate_no_alias(tgt, schedule=True, dim_ranges=RANGES,
                                                      **kwargs))
    return out


def measure(rounds: int) -> dict:
    """Time every build at every seq of :data:`SEQS`; returns the JSON-ready result."""
    rng = np.random.default_rng(0)
    w = (rng.standard_normal((768, 3072)) * 0.02).astype("float32")
    tgt = host_target()
    dynamic = _builds(w, tgt)
    rows = []
    for s in SEQS:
        builds = {"static": tvm.compile(_dense(s, w), tgt,
                                        relax_pipeline=get_pipeline(tgt, schedule=True))}
        builds.update(dynamic)
        x = rng.standard_normal((8, s, 768)).astype("float32")
        xs = tvm.runtime.tensor(x)
        timers = {}
        for name, ex in builds.items():
            vm = relax.VirtualMachine(ex, tvm.cpu())
            np.testing.assert_allclose(vm["main"](xs).numpy(), x @ w, rtol=1e-3, atol=1e-3)
            timers[name] = vm.time_evaluator("main", tvm.cpu(), number=3, repeat=3)
        times = {name: [] for name in builds}
        for _ in range(rounds):
            for name, timer in timers.items():
                times[name].append(min(timer(xs).results))
        gflop = 2 * 8 * s * 768 * 3072 / 1e9
        static_best = min(times["static"])
        for name in builds:
            best = min(times[name])
            rows.append(dict(seq=s, build=name, bucket=s in BUCKETS["seq"],
                             best_ms=best * 1e3, median_ms=float(np.median(times[name])) * 1e3,
                             gflops=gflop / best, noalias=_noalias(builds[name]),
                             speed_vs_static=static_best / best))
    return dict(target=str(tgt), rounds=rounds, buckets=BUCKETS, rows=rows)


def main(argv=None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=7)
    parser.add_argument("--json", type=Path, default=REPO / "benchmarks/results/dispatch_micro.json")
    args = parser.parse_args(argv)
    result = measure(args.rounds)
    print(f"target {result['target']}, best / median of {args.rounds} interleaved rounds")
    print(f"{'seq':>4}  {'build':<40} {'best ms':>8} {'median':>8} {'GFLOP/s':>8} "
          f"{'noalias':>7} {'static/build':>12}")
    for r in result["rows"]:
        print(f"{r['seq']:>4}  {r['build']:<40} {r['best_ms']:8.1f} {r['median_ms']:8.1f} "
              f"{r['gflops']:8.1f} {r['noalias']:7d} {r['speed_vs_static']:12.2f}")
    args.json.parent.mkdir(parents=True, exist_ok=True)
    args.json.write_text(json.dumps(result, indent=1) + "\n", encoding="utf-8")
    print(f"wrote {args.json}")


if __name__ == "__main__":
    main()
