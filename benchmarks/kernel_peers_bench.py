"""Where the time goes, kernel class by kernel class: our fast build vs onnxruntime and OpenVINO.

For each model, in one worker process per thread count (TVM reads ``TVM_NUM_THREADS`` once):

* ours: ``get_pipeline(host_target(), schedule=True)`` (our CPU schedules for this CPU, fusion
  on), each kernel timed with the VM's instrument hook (``kernel_profile``);
* onnxruntime: default session options at ``intra_op_num_threads``; per node from its
  profiler, the total from runs with profiling off;
* OpenVINO CPU: ``INFERENCE_NUM_THREADS``, at ``f32`` (same arithmetic as ours) and at the
  plugin's default precision (bf16 on CPUs with AVX-512 BF16, as this one); per node from
  ``PERF_COUNT``, the total from a model compiled without it.

Convolutions and matmuls are matched across runtimes by their shapes
(``_peer_profiles.conv_signature``: ``conv3x3 s1 256->256 14x14``); the table gives per class
(``conv3x3 s1``, ``conv1x1 s2``, ``dwconv3x3 s1``, ``matmul``, ...) the time of each runtime,
and per signature (largest of ours first) the time and GMAC/s per thread of each. At one thread
times are CPU time (the calling thread for ours and onnxruntime, the process for OpenVINO,
whose inference runs in its own worker), immune to other processes on a shared host; at more
threads, wall time. The peers' per-node times are their profilers' shares of the run's time
with profiling off (``_peer_profiles.scaled_to_total``: the profilers give wall time, which a
shared host inflates); ours are the instrument hook's own times.

Usage: python benchmarks/kernel_peers_bench.py [--only resnet50 yolov8n ...] [--threads 1 2]
       [--rounds 10] [--top 12] [--full-size /tmp/full_size]
       [--json benchmarks/results/kernel_peers.json]
       python benchmarks/kernel_peers_bench.py --load benchmarks/results/kernel_peers.json
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
from collections import defaultdict
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))  # measure this checkout, not another installed copy
sys.path.insert(0, str(REPO / "benchmarks"))

SHARED = REPO.parent / "shared" / "models"
# (label, file under the shared models or the full-size folder, shapes)
SHARED_MODELS = [
    ("squeezenet1.0", "squeezenet1.0-randw.onnx", {"data_0": (1, 3, 224, 224)}),
    ("mobilenetv2-tiny", "mobilenetv2-tiny.onnx", {"x": (1, 3, 96, 96)}),
    ("yolov8n", "yolov8n-nudenet-320n.onnx", {"images": (1, 3, 320, 320)}),
    ("ppocrv4-det", "ppocrv4-det.onnx", {"x": (1, 3, 320, 320)}),
    ("ultraface-320", "ultraface-rfb-320-opset9.onnx", None),
    ("magika", "magika-1.0.3.onnx", {"bytes": (1, 2048)}),
    ("bert-tiny", "bert-tiny-randw.onnx", {"input_ids": (1, 128), "attention_mask": (1, 128),
                                           "token_type_ids": (1, 128)}),
]
FULL_SIZE = ["resnet50", "mobilenet_v2", "bert_base", "gpt2", "vit_b_16"]
EXTRA = ["efficientnet_b0", "convnext_tiny", "swin_t"]
"""Exported by ``benchmarks/export_extra_cnns.py`` (EfficientNet-B0, ConvNeXt-T) or beside it."""


def model_list(full_size_dir: Path, only, extra_dir: Path = Path("/tmp/full_size_extra")):
    """``(label, path, shapes)`` of the models present, in ``only``'s order if given."""
    found = [(label, SHARED / file, shapes) for label, file, shapes in SHARED_MODELS]
    for folder, name in [(full_size_dir, n) for n in FULL_SIZE] + [(extra_dir, n) for n in EXTRA]:
        meta = folder / f"{name}.meta.json"
        if meta.exists():
            typical = json.loads(meta.read_text()).get("typical_shape")
            # no typical shape (swin_t's meta): the importer sets the batch dim to 1
            shapes = {k: tuple(v) for k, v in typical.items()} if typical else None
            found.append((name, folder / f"{name}.onnx", shapes))
    by_label = {m[0]: m for m in found if m[1].exists()}
    if only:
        missing = [o for o in only if o not in by_label]
        if missing:
            raise SystemExit(f"unknown or missing model(s) {missing}; present: {list(by_label)}")
        return [by_label[o] for o in only]
    return list(by_label.values())


def bench_model(label, path, shapes, threads: int, rounds: int) -> dict:
    from _peer_profiles import ort_profile, ours_profile, ov_profile

    load = [os.getloadavg()[0]]
    ours = ours_profile(path, shapes, rounds, threads)
    feeds = ours.pop("feeds")
    with tempfile.TemporaryDirectory() as tmp:
        ort = ort_profile(path, feeds, rounds, threads, tmp)
    ov = ov_profile(path, feeds, rounds, threads, "f32")
    ov_default = ov_profile(path, feeds, rounds, threads, "default")
    load.append(os.getloadavg()[0])
    return {"model": label, "threads": threads, "load_1min": load, "ours": ours, "ort": ort,
            "ov_f32": ov, "ov_default": ov_default}


RUNTIMES = ("ours", "ort", "ov_f32")


def _by(kernels, key) -> dict:
    out = defaultdict(lambda: [0.0, 0, 0])  # ms, calls, macs
    for k in kernels:
        name = k.get(key) or k.get("class")
        out[name][0] += k["ms"]
        out[name][1] += k.get("calls", 1)
        out[name][2] += k.get("macs", 0) or 0
    return out


