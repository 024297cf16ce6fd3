"""Does ``--schedule`` cost memory? Lower bound and in-place reuse of ``main`` with and without
our CPU schedules, side by side, on the shared models at their usual fixed shapes and on the
full-size set.

Each model is imported once and lowered through our pipeline's Relax phases twice (no code
generation), ``schedule=False`` and ``schedule=True``, for the host CPU (``host_target()``,
the default build's target), each with the CLI's planner settings (in-place reuse,
concatenations in place, ReorderForMemory) and the conv chain mode ``auto`` (whose consumers
depend on ``schedule``, so the graphs may differ). Columns: lower bound (peak live bytes,
aligned) of each, their ratio, in-place capable kernels / calls and concatenations written in
place of each. Bytes are exact (no timing): the machine's load does not matter here.
Prints a table and writes JSON.

Usage: python benchmarks/schedule_memory_bench.py [--models DIR] [--full-size DIR]
       [--extra DIR] [--only LABEL ...] [--json PATH]
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))  # measure this checkout, not another installed copy
sys.path.insert(0, str(REPO / "benchmarks"))

from models_bench import SHARED_MODELS  # noqa: E402


# (label, file, shapes) under --full-size / --extra; None: dynamic dims set to 1 by the importer
FULL_SIZE_MODELS = [("resnet50", "resnet50.onnx", {"x": (1, 3, 224, 224)}),
                    ("mobilenet_v2", "mobilenet_v2.onnx", {"x": (1, 3, 224, 224)}),
                    ("vit_b_16", "vit_b_16.onnx", {"x": (1, 3, 224, 224)}),
                    ("bert_base", "bert_base.onnx", {n: (1, 128) for n in (
                        "input_ids", "attention_mask", "token_type_ids")}),
                    ("gpt2", "gpt2.onnx", {"input_ids": (1, 128)}),
                    ("whisper_tiny_encoder", "whisper_tiny_encoder.onnx", None)]
EXTRA_MODELS = [("efficientnet_b0", "efficientnet_b0.onnx", {"x": (1, 3, 224, 224)}),
                ("convnext_tiny", "convnext_tiny.onnx", {"x": (1, 3, 224, 224)}),
                ("swin_t", "swin_t.onnx", None)]
DDDDOCR = ("ddddocr 64x256", "/tmp/exporters-models/ddddocr/common.onnx",
           {"input1": (1, 1, 64, 256)})


def _plan_of(mod, schedule: bool):
    """``main``'s FunctionPlan after our Relax phases with or without our CPU schedules."""
    from relax_memplan.pipeline import fusion_passes, get_pipeline
    from relax_memplan.schedules import host_target
    from relax_memplan.transform import PlanStaticMemory, ReorderForMemory

    target = host_target()
    plan = PlanStaticMemory(time_limit_s=0.2, inplace=True, concat_inplace=True)
    get_pipeline(target, plan_pass=plan, schedule=schedule, reorder_pass=ReorderForMemory(),
                 fusion_pass_list=fusion_passes(target, "auto", schedule))(mod)
    return plan.plans["main"]


def _row(label: str, path: Path, shapes) -> dict:
    from relax_memplan.compile.model import _import

    t0 = time.perf_counter()
    _, _, mod, _, _ = _import(str(path), shapes, {}, True, lambda _m: None)
    row = {"model": label}
    for key, schedule in (("unscheduled", False), ("schedule", True)):
        fplan = _plan_of(mod, schedule)
        row[key] = {"lower_bound_bytes": fplan.lower_bound_bytes,
                    "lower_bound_without_inplace_bytes": fplan.lower_bound_without_inplace_bytes,
                    "inplace_capable_kernels": fplan.inplace_capable_kernels,
                    "inplace_calls": len(fplan.liveness.inplace),
                    "concat_inplace": fplan.concat_inplace}
    row["seconds"] = round(time.perf_counter() - t0, 1)
    return row


def main(argv=None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--models", default=str(REPO.parent / "shared" / "models"))
    parser.add_argument("--full-size", default="/tmp/full_size",
                        help="folder of the full-size set (skipped when absent)")
    parser.add_argument("--extra", default="/tmp/full_size_extra",
                        help="folder of efficientnet_b0, convnext_tiny, swin_t")
    parser.add_argument("--only", nargs="*", help="labels to run (default: all)")
    parser.add_argument("--json", default=str(REPO / "benchmarks" / "results" /
                                              "schedule_memory.json"))
    args = parser.parse_args(argv)
    print(f"{'model':<21}{'LB unsched':>12}{'LB sched':>12}{'sched/un':>9}"
          f"{'ip un':>8}{'ip sched':>9}{'cat':>6}{'s':>6}   (ip: capable kernels/calls; "
          f"cat: concatenations in place, unscheduled/scheduled)")
    rows = []
    models = [(label, Path(args.models) / file, shapes)
              for label, file, shapes, _values in SHARED_MODELS]
    models += [(label, Path(args.full_size) / file, shapes)
               for label, file, shapes in FULL_SIZE_MODELS]
    models += [(label, Path(args.extra) / file, shapes) for label, file, shapes in EXTRA_MODELS]
    models.append((DDDDOCR[0], Path(DDDDOCR[1]), DDDDOCR[2]))
    for label, path, shapes in models:
        if args.only and label not in args.only or not path.exists():
            continue
        try:
            r = _row(label, path, shapes)
        except Exception as err:  # noqa: BLE001 - a model that fails is reported, not fatal
            print(f"{label:<21} failed: {str(err).splitlines()[0][:100]}", flush=True)
            rows.append({"model": label, "error": str(err).splitlines()[0]})
            continue
        rows.append(r)
        u, s = r["unscheduled"], r["schedule"]
        ratio = s["lower_bound_bytes"] / u["lower_bound_bytes"] if u["lower_bound_bytes"] else 1
        print(f"{label:<21}{u['lower_bound_bytes']:>12,}{s['lower_bound_bytes']:>12,}"
              f"{ratio:>9.3f}{u['inplace_capable_kernels']:>5}/{u['inplace_calls']:<2}"
              f"{s['inplace_capable_kernels']:>6}/{s['inplace_calls']:<2}"
              f"{u['concat_inplace']:>3}/{s['concat_inplace']:<2}{r['seconds']:>6.0f}",
              flush=True)
    out = Path(args.json)
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps({"models": rows}, indent=2) + "\n", encoding="utf-8")
    print(f"\nwritten {out}")


if __name__ == "__main__":
    main()
