"""Our graph-level fusion vs TVM's FuseOps alone: kernels per call, lower bound, time, error.

Each model is imported with fixed shapes (batch 1, seq 128 by default) and built twice with the
same pipeline (our planner), ``fusion=False`` (TVM's FuseOps/FuseTIR alone) and
``fusion=True`` (:func:`relax_memplan.pipeline.fusion_passes` first). For each build:

* kernels per call: the packed calls one ``main`` call makes that are not ``vm.builtin.*``
  (counted by the VM's instrument hook);
* the lower bound of ``main``: the peak of live bytes at any step, in importer order, without
  in-place reuse (:class:`~relax_memplan.transform.PlanStaticMemory`), and our arena;
* median wall time of one call (``--repeat`` calls after ``--warmup``), the two builds
  interleaved so machine noise hits both;
* the max error relative to max|onnxruntime output|.

The other shared models (mnist-8, squeezenet1.0, mobilenetv2-tiny 1x3x96x96, ultraface) are built
the same way at their own fixed shapes; every model also gets onnxruntime's optimized-graph node
count (``ORT_ENABLE_ALL``) and its median ms per call (same thread count, interleaved with the
two builds), and a ratio table closes the run.

Last run (``--schedule --kernel-seqs '' --repeat 20 --json benchmarks/results/fusion.json``,
seq 128, machine shared with other jobs, so the times are loose): kernels ours / FuseOps alone
bert-tiny 29/41 (0.71), gpt2-tiny 22/40 (0.55), the CNNs 1.00 (nothing to fuse); onnxruntime's
optimized graphs have 114 and 119 nodes for bert-tiny and gpt2-tiny; lower bound unchanged at
seq 128 except gpt2-tiny, 589,824 -> 458,752 B (0.78: FoldMatmulReshape puts the GELU into its
matmul, one (seq, 512) tensor fewer at the peak); time ours / FuseOps alone 0.88-1.08 over two
runs (noise of this machine; onnxruntime 1.7-7.5x faster than both on these small models).

Reading the numbers (bert-tiny and gpt2-tiny, seq 128): 12 kernels fewer per call (per layer the
7 attention kernels, three of them transposes, become 1). The lower bound does not move at seq 128:
the peak of live bytes sits in the feed-forward block ((seq, 512) intermediate), not at the
(1, 2, seq, seq) score tensors the fusion removes; it moves where seq^2 * heads outgrows
seq * 4 * hidden. Wall times on the shared 2-core machine vary run to run by up to 2x: compare
the ratio within one run only.

Per kernel (``--kernel-seqs``, default 32,128,256; always with our CPU schedules): the time of
the fused attention kernel against the kernels it replaces, both timed with the VM's instrument
hook (a timestamp before and after each packed call), min over interleaved rounds. The replaced
kernels are the multiset difference of the two builds' kernel calls, names without their
numbers (``fused_matmul1_multiply1_add5`` -> ``fused_matmul_multiply_add``): the QK^T matmul with
scale and mask, the softmax, the PV matmul and the transposes. bert-tiny and gpt2-tiny embed at
most 128 positions, so the rows are bert-tiny at seq <= 128 and one attention block of bert-tiny's
shape (2 heads of 64, additive mask (1, 1, 1, seq)) at every seq. Reading them: the fused kernel
took 0.53-0.55x the replaced kernels at seq 32 and 0.82-0.87x for the single block at seq 128
and 256 over several runs (bert-tiny at 128: fused 0.80 ms, replaced 0.98-1.8 ms, the most
load-sensitive number); the ratio is the figure to compare, the ms move with the machine's load.

Usage: python benchmarks/fusion_bench.py [--seq 128] [--schedule] [--kernel-seqs 32,128,256]
[--kernels-only] [--json PATH]
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

from typing import Optional

import numpy as np
import onnx
import tvm
from tvm import relax

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))  # measure this checkout, not another installed copy

from relax_memplan.compile import build  # noqa: E402
from relax_memplan.pipeline import PipelineOptions, PipelinePasses  # noqa: E402
from relax_memplan.report.fusion_summary import ort_optimized_nodes  # noqa: E402
from relax_memplan.frontend import import_onnx, make_random_inputs, run_onnxruntime  # noqa: E402
from relax_memplan.runtime import kernel_profile, kernels_per_call  # noqa: E402
from relax_memplan.transform.plan_static_memory import PlanStaticMemory  # noqa: E402

MODELS = {"bert-tiny": "bert-tiny-randw.onnx", "gpt2-tiny": "gpt2-tiny-randw.onnx"}
# the other shared models (fixed shapes as in models_bench.py; None: the model's own)
OTHER_MODELS = {"mnist-8": ("mnist-8/model.onnx", None),
                "squeezenet1.0": ("squeezenet1.0-randw.onnx", None),
                "mobilenetv2-tiny": ("mobilenetv2-tiny.onnx", {"x": (1, 3, 96, 96)}),
                "ultraface": ("ultraface-rfb-320-opset9.onnx", None)}


def _median_s(call, repeat: int) -> float:
    times = []
    for _ in range(repeat):
        t0 = time.perf_counter()
        call()
        times.append(time.perf_counter() - t0)
    return float(np.median(times))


def _median_call_s(vm, args, repeat: int) -> float:
    return _median_s(lambda: vm["main"](*args), repeat)


def attention_kernel_ms(mod, args, rounds: int = 10, repeats: int = 7):
    """(fused attention ms, ms of the kernels it replaces) per ``main`` call, both scheduled."""
    vms = {}
    for fusion in (False, True):
        ex = build(mod, "llvm", PipelineOptions(fusion=fusion, schedule=True),
                   PipelinePasses(plan=PlanStaticMemory()))
        vms[fusion] = relax.VirtualMachine(ex, tvm.cpu())
        vms[fusion]["main"](*args)
    fused, replaced = [], []
    for _ in range(repeats):  # interleaved; the min is the least disturbed round
        plain, ours = (kernel_profile(vms[f], args, rounds) for f in (False, True))
        fused.append(ours["fused_attention"][0])
        replaced.append(sum(t * (n - ours.get(k, (0, 0))[1]) / n
                            for k, (t, n) in plain.items() if n > ours.get(k, (0, 0))[1]))
    return 1e3 * min(fused), 1e3 * min(replaced)


def attention_block(seq: int, heads: int = 2, head_dim: int = 64):
    """One attention block as TVM's ONNX importer writes it (bert-tiny's shape), and inputs."""
    from tvm.script import ir as I, relax as R, tirx as T

    @I.ir_module
    class Block:
        @R.function
        def main(q: R.Tensor((1, "s", heads, head_dim), "float32"),
                 k: R.Tensor((1, "s", heads, head_dim), "float32"),
                 v: R.Tensor((1, "s", heads, head_dim), "float32"),
                 mask: R.Tensor((1, 1, 1, "s"), "float32")):
            s = T.int64()
            with R.dataflow():
                sc = R.matmul(R.permute_dims(q, [0, 2, 1, 3]), R.permute_dims(k, [0, 2, 3, 1]))
                p = R.nn.softmax(R.add(R.divide(sc, R.const(8.0, "float32")), mask), axis=-1)
                o = R.permute_dims(R.matmul(p, R.permute_dims(v, [0, 2, 1, 3])), [0, 2, 1, 3])
                R.output(o)
            return o

    mod = relax.transform.BindSymbolicVars({"s": seq})(Block)
    rng = np.random.default_rng(seq)
    shapes = [(1, seq, heads, head_dim)] * 3 + [(1, 1, 1, seq)]
    return mod, [tvm.runtime.tensor(rng.standard_normal(s).astype("float32")) for s in shapes]


def bench_kernels(models_dir: Path, seqs):
    """Rows: fused attention kernel vs the kernels it replaces, bert-tiny and one block."""
    rows = []
    bert = models_dir / MODELS["bert-tiny"]
    for seq in seqs:
        cases = [("attention block", *attention_block(seq))]
        if bert.exists() and seq <= 128:
            mod, info = import_onnx(bert, {n: (1, seq) for n in (
                "input_ids", "attention_mask", "token_type_ids")})
            feed = make_random_inputs(bert, info, seed=0)
            cases.insert(0, ("bert-tiny", mod, [tvm.runtime.tensor(x) for x in feed.values()]))
        for label, mod, args in cases:
            fused, replaced = attention_kernel_ms(mod, args)
            rows.append({"model": label, "seq": seq, "fused_attention_ms": round(fused, 4),
                         "replaced_kernels_ms": round(replaced, 4),
                         "ratio": round(fused / replaced, 3)})
            print(f"{label:<16}{seq:>5}{fused:>10.3f}{replaced:>10.3f}{fused / replaced:>8.2f}",
                  flush=True)
    return rows


def _ort_session(path: Path):
    import onnxruntime  # pylint: disable=import-outside-toplevel

    options = onnxruntime.SessionOptions()
    options.intra_op_num_threads = tvm.runtime.num_threads() if hasattr(
        tvm.runtime, "num_threads") else 0
    options.log_severity_level = 4
    return onnxruntime.InferenceSession(str(path), sess_options=options,
                                        providers=["CPUExecutionProvider"])


def bench_model(label: str, path: Path, seq: Optional[int], schedule: bool, repeat: int,
                warmup: int, shapes=None):
    """Both builds (FuseOps alone, ours) and onnxruntime on one model: one row.

    ``seq``: every input (1, seq) (the transformers); else ``shapes`` or the model's own."""
    if seq is not None:
        probe, _ = import_onnx(path, keep_dynamic=True)
        shapes = {p.name: (1, seq) for p in probe["main"].params}
    mod, info = import_onnx(path, shapes)
    feed = make_random_inputs(path, info, seed=0)
    expected = run_onnxruntime(path, feed)[0]
    args = [tvm.runtime.tensor(x) for x in feed.values()]
    builds = {}
    for fusion in (False, True):
        plan = PlanStaticMemory()
        ex = build(mod, "llvm", PipelineOptions(fusion=fusion, schedule=schedule),
                   PipelinePasses(plan=plan))
        vm = relax.VirtualMachine(ex, tvm.cpu())
        got = vm["main"](*args)
        got = (got[0] if isinstance(got, tvm.ir.Array) else got).numpy()
        main = plan.plans["main"]
        builds[fusion] = {
            "vm": vm,
            "row": {
                "kernels_per_call": kernels_per_call(vm, args),
                "lower_bound_bytes": main.lower_bound_bytes,
                "arena_bytes": main.arena_bytes,
                "max_rel_error": float(np.abs(got - expected).max() / np.abs(expected).max()),
            },
        }
    session = _ort_session(path)
    ort_call = lambda: session.run(None, feed)  # noqa: E731
    for b in builds.values():
        for _ in range(warmup):
            b["vm"]["main"](*args)
    samples = {False: [], True: [], "ort": []}
    for _ in range(5):  # interleaved rounds
        for fusion, b in builds.items():
            samples[fusion].append(_median_call_s(b["vm"], args, max(1, repeat // 5)))
        samples["ort"].append(_median_s(ort_call, max(1, repeat // 5)))
    for fusion, b in builds.items():
        b["row"]["median_call_ms"] = round(1e3 * float(np.median(samples[fusion])), 4)
    tvm_row, ours = builds[False]["row"], builds[True]["row"]
    return {"model": label, "seq": seq, "schedule": schedule, "fuseops_alone": tvm_row,
            "with_our_fusion": ours, "ort_nodes": ort_optimized_nodes(onnx.load(path)),
            "ort_median_call_ms": round(1e3 * float(np.median(samples["ort"])), 4),
            "time_ratio": round(ours["median_call_ms"] / tvm_row["median_call_ms"], 3),
            "lower_bound_ratio": round(ours["lower_bound_bytes"] / tvm_row["lower_bound_bytes"], 3)}


def main(argv=None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--models", default=str(REPO.parent / "shared" / "models"))
    parser.add_argument("--seq", type=int, default=128)
    parser.add_argument("--schedule", action="store_true", help="our CPU matmul schedules too")
    parser.add_argument("--repeat", type=int, default=50)
    parser.add_argument("--warmup", type=int, default=5)
    parser.add_argument("--kernels-only", action="store_true", help="only the per-kernel rows")
    parser.add_argument("--kernel-seqs", default="32,128,256",
                        help="seqs of the per-kernel rows ('' for none)")
    parser.add_argument("--json", default=str(REPO / "benchmarks" / "results" / "fusion.json"))
    args = parser.parse_args(argv)
    rows = []
    print(f"{'model':<17}{'build':<14}{'kernels':>8}{'LB bytes':>12}{'arena':>12}"
          f"{'ms/call':>9}{'rel err':>9}")
    todo = [(label, file, args.seq, None) for label, file in MODELS.items()]
    todo += [(label, file, None, shapes) for label, (file, shapes) in OTHER_MODELS.items()]
    for label, file, seq, shapes in todo if not args.kernels_only else ():
        path = Path(args.models) / file
        if not path.exists():
            print(f"{label:<17} skipped: {path} not found")
            continue
        row = bench_model(label, path, seq, args.schedule, args.repeat, args.warmup, shapes)
        rows.append(row)
        for name in ("fuseops_alone", "with_our_fusion"):
            r = row[name]
            print(f"{label:<17}{name:<14}{r['kernels_per_call']:>8}{r['lower_bound_bytes']:>12,}"
                  f"{r['arena_bytes']:>12,}{r['median_call_ms']:>9.3f}{r['max_rel_error']:>9.1e}")
        print(f"{label:<17}{'onnxruntime':<14}{row['ort_nodes'] or '-':>8}{'':>24}"
              f"{row['ort_median_call_ms']:>9.3f}", flush=True)
    if rows:
        print("\nratios (ours / FuseOps alone; kernels also / onnxruntime's optimized nodes)")
        print(f"{'model':<17}{'kernels':>9}{'vs ORT':>8}{'LB':>8}{'time':>8}{'vs ORT ms':>10}")
        for row in rows:
            ours, alone = row["with_our_fusion"], row["fuseops_alone"]
            vs_ort = ours["kernels_per_call"] / row["ort_nodes"] if row["ort_nodes"] else None
            print(f"{row['model']:<17}{ours['kernels_per_call'] / alone['kernels_per_call']:>9.2f}"
                  f"{'-' if vs_ort is None else format(vs_ort, '.2f'):>8}"
                  f"{row['lower_bound_ratio']:>8.2f}{row['time_ratio']:>8.2f}"
                  f"{ours['median_call_ms'] / row['ort_median_call_ms']:>10.2f}")
    seqs = [int(x) for x in args.kernel_seqs.split(",") if x]
    kernel_rows = []
    if seqs:
        print("\nper kernel, ms per call (scheduled): fused attention vs the kernels it replaces")
        print(f"{'model':<16}{'seq':>5}{'fused':>10}{'replaced':>10}{'ratio':>8}")
        kernel_rows = bench_kernels(Path(args.models), seqs)
    out = Path(args.json)
    out.parent.mkdir(parents=True, exist_ok=True)
    threads = tvm.runtime.num_threads() if hasattr(tvm.runtime, "num_threads") else None
    out.write_text(json.dumps({"rows": rows, "kernel_rows": kernel_rows, "threads": threads},
                              indent=2) + "\n")
    print(f"wrote {out}")


if __name__ == "__main__":
    main()