def summarize(row: dict, top: int) -> dict:
    """Per-class and per-signature sums of each runtime (ms per call)."""
    classes = {rt: _by(row[rt]["kernels"], "class") for rt in RUNTIMES}
    sigs = {rt: _by([k for k in row[rt]["kernels"] if k.get("signature")], "signature")
            for rt in RUNTIMES}
    rules = defaultdict(set)
    for k in row["ours"]["kernels"]:
        if k.get("signature"):
            rules[k["signature"]].add(k["rule"])
    ranked = sorted(sigs["ours"], key=lambda s: -sigs["ours"][s][0])[:top]
    return {"classes": {c: {rt: classes[rt][c][0] if c in classes[rt] else None
                            for rt in RUNTIMES}
                        for c in sorted(set().union(*classes.values()),
                                        key=lambda c: -max(classes[rt][c][0] if c in classes[rt]
                                                           else 0 for rt in RUNTIMES))},
            "signatures": [{"signature": s, "count": sigs["ours"][s][1],
                            "rules": sorted(rules[s]), "macs": sigs["ours"][s][2],
                            **{rt: sigs[rt][s][0] if s in sigs[rt] else None
                               for rt in RUNTIMES}} for s in ranked]}


def _f(ms) -> str:
    return f"{ms:>9.3f}" if ms is not None else f"{'-':>9}"


def _g(macs, ms, threads) -> str:
    return f"{macs / ms / 1e6 / threads:>7.0f}" if ms else f"{'-':>7}"


def print_row(row: dict, top: int) -> None:
    t = row["threads"]
    totals = {rt: row[rt]["total_ms"] for rt in RUNTIMES + ("ov_default",)}
    print(f"\n{row['model']} ({t} thread{'s' if t > 1 else ''}, load "
          f"{row['load_1min'][0]:.1f}-{row['load_1min'][1]:.1f}): total ms ours "
          f"{totals['ours']:.2f}, ort {totals['ort']:.2f}, ov f32 {totals['ov_f32']:.2f}, "
          f"ov default ({row['ov_default']['precision']}) {totals['ov_default']:.2f}; "
          f"ours/ort {totals['ours'] / totals['ort']:.2f}, ours/ov_f32 "
          f"{totals['ours'] / totals['ov_f32']:.2f}, ours/ov_default "
          f"{totals['ours'] / totals['ov_default']:.2f}")
    summary = summarize(row, top)
    print(f"  {'class (sum of kernel ms)':<32}{'ours':>9}{'ort':>9}{'ov_f32':>9}")
    for cls, times in summary["classes"].items():
        print(f"  {cls:<32}" + "".join(_f(times[rt]) for rt in RUNTIMES))
    print(f"  {'signature (x count)':<44}{'rule':<20}{'ours':>9}{'ort':>9}{'ov_f32':>9}"
          f"{'G/s/t':>7}{'ort':>7}{'ov':>7}")
    for s in summary["signatures"]:
        print(f"  {(s['signature'] + ' x' + str(s['count']))[:43]:<44}"
              f"{','.join(s['rules'])[:19]:<20}"
              + "".join(_f(s[rt]) for rt in RUNTIMES)
              + "".join(_g(s["macs"], s[rt], t) for rt in RUNTIMES))


def _worker(args) -> None:
    for label, path, shapes in model_list(Path(args.full_size), args.only, Path(args.extra)):
        try:
            row = bench_model(label, path, shapes, args.worker_threads, args.rounds)
        except Exception as err:  # noqa: BLE001 -- one model failing must not stop the others
            row = {"model": label, "threads": args.worker_threads,
                   "error": f"{type(err).__name__}: {err}"[:500]}
        print("ROW " + json.dumps(row), flush=True)


def main(argv=None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--only", nargs="*")
    parser.add_argument("--threads", type=int, nargs="+", default=[1])
    parser.add_argument("--rounds", type=int, default=10)
    parser.add_argument("--top", type=int, default=12)
    parser.add_argument("--full-size", default=os.environ.get("FULL_SIZE_MODELS",
                                                              "/tmp/full_size"))
    parser.add_argument("--extra", default="/tmp/full_size_extra",
                        help="folder of EfficientNet-B0, ConvNeXt-T, Swin-T (export_extra_cnns.py)")
    parser.add_argument("--json", default=str(REPO / "benchmarks" / "results"
                                              / "kernel_peers.json"))
    parser.add_argument("--load", help="print the tables of an earlier JSON file")
    parser.add_argument("--worker-threads", type=int, help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.worker_threads:
        _worker(args)
        return
    if args.load:
        rows = json.loads(Path(args.load).read_text())["rows"]
    else:
        rows = []
        for t in args.threads:
            cmd = [sys.executable, __file__, "--worker-threads", str(t), "--rounds",
                   str(args.rounds), "--full-size", args.full_size, "--extra", args.extra]
            if args.only:
                cmd += ["--only", *args.only]
            env = dict(os.environ, TVM_NUM_THREADS=str(t))
            proc = subprocess.run(cmd, env=env, text=True, stdout=subprocess.PIPE, check=False)
            rows += [json.loads(line[4:]) for line in proc.stdout.splitlines()
                     if line.startswith("ROW ")]
    for row in rows:
        if "error" in row:
            print(f"\n{row['model']} ({row['threads']} threads): FAILED {row['error'][:200]}")
        else:
            print_row(row, args.top)
    if not args.load:
        Path(args.json).parent.mkdir(parents=True, exist_ok=True)
        Path(args.json).write_text(json.dumps({"rounds": args.rounds, "rows": rows}, indent=1))
        print(f"\nwrote {args.json}")


if __name__ == "__main__":
    main()
