"""Memory of real ONNX models: lower bound vs our arena vs TVM's default plan, side by side.

Each model is compiled twice in this run (our pipeline, and the same pipeline with TVM's
``StaticPlanBlockMemory`` alone), both builds are run once on the same inputs with the naive VM
allocator, and the bytes are compared. Prints a table and writes JSON.

"ours/call" and "TVM/call" are what one call of each build allocates by its static plan (every
constant-size ``alloc_storage``: arenas, storage tokens, outputs, tensors a planner leaves); the
``<=TVM`` column checks, for every function, that our arena and our whole build allocate no more
than TVM's default build (the planner keeps TVM's plan where ours would be larger: "fallback").
The script exits with an error if a function breaks that guarantee.

Usage: python benchmarks/models_bench.py [--models DIR] [--json PATH]
       python benchmarks/models_bench.py --lower-bounds [--only LABEL ...] [--conv-chain MODE]
"""

from __future__ import annotations

import argparse
import json
import time
from pathlib import Path

import numpy as np

from relax_memplan.compile import CheckOptions, compile_model
from relax_memplan.frontend.examples import example_tiny_matmuls

REPO = Path(__file__).resolve().parents[1]

# (label, file or a function making the model, shapes, input values)
MODELS = [
    ("mnist-8", "mnist-8/model.onnx", None, None),
    ("squeezenet1.0", "squeezenet1.0-randw.onnx", None, None),
    ("mobilenetv2 b1", "mobilenetv2-tiny.onnx", {"x": (1, 3, 96, 96)}, None),
    ("mobilenetv2 b5", "mobilenetv2-tiny.onnx", {"x": (5, 3, 96, 96)}, None),
    ("silero-vad (If)", "silero-vad-op18-ifless.onnx", {"input": (1, 512), "state": (2, 1, 128)},
     {"sr": np.array(16000, dtype=np.int64)}),
    ("ultraface opset9", "ultraface-rfb-320-opset9.onnx", None, None),
    ("built-in example", None, None, None),
    ("tiny 6x6 matmuls", example_tiny_matmuls, None, None),
]


