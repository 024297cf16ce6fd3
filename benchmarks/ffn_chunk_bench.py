"""ChunkFeedForward on the BERT case: row 5 of bert_case.py with and without the FFN chunking.

Both builds are bert_case's row 5 (exact arena + kernel specialization + our fusion, batch 8,
seq in [1, max-seq]); the second drops ``ChunkFeedForward`` from the fusion passes. Per seq:
the exact plan's lower bound (peak live bytes) of each and their ratio, bytes allocated per
call, max abs error against onnxruntime, and median ms per call (rows and onnxruntime
interleaved, ``--repeats`` rounds after a warm-up: the machine is shared, read the ms as a
range). JSON under benchmarks/results/.

Usage: PYTHONPATH=. python benchmarks/ffn_chunk_bench.py [--layers 1] [--seqs 128,256,512]
[--max-seq 512] [--repeats 3] [--json benchmarks/results/ffn_chunk.json]
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import time
from pathlib import Path

_HERE = Path(__file__).resolve().parent
_spec = importlib.util.spec_from_file_location("bert_case", _HERE / "bert_case.py")
bert_case = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(bert_case)


def compile_pair(model, cfg, target):
    """Row 5 with (``chunked``) and without (``unchunked``) ChunkFeedForward: list of rows."""
    import tvm
    from relax_memplan.frontend import import_onnx
    from relax_memplan.pipeline import fusion_counts, fusion_passes, get_pipeline
    from relax_memplan.schedules import schedule_prim_func
    from relax_memplan.transform.plan_dynamic_memory import PlanDynamicMemory
    from relax_memplan.transform.specialize_kernels import SpecializeKernels

    top = cfg["max_seq"]
    buckets = sorted(set(bert_case.BUCKETS) | {top})
    mod, _ = import_onnx(model, keep_dynamic=True)
    rows = []
    for key, keep_chunk in (("chunked", True), ("unchunked", False)):
        spec = SpecializeKernels({"seq": buckets}, schedule=schedule_prim_func)
        exact = PlanDynamicMemory(strategy="exact")
        passes = [p for p in fusion_passes(target)
                  if keep_chunk or p.info.name != "ChunkFeedForward"]
        t0 = time.perf_counter()
        ex = tvm.compile(mod, target, relax_pipeline=get_pipeline(
            target, dynamic_pass=exact, dim_ranges={"batch": (cfg["batch"],) * 2,
                                                    "seq": (1, top)},
            dispatch_pass=spec, schedule=True, fusion=True, fusion_pass_list=passes))
        rows.append(dict(key=key, label=f"5 fused, FFN {key}", ex=ex, allocator="naive",
                         compile_s=time.perf_counter() - t0, plan=exact.plans.get("main"),
                         fusion=fusion_counts(passes)))
        bert_case.log(f"compiled {key} in {rows[-1]['compile_s']:.0f} s: {rows[-1]['fusion']}")
    return rows


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--layers", type=int, default=1)
    parser.add_argument("--seqs", default="128,256,512")
    parser.add_argument("--max-seq", type=int, default=512)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--json", type=Path, default=_HERE / "results" / "ffn_chunk.json")
    args = parser.parse_args(argv)
    cfg = dict(hidden=768, layers=args.layers, heads=12, ffn=3072, batch=8,
               max_seq=args.max_seq)
    seqs = [int(s) for s in args.seqs.split(",")]
    model = bert_case.build_bert(cfg["hidden"], cfg["layers"], cfg["heads"], cfg["ffn"])
    from relax_memplan.schedules import host_target
    target = host_target()
    rows = compile_pair(model, cfg, target)
    ort_ms = bert_case.measure(rows, model, cfg, seqs, args.repeats)
    lower = {r["key"]: {s: r["plan"].bytes_at({"batch": cfg["batch"], "seq": s})[1]
                        for s in seqs} for r in rows}
    print(f"BERT-base encoder, {cfg['layers']} layer(s), batch 8; row 5 with / without "
          f"ChunkFeedForward ({args.repeats} timed rounds, shared machine: noisy)")
    print(f"{'seq':>6} {'lower chunked':>14} {'lower plain':>12} {'ratio':>6} "
          f"{'ms chunked':>11} {'ms plain':>9} {'ratio':>6} {'ort ms':>7} {'max err':>8}")
    result = dict(config=cfg, repeats=args.repeats, fusion={r["key"]: r["fusion"] for r in rows},
                  seqs={})
    for s in seqs:
        c, u = rows
        lo_r, ms_r = lower["chunked"][s] / lower["unchunked"][s], c["ms"][s] / u["ms"][s]
        err = max(c["err"][s], u["err"][s])
        print(f"{s:>6} {lower['chunked'][s]:>14,} {lower['unchunked'][s]:>12,} {lo_r:>6.3f} "
              f"{c['ms'][s]:>11.1f} {u['ms'][s]:>9.1f} {ms_r:>6.3f} {ort_ms[s]:>7.1f} "
              f"{err:>8.1e}")
        result["seqs"][s] = dict(lower_bound_bytes={k: lower[k][s] for k in lower},
                                 lower_bound_ratio=lo_r,
                                 ms={r["key"]: r["ms"][s] for r in rows}, ms_ratio=ms_r,
                                 alloc_bytes={r["key"]: r["bytes"][s] for r in rows},
                                 ort_ms=ort_ms[s], max_abs_err=err,
                                 tol=c["tol"][s])
    args.json.parent.mkdir(parents=True, exist_ok=True)
    args.json.write_text(json.dumps(result, indent=1))
    print(f"written {args.json}")


if __name__ == "__main__":
    main()
