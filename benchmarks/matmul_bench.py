"""Benchmark the CPU matmul schedules at BERT-base shapes against TVM's default and numpy.

Each case is one legalized ``relax.matmul`` PrimFunc, compiled four ways and timed side by
side in one run (``time_evaluator``, best of ``--rounds`` interleaved rounds):

* ``tvm_default`` -- legalized, unscheduled (what TVM 0.27 runs on CPU);
* ``ours_static`` -- :class:`~relax_memplan.schedules.StaticMatmul`, all extents constant;
* ``ours_generic`` -- :class:`~relax_memplan.schedules.GenericMatmul`, compiled with the row
  dim ``M`` symbolic and run at the same ``M``;
* ``numpy`` -- ``np.matmul`` (its BLAS).

The machine may be shared: variants are timed in interleaved rounds and the best round of
each is kept (see :func:`bench_case`).

Shapes (``M = batch * seq`` with batch 8): dense ``MxKxN`` 1024x768x768, 1024x768x3072,
1024x3072x768, 512x768x768 (seq 64), the 3-D dense ``(batch, seq, K) @ (K, N)`` of a
transformer layer, 8 x 128 x 768 x 768 and 2 x 17 x 768 x 768 (generic: ``batch`` and ``seq``
both symbolic, ``seq`` not a multiple of the row tile), and attention batch-matmuls
96 x (128x64 @ 64x128) and 96 x (128x128 @ 128x64). GFLOP/s = 2*B*M*N*K / time. Ratios: ours/numpy GFLOP/s and
static/generic time. ``--mcpu`` adds a second set of TVM columns built for that CPU (the
pipeline default target is plain ``llvm``, i.e. SSE2 on x86-64); ``--host`` adds one for
:func:`relax_memplan.schedules.host_target` (this machine's CPU).

Usage::

    PYTHONPATH=. python benchmarks/matmul_bench.py --mcpu znver3 --rounds 3
    PYTHONPATH=. python benchmarks/matmul_bench.py --host --no-default

The unscheduled default runs at ~1 GFLOP/s: the full run takes ~4 minutes on 2 cores
(``--no-default`` skips it).
"""

from __future__ import annotations

import argparse
import json
import sys
import timeit
from pathlib import Path

import numpy as np

REPO_ROOT = Path(__file__).resolve().parents[1]
DEFAULT_JSON = REPO_ROOT / "benchmarks" / "results" / "matmul_bench.json"

# (name, batch or None, M, K, N); names starting with "dense3d" are (batch, M, K) @ (K, N)
CASES = [
    ("dense_1024x768x768", None, 1024, 768, 768),
    ("dense_1024x768x3072", None, 1024, 768, 3072),
    ("dense_1024x3072x768", None, 1024, 3072, 768),
    ("dense_512x768x768", None, 512, 768, 768),
    ("dense3d_8x128x768x768", 8, 128, 768, 768),
    ("dense3d_2x17x768x768", 2, 17, 768, 768),
    ("bmm_96x128x64x128", 96, 128, 64, 128),
    ("bmm_96x128x128x64", 96, 128, 128, 64),
]


def _imports():
    try:
        import relax_memplan.schedules  # noqa: F401
    except ImportError:
        sys.path.insert(0, str(REPO_ROOT))
    import tvm
    from tvm import relax

    from relax_memplan import schedules

    return tvm, relax, schedules


def matmul_prim_func(tvm, relax, batch, m, k, n, dense3d=False):
    """The legalized PrimFunc of ``relax.matmul`` ((batch,) m x k @ (batch,) k x n).

    ``m`` (and ``batch``) may be a ``tvm.tirx.Var`` (symbolic rows). With ``dense3d`` the
    weight has no batch dim: ``(batch, m, k) @ (k, n)``.
    """
    lead = [] if batch is None else [batch]
    x = relax.Var("x", relax.TensorType(lead + [m, k], "float32"))
    w = relax.Var("w", relax.TensorType(([] if dense3d else lead) + [k, n], "float32"))
    bb = relax.BlockBuilder()
    with bb.function("main", [x, w]):
        out = bb.emit(relax.op.matmul(x, w))
        bb.emit_func_output(out)
    mod = relax.transform.LegalizeOps()(bb.get())
    funcs = [f for _, f in mod.functions_items() if isinstance(f, tvm.tirx.PrimFunc)]
    assert len(funcs) == 1
    return funcs[0].with_attr("global_symbol", "main")


def _compile(tvm, func, target):
    return tvm.compile(tvm.IRModule({"main": func}), target=target).jit()


