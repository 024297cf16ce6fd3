"""Normalization fusion on the full-size transformers: norms and residual + norm pairs found
and fused, and the outputs against onnxruntime.

For each model (``<dir>/<name>.onnx`` with its ``.inputs.npz``, as
``shared/models/full_size/export.py`` and ``benchmarks/export_transformers.py`` write them),
in a fresh process: import at the inputs' shapes, build with our default pipeline (llvm,
fusion on, our planner), read the fusion records of ``layer_norm`` and ``rms_norm``
(:class:`~relax_memplan.transform.fuse_normalization.FuseNormalization`: norms written as
element-wise steps) and ``add_layer_norm``/``add_rms_norm``
(:class:`~relax_memplan.transform.fuse_add_layer_norm.FuseAddLayerNorm`: residual add + norm),
run once and give the max abs error against onnxruntime relative to its largest output, and
the kernels per call; where FuseNormalization fused a norm, the kernels per call of the same
build without it (``kernels_without_norm_ops``).

Usage: python benchmarks/norm_models_bench.py [--models DIR/NAME,...] [--json PATH]
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
FULL, EXTRA = "/tmp/full_size", "/tmp/full_size_extra"
DEFAULT = ",".join([f"{FULL}/{n}" for n in ("bert_base", "bert_base_legacy", "gpt2",
                                             "gpt2_legacy", "vit_b_16", "vit_b_16_legacy",
                                             "whisper_tiny_encoder")]
                   + [f"{EXTRA}/{n}" for n in ("distilbert", "distilbert_legacy_op14",
                                               "op14/bert_base_legacy_op14", "llama_small",
                                               "t5_small_encoder", "t5_small_encoder_legacy")])
PATTERNS = ("layer_norm", "rms_norm", "add_layer_norm", "add_rms_norm")


def one_model(path: str) -> dict:
    """The row of one model (called in a fresh process)."""
    import numpy as np
    import tvm
    from tvm import relax

    from relax_memplan.compile import build
    from relax_memplan.frontend import import_onnx, run_onnxruntime
    from relax_memplan.pipeline import PipelineOptions, PipelinePasses, fusion_passes
    from relax_memplan.runtime.vm import kernels_per_call
    from relax_memplan.transform.fusion_record import pattern_records
    from relax_memplan.transform.plan_static_memory import PlanStaticMemory

    feeds = dict(np.load(f"{path}.inputs.npz"))
    mod, _ = import_onnx(f"{path}.onnx", {n: v.shape for n, v in feeds.items()})
    passes = fusion_passes(tvm.target.Target("llvm"))
    start = time.perf_counter()
    ex = build(mod, "llvm", PipelineOptions(),
               PipelinePasses(plan=PlanStaticMemory(time_limit_s=1.0), fusion=passes))
    row = {"model": Path(path).name, "compile_s": round(time.perf_counter() - start, 1)}
    records = pattern_records(passes)
    for name in PATTERNS:
        r = records[name]
        row[name] = {"candidates": r.candidates, "fused": r.fused, "refused": r.reasons()}
    vm = relax.VirtualMachine(ex, tvm.cpu())
    args = [tvm.runtime.tensor(v) for v in feeds.values()]
    row["kernels"] = kernels_per_call(vm, args)
    if records["layer_norm"].fused or records["rms_norm"].fused:
        others = [p for p in fusion_passes(tvm.target.Target("llvm"))
                  if p.info.name != "FuseNormalization"]
        base = build(mod, "llvm", PipelineOptions(),
                     PipelinePasses(plan=PlanStaticMemory(time_limit_s=1.0), fusion=others))
        row["kernels_without_norm_ops"] = kernels_per_call(
            relax.VirtualMachine(base, tvm.cpu()), args)
    got = vm["main"](*args)
    got = [x.numpy() for x in (got if isinstance(got, tvm.ir.Array) else [got])]
    ref = run_onnxruntime(f"{path}.onnx", feeds)
    row["rel_err_vs_ort"] = max(float(np.abs(g - r).max() / max(np.abs(r).max(), 1e-6))
                                for g, r in zip(got, ref))
    return row


def _child(path: str) -> dict:
    env = dict(os.environ, PYTHONPATH=str(REPO))
    env.setdefault("TVM_NUM_THREADS", "2")
    done = subprocess.run([sys.executable, __file__, "--child", path], env=env,
                          capture_output=True, text=True, check=False)
    lines = [x for x in done.stdout.splitlines() if x.startswith("{")]
    if done.returncode or not lines:
        return {"model": Path(path).name,
                "error": (done.stderr.strip().splitlines() or ["?"])[-1][:300]}
    return json.loads(lines[-1])


def _cell(entry) -> str:
    if not entry["candidates"]:
        return "-"
    why = "; ".join(f"{n} x {r}" for r, n in entry["refused"].items())
    return f"{entry['fused']}/{entry['candidates']}" + (f" ({why})" if why else "")


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--models", default=DEFAULT)
    parser.add_argument("--json", default=str(REPO / "benchmarks" / "results" /
                                              "norm_models.json"))
    parser.add_argument("--child", help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.child:
        print(json.dumps(one_model(args.child)))
        return 0
    rows = []
    for path in args.models.split(","):
        if not Path(f"{path}.onnx").exists():
            rows.append({"model": Path(path).name, "error": "not exported"})
            continue
        rows.append(_child(path))
        row = rows[-1]
        cells = " | ".join(_cell(row[p]) if p in row else "" for p in PATTERNS)
        print(f"{row['model']} | {cells} | {row.get('rel_err_vs_ort', row.get('error'))}",
              flush=True)
    Path(args.json).write_text(json.dumps(rows, indent=1) + "\n", encoding="utf-8")
    return 0


if __name__ == "__main__":
    sys.exit(main())
