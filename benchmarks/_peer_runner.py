"""One runtime in a fresh process, for ``peer_bench.py``: load, call once (outputs kept), warm
up, time calls, print one JSON line.

Usage: python benchmarks/_peer_runner.py RUNTIME MODEL INPUTS.npz OUTPUTS.npz --threads N
       [--library LIB.so] [--warmup W] [--calls N] [--min-calls M] [--max-seconds S]

RUNTIME is ``ours`` (``relax_memplan.library.load_library``: manifest checked, the embedded
constants' file pages released), ``tvm`` (the same library with plain
``tvm.runtime.load_module`` and ``relax.VirtualMachine``), ``onnxruntime`` (its defaults,
``intra_op_num_threads`` = N), ``openvino`` (its defaults for the CPU device,
``INFERENCE_NUM_THREADS`` = N) or ``openvino-f32`` (the same with
``INFERENCE_PRECISION_HINT`` f32: on a CPU with bf16 support OpenVINO's default precision is
bf16). TVM's thread count comes from ``TVM_NUM_THREADS``, set by the caller.

Resident memory is read from ``/proc/self/status`` (bytes): ``VmRSS``, ``RssAnon`` (heap,
tensors), ``RssFile`` (mapped files: libraries, mapped weights) and ``VmHWM`` (the peak), after
the imports, after loading, and after the last call.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import time
from pathlib import Path

import numpy as np

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

_STATUS_KEYS = ("VmRSS", "RssAnon", "RssFile", "VmHWM")


def resident() -> dict:
    """``VmRSS``, ``RssAnon``, ``RssFile``, ``VmHWM`` of this process, in bytes."""
    out = {}
    with open("/proc/self/status", encoding="ascii") as f:
        for line in f:
            key, _, value = line.partition(":")
            if key in _STATUS_KEYS:
                out[key] = int(value.split()[0]) * 1024
    return out


def _tvm_call(runtime: str, library: str, feed):
    import tvm

    if runtime == "ours":
        from relax_memplan.library import load_library

        vm = load_library(library).vm
    else:
        from tvm import relax

        vm = relax.VirtualMachine(tvm.runtime.load_module(library), tvm.cpu())
    arity = vm._get_function_arity("main")
    names = [vm._get_function_param_name("main", i) for i in range(arity)]
    args = [tvm.runtime.tensor(np.asarray(feed[n], order="C")) for n in names]  # 0-d stays 0-d
    main = vm["main"]

    def outputs(value):
        if isinstance(value, tvm.runtime.Tensor):
            return [value.numpy()]
        return [a for v in value for a in outputs(v)]

    return (lambda: main(*args)), outputs


def _ort_call(model: str, feed, threads: int):
    import onnxruntime

    options = onnxruntime.SessionOptions()
    options.intra_op_num_threads = threads
    session = onnxruntime.InferenceSession(model, sess_options=options,
                                           providers=["CPUExecutionProvider"])
    return (lambda: session.run(None, feed)), (lambda value: [np.asarray(v) for v in value])


def _openvino_call(model: str, feed, threads: int, f32: bool):
    import openvino

    config = {"INFERENCE_NUM_THREADS": threads}
    if f32:
        config["INFERENCE_PRECISION_HINT"] = "f32"
    compiled = openvino.Core().compile_model(model, "CPU", config)
    request = compiled.create_infer_request()
    by_index = [feed[port.any_name] for port in compiled.inputs]

    def call():
        return request.infer(by_index)

    return call, (lambda value: [np.asarray(v) for v in value.values()]), \
        str(compiled.get_property("INFERENCE_PRECISION_HINT"))


def main(argv=None) -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("runtime", choices=["ours", "tvm", "onnxruntime", "openvino",
                                            "openvino-f32"])
    parser.add_argument("model")
    parser.add_argument("inputs")
    parser.add_argument("outputs")
    parser.add_argument("--library")
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--warmup", type=int, default=2)
    parser.add_argument("--calls", type=int, default=10)
    parser.add_argument("--min-calls", type=int, default=3)
    parser.add_argument("--max-seconds", type=float, default=20.0)
    args = parser.parse_args(argv)
    with np.load(args.inputs) as data:
        feed = {k: data[k] for k in data.files}
    if args.runtime in ("ours", "tvm"):  # every import before the first reading
        import tvm  # noqa: F401
        from tvm import relax  # noqa: F401

        if args.runtime == "ours":
            import relax_memplan.library  # noqa: F401
    elif args.runtime == "onnxruntime":
        import onnxruntime  # noqa: F401
    else:
        import openvino  # noqa: F401
    before = resident()
    start = time.perf_counter()
    precision = "f32"
    if args.runtime in ("ours", "tvm"):
        call, outputs = _tvm_call(args.runtime, args.library, feed)
    elif args.runtime == "onnxruntime":
        call, outputs = _ort_call(args.model, feed, args.threads)
    else:
        call, outputs, precision = _openvino_call(args.model, feed, args.threads,
                                                  args.runtime == "openvino-f32")
    load_s = time.perf_counter() - start
    loaded = resident()
    start = time.perf_counter()
    first = outputs(call())
    first_ms = (time.perf_counter() - start) * 1e3
    np.savez(args.outputs, **{f"output{i}": o for i, o in enumerate(first)})
    after_one = resident()
    warm_start = time.perf_counter()
    for _ in range(args.warmup):  # a slow model: the first call was its warm-up
        if time.perf_counter() - warm_start + first_ms / 1e3 > args.max_seconds / 3:
            break
        call()
    times_ms, began = [], time.perf_counter()
    while len(times_ms) < args.calls and (len(times_ms) < args.min_calls
                                          or time.perf_counter() - began < args.max_seconds):
        start = time.perf_counter()
        call()
        times_ms.append((time.perf_counter() - start) * 1e3)
    print(json.dumps({"runtime": args.runtime, "precision": precision, "load_s": load_s,
                      "first_call_ms": first_ms, "times_ms": times_ms,
                      "median_ms": statistics.median(times_ms), "rss_before_load": before,
                      "rss_after_load": loaded, "rss_after_one_call": after_one,
                      "rss_after_run": resident()}))
    return 0


if __name__ == "__main__":
    sys.exit(main())