def main(argv=None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--models", default=str(REPO.parent / "shared" / "models"))
    parser.add_argument("--json", default=str(REPO / "benchmarks" / "results" / "models.json"))
    args = parser.parse_args(argv)
    rows, broken = [], []
    header = (f"{'model':<18}{'LB bytes':>10}{'arena':>10}{'ours/call':>11}{'TVM/call':>11}"
              f"{'saved':>8}{'run ours':>10}{'run TVM':>10}{'allocs':>8}{'max err':>9}"
              f"{'<=TVM':>7}{'s':>6}")
    print(header)
    print("-" * len(header))
    for label, file, shapes, values in MODELS:
        path = Path(args.models) / file if isinstance(file, str) else file
        if isinstance(path, Path) and not path.exists():
            print(f"{label:<18} skipped: {path} not found")
            continue
        t0 = time.perf_counter()
        model = path() if callable(path) else path
        result = compile_model(model, shapes, check=CheckOptions(verify=True),
                               input_values=values)
        seconds = time.perf_counter() - t0
        m = result.report.main
        never_worse = {name: f.arena_bytes <= f.tvm_default_bytes
                       and f.expected_runtime_alloc_bytes <= f.tvm_default_bytes
                       for name, f in result.report.functions.items()}
        broken += [f"{label}: {name}" for name, ok in never_worse.items() if not ok]
        row = {
            "model": label,
            "lower_bound_bytes": m.lower_bound_bytes,
            "arena_bytes": m.arena_bytes,
            "planned_bytes": m.planned_bytes,
            "expected_runtime_alloc_bytes": m.expected_runtime_alloc_bytes,
            "tvm_default_bytes": m.tvm_default_bytes,
            "saved_percent": m.saved_percent,
            "fallback": {name: f.fallback for name, f in result.report.functions.items()
                         if f.fallback},
            "never_worse_than_tvm": never_worse,
            "arena_over_lower_bound": m.arena_bytes / m.lower_bound_bytes if m.lower_bound_bytes else None,
            "runtime_alloc_bytes": m.runtime_alloc_bytes,
            "tvm_default_runtime_alloc_bytes": m.tvm_default_runtime_alloc_bytes,
            "runtime_num_allocs": m.runtime_num_allocs,
            "tvm_default_runtime_num_allocs": m.tvm_default_runtime_num_allocs,
            "max_abs_error": m.max_abs_error,
            "verified": m.verified,
            "seconds": seconds,
        }
        rows.append(row)
        saved = "-" if m.saved_percent is None else f"{m.saved_percent:.1f}%"
        print(f"{label:<18}{m.lower_bound_bytes:>10,}{m.arena_bytes:>10,}"
              f"{m.expected_runtime_alloc_bytes:>11,}{m.tvm_default_bytes:>11,}{saved:>8}"
              f"{m.runtime_alloc_bytes:>10,}{m.tvm_default_runtime_alloc_bytes:>10,}"
              f"{m.runtime_num_allocs:>4}/{m.tvm_default_runtime_num_allocs:<3}"
              f"{m.max_abs_error:>9.2g}{'yes' if all(never_worse.values()) else 'NO':>7}"
              f"{seconds:>6.1f}")
        for name, f in result.report.functions.items():
            if f.fallback:
                print(f"{'':<18}{name}: keeps TVM's plan, {f.fallback}")
    out = Path(args.json)
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps({"models": rows}, indent=2) + "\n", encoding="utf-8")
    print(f"\nwritten {out}")
    if broken:
        raise SystemExit(f"our build allocates more than TVM's default in: {', '.join(broken)}")


# The 10 shared models at their usual fixed shapes (ppocr at 320x320 instead of 640x640 to
# keep one run within minutes on 2 shared cores).
SHARED_MODELS = [
    ("mnist-8", "mnist-8/model.onnx", None, None),
    ("squeezenet1.0", "squeezenet1.0-randw.onnx", None, None),
    ("mobilenetv2 b1", "mobilenetv2-tiny.onnx", {"x": (1, 3, 96, 96)}, None),
    ("ultraface", "ultraface-rfb-320-opset9.onnx", None, None),
    ("silero-vad (If)", "silero-vad-op18-ifless.onnx", {"input": (1, 512), "state": (2, 1, 128)},
     {"sr": np.array(16000, dtype=np.int64)}),
    ("magika", "magika-1.0.3.onnx", {"bytes": (1, 2048)}, None),
    ("bert-tiny", "bert-tiny-randw.onnx",
     {"input_ids": (2, 16), "attention_mask": (2, 16), "token_type_ids": (2, 16)}, None),
    ("gpt2-tiny", "gpt2-tiny-randw.onnx", {"input_ids": (2, 16)}, None),
    ("ppocrv4-det 320", "ppocrv4-det.onnx", {"x": (1, 3, 320, 320)}, None),
    ("yolov8n 320", "yolov8n-nudenet-320n.onnx", {"images": (1, 3, 320, 320)}, None),
]


def _main_bound(plan_pass, attr: str) -> int:
    """``attr`` of ``main``'s plan, from the arenas used or, after a fallback, those planned."""
    fplan = plan_pass.plans["main"]
    arenas = fplan.arenas or fplan.rejected_arenas
    return sum(getattr(a, attr) for a in arenas)


def _importer_order_bound(mod) -> int:
    """Today's lower bound: the importer's order, every kernel writing a fresh output, no conv
    chain fusion (the Relax passes only, no code generation)."""
    import tvm

    from relax_memplan.pipeline import fusion_passes, get_pipeline
    from relax_memplan.transform.plan_static_memory import PlanStaticMemory

    plan = PlanStaticMemory()
    get_pipeline("llvm", plan_pass=plan,
                 fusion_pass_list=fusion_passes(tvm.target.Target("llvm"), "off"))(mod)
    return _main_bound(plan, "lower_bound_bytes")