def bench_case(tvm, relax, schedules, case, targets, rounds, with_default):
    """Time one shape; return a JSON-ready dict.

    All variants are compiled first, then timed in ``rounds`` interleaved rounds (each
    variant once per round, >= 100 ms each); the best round counts, so load from other
    processes hits every variant alike.
    """
    name, batch, m, k, n = case
    flops = 2.0 * (batch or 1) * m * n * k
    lead = (batch,) if batch else ()
    dense3d = name.startswith("dense3d")
    rng = np.random.default_rng(0)
    a = rng.standard_normal(lead + (m, k), dtype="float32")
    b = rng.standard_normal(((), lead)[not dense3d] + (k, n), dtype="float32")
    ref = np.matmul(a, b)
    static_f = matmul_prim_func(tvm, relax, batch, m, k, n, dense3d)
    sym_batch = tvm.tirx.Var("batch", "int64") if dense3d else batch
    generic_f = matmul_prim_func(tvm, relax, sym_batch, tvm.tirx.Var("m", "int64"), k, n,
                                 dense3d)
    dev = tvm.cpu(0)
    args = [tvm.runtime.tensor(a, dev), tvm.runtime.tensor(b, dev)]
    timers = {"numpy": None}
    for label, target in targets:
        variants = {
            f"static_{label}": schedules.schedule_prim_func(static_f, target),
            f"generic_{label}": schedules.schedule_prim_func(generic_f, target),
        }
        if with_default and label == "llvm":
            variants = {"tvm_default": static_f, **variants}
        for key, func in variants.items():
            mod = _compile(tvm, func, target)
            out = tvm.runtime.tensor(np.zeros(ref.shape, "float32"), dev)
            mod["main"](*args, out)
            np.testing.assert_allclose(out.numpy(), ref, rtol=1e-3, atol=1e-3)
            ms = 0 if key == "tvm_default" else 100
            timers[key] = (mod.time_evaluator("main", dev, number=1, repeat=1,
                                              min_repeat_ms=ms), args + [out])
    best = {key: float("inf") for key in timers}
    for _ in range(rounds):
        for key, timer in timers.items():
            if key == "numpy":
                t = min(timeit.repeat(lambda: np.matmul(a, b), number=3, repeat=3)) / 3
            else:
                t = timer[0](*timer[1]).mean
            best[key] = min(best[key], t)
    row = {"case": name, "shape": {"batch": batch, "M": m, "K": k, "N": n},
           "time_s": best, "gflops": {key: flops / t / 1e9 for key, t in best.items()}}
    for label, _ in targets:
        row[f"static_over_generic_time_{label}"] = (
            best[f"static_{label}"] / best[f"generic_{label}"])
        for vname in ("static", "generic"):
            row[f"{vname}_{label}_over_numpy"] = (
                row["gflops"][f"{vname}_{label}"] / row["gflops"]["numpy"])
    return row


def print_table(rows, labels):
    """One line per case: GFLOP/s of each variant and the ratios."""
    cols = ["numpy"] + (["tvm_default"] if "tvm_default" in rows[0]["gflops"] else [])
    for label in labels:
        cols += [f"static_{label}", f"generic_{label}"]
    head = f"{'case':22s}" + "".join(f"{c:>18s}" for c in cols)
    for label in labels:
        head += f"{'st/np ' + label:>16s}{'gen/np ' + label:>16s}{'st/gen t ' + label:>18s}"
    print("GFLOP/s")
    print(head)
    for row in rows:
        line = f"{row['case']:22s}" + "".join(f"{row['gflops'][c]:18.1f}" for c in cols)
        for label in labels:
            line += (f"{row[f'static_{label}_over_numpy']:16.2f}"
                     f"{row[f'generic_{label}_over_numpy']:16.2f}"
                     f"{row[f'static_over_generic_time_{label}']:18.2f}")
        print(line)


def main(argv=None):
    """Run the benchmark; print the table and write the JSON."""
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--mcpu", default=None,
                        help="also build for this llvm -mcpu (e.g. znver3, skylake-avx512)")
    parser.add_argument("--host", action="store_true",
                        help="also build for this machine's CPU (schedules.host_target())")
    parser.add_argument("--rounds", type=int, default=5,
                        help="interleaved timing rounds; the best counts")
    parser.add_argument("--cases", nargs="*", default=None, help="subset of case names")
    parser.add_argument("--no-default", action="store_true",
                        help="skip the (slow) unscheduled TVM default")
    parser.add_argument("--json", type=Path, default=DEFAULT_JSON)
    args = parser.parse_args(argv)
    tvm, relax, schedules = _imports()
    targets = [("llvm", tvm.target.Target({"kind": "llvm"}))]
    if args.mcpu:
        targets.append((args.mcpu, tvm.target.Target({"kind": "llvm", "mcpu": args.mcpu})))
    if args.host:
        host = schedules.host_target()
        label = "host_" + str(host.attrs.get("mcpu", "generic"))
        if all(str(t) != str(host) for _, t in targets):
            targets.append((label, host))
    cases = [c for c in CASES if not args.cases or c[0] in args.cases]
    rows = []
    for case in cases:
        rows.append(bench_case(tvm, relax, schedules, case, targets, args.rounds,
                               not args.no_default))
        print(f"done {case[0]}", file=sys.stderr, flush=True)
    print_table(rows, [label for label, _ in targets])
    args.json.parent.mkdir(parents=True, exist_ok=True)
    args.json.write_text(json.dumps({"targets": [str(t) for _, t in targets], "rows": rows},
                                    indent=1), encoding="utf-8")
    return rows


if __name__ == "__main__":
    main()