def _peak_outside_first_peak(plan_pass, nested_attr: str) -> int:
    """``main``'s peak live bytes over the steps outside the first run of steps at the peak
    (yolov8n: the stem conv ties with the first C2f concat; this shows the concat's level)."""
    from relax_memplan.planner import Buffer
    from relax_memplan.transform._concat_plan import step_live_bytes
    from relax_memplan.transform._inplace_plan import merged_buffers

    fplan = plan_pass.plans["main"]
    align = plan_pass.alignment_bytes
    by_uid = {t.uid: t for t in fplan.liveness.tensors}
    live = 0
    for arena in fplan.arenas or fplan.rejected_arenas:
        buffers = [Buffer(u, by_uid[u].start, by_uid[u].end,
                          -(-max(by_uid[u].size_bytes, 1) // align) * align, align)
                   for u in arena.offsets]
        live = live + step_live_bytes(merged_buffers(buffers, getattr(arena, nested_attr)),
                                      fplan.liveness.num_steps)
    at_peak = np.flatnonzero(live == live.max())
    first_run_end = at_peak[0] + next((k for k, s in enumerate(at_peak) if s != at_peak[0] + k),
                                      len(at_peak))
    rest = np.concatenate([live[:at_peak[0]], live[first_run_end:]])
    return int(rest.max()) if rest.size else 0


def _bound_row(label, path, shapes, values, conv_chain: str = "auto") -> dict:
    """One model: today's bound, then one verified build with reordering, in-place,
    concatenations written in place and the ``conv_chain`` mode of FuseConvChain."""
    from relax_memplan.compile.model import _import, compile_model
    from relax_memplan.compile.options import BuildOptions, CheckOptions
    from relax_memplan.transform.plan_static_memory import PlanStaticMemory
    from relax_memplan.transform.reorder_for_memory import ReorderForMemory

    t0 = time.perf_counter()
    _, _, mod, _ = _import(str(path), shapes, {}, True, lambda _m: None)
    before = _importer_order_bound(mod)
    plan, reorder = PlanStaticMemory(inplace=True, concat_inplace=True), ReorderForMemory()
    result = compile_model(str(path), shapes, options=BuildOptions(
        plan_pass=plan, reorder_pass=reorder, fusion_conv_chain=conv_chain),
        check=CheckOptions(verify=True), input_values=values)
    m = result.report.main
    return {"model": label, "lower_bound_importer_order_bytes": before,
            "lower_bound_reordered_bytes": _main_bound(plan, "lower_bound_without_inplace_bytes"),
            "lower_bound_inplace_bytes": _main_bound(plan, "lower_bound_without_concat_bytes"),
            "lower_bound_concat_bytes": _main_bound(plan, "lower_bound_bytes"),
            "peak_outside_first_peak_inplace_bytes": _peak_outside_first_peak(
                plan, "nested_without_concat"),
            "peak_outside_first_peak_concat_bytes": _peak_outside_first_peak(plan, "nested"),
            "concat_inplace": m.concat_inplace, "concat_refusals": m.concat_refusals,
            "arena_bytes": m.arena_bytes, "tvm_default_bytes": m.tvm_default_bytes,
            "reordered_blocks": sum(b.applied for b in reorder.blocks if b.function == "main"),
            "inplace_calls": m.inplace_calls, "inplace_capable_kernels": m.inplace_capable_kernels,
            "conv_chain_mode": conv_chain,
            "conv_chains_fused": (result.report.fusion or {}).get("conv_chain", 0),
            "max_abs_error": m.max_abs_error, "verified": m.verified,
            # the report's own importer-order bound (from ReorderForMemory's input module)
            # must equal the one of the separate build above
            "report_importer_order_bytes": m.lower_bound_importer_order_bytes,
            "report_reordered_bytes": m.lower_bound_reordered_bytes,
            "seconds": round(time.perf_counter() - t0, 1)}


def lower_bounds(argv=None) -> None:
    """The lower bound in the importer's order (no conv chain fusion), after ReorderForMemory,
    after in-place reuse, after concatenations written in place and FuseConvChain
    (``--conv-chain``, default auto), our arena and TVM's default, on the 10 shared models;
    prints a table, writes JSON. "2nd pk": peak outside the first run of steps at the peak,
    with in-place reuse and with concats in place too."""
    parser = argparse.ArgumentParser(description=lower_bounds.__doc__.splitlines()[0])
    parser.add_argument("--models", default=str(REPO.parent / "shared" / "models"))
    parser.add_argument("--json", default=str(REPO / "benchmarks" / "results" /
                                              "lower_bounds.json"))
    parser.add_argument("--only", nargs="*", help="labels to run (default: all)")
    parser.add_argument("--conv-chain", default="auto", choices=["auto", "memory", "off"],
                        help="FuseConvChain mode of the build (default auto)")
    args = parser.parse_args(argv)
    print(f"{'model':<17}{'LB importer':>12}{'reordered':>11}{'in-place':>10}{'concat':>10}"
          f"{'new/old':>8}{'2nd pk ip':>10}{'2nd pk cc':>10}{'arena':>10}{'TVM':>10}{'re':>4}"
          f"{'ip':>4}{'cc':>4}{'ch':>4}{'max err':>9}{'ok':>4}{'s':>6}")
    rows = []
    for label, file, shapes, values in SHARED_MODELS:
        if args.only and label not in args.only:
            continue
        try:
            r = _bound_row(label, Path(args.models) / file, shapes, values, args.conv_chain)
        except Exception as err:  # noqa: BLE001 - a model that fails is reported, not fatal
            print(f"{label:<17} failed: {str(err).splitlines()[0][:100]}")
            rows.append({"model": label, "error": str(err).splitlines()[0]})
            continue
        rows.append(r)
        old, new = r["lower_bound_importer_order_bytes"], r["lower_bound_concat_bytes"]
        print(f"{label:<17}{old:>12,}{r['lower_bound_reordered_bytes']:>11,}"
              f"{r['lower_bound_inplace_bytes']:>10,}{new:>10,}{new / old if old else 1:>8.3f}"
              f"{r['peak_outside_first_peak_inplace_bytes']:>10,}"
              f"{r['peak_outside_first_peak_concat_bytes']:>10,}"
              f"{r['arena_bytes']:>10,}{r['tvm_default_bytes']:>10,}"
              f"{r['reordered_blocks']:>4}{r['inplace_calls'] or 0:>4}{r['concat_inplace'] or 0:>4}"
              f"{r['conv_chains_fused']:>4}"
              f"{r['max_abs_error'] or 0:>9.2g}{'yes' if r['verified'] else 'NO':>4}"
              f"{r['seconds']:>6.0f}", flush=True)
        if not r["conv_chains_fused"] and (r["report_importer_order_bytes"],
                                           r["report_reordered_bytes"]) != \
                (old, r["lower_bound_reordered_bytes"]):  # fused chains: another graph
            print(f"!!! {label}: the report says importer's order "
                  f"{r['report_importer_order_bytes']:,} / reordered "
                  f"{r['report_reordered_bytes']:,} B !!!", flush=True)
    out = Path(args.json)
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps({"models": rows}, indent=2) + "\n", encoding="utf-8")
    print(f"\nwritten {out}")


if __name__ == "__main__":
    import sys

    if "--lower-bounds" in sys.argv:
        lower_bounds([a for a in sys.argv[1:] if a != "--lower-bounds"])
    else:
        main()
