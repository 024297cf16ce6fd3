"""Per-kernel profiles of one model in three runtimes, keyed alike (for kernel_peers_bench.py).

Every convolution and matmul gets a *signature* computed from its shapes only, so that the
same layer is recognised in our build, onnxruntime and OpenVINO whatever each fuses around
it or calls it:

* conv: ``conv{kh}x{kw} s{stride} [dw|g{groups}] {cin}->{cout} {ho}x{wo}``;
* matmul: ``matmul {batch}x{m}x{k}x{n}`` (``A[batch, m, k] @ B[k, n]``, batch 1 if none).

Its *class* drops the channel counts and map size (``conv3x3 s1``, ``dwconv3x3 s2``,
``conv7x7 s2``, ``matmul``); every other kernel's class is its kind (``pool``, ``norm``,
``softmax``, ``elementwise``, ``layout``, ...). Our kernels are read from the PrimFuncs before
the CPU schedules (the signature of the convolution or matmul block, the rule that took the
kernel), onnxruntime's from its profiler's node events (``input_type_shape``), OpenVINO's from
the runtime model of a compiled model with ``PERF_COUNT`` (``execTimeMcs``, input shapes).
"""

from __future__ import annotations

import json
import os
import re
import statistics
import time
from collections import defaultdict

import numpy as np

RULE_ATTR = "relax_memplan.schedule_rule"


def conv_signature(data_shape, weight_shape, out_shape, groups=None) -> tuple:
    """``(signature, class, multiply-adds)`` of a convolution from its NC[H]W shapes."""
    cin, cout = int(data_shape[1]), int(out_shape[1])
    kernel = [int(d) for d in weight_shape[2:]]
    if len(kernel) == 1:
        kernel = [1] + kernel
    spatial_out = [int(d) for d in out_shape[2:]] or [1]
    stride = max(1, round(int(data_shape[-1]) / max(1, spatial_out[-1])))
    groups = groups or max(1, cin // int(weight_shape[1]))
    kind = "dwconv" if groups == cin and groups > 1 else "conv"
    tag = "" if groups == 1 or kind == "dwconv" else f" g{groups}"
    out_map = "x".join(str(d) for d in spatial_out)
    cls = f"{kind}{kernel[0]}x{kernel[1]} s{stride}{tag}"
    macs = int(np.prod(out_shape)) * (cin // groups) * int(np.prod(kernel))
    return f"{cls} {cin}->{cout} {out_map}", cls, macs


def matmul_signature(batch, m, k, n) -> tuple:
    return f"matmul {batch}x{m}x{k}x{n}", "matmul", int(batch * m * k * n)


# ------------------------------------------------------------------------------------ ours
def _classify_prim_func(func) -> dict:
    """Signature, class and multiply-adds of an unscheduled PrimFunc (``{}``: not conv/matmul)."""
    from tvm import s_tir

    from relax_memplan.schedules.analysis import match_matmul
    from relax_memplan.schedules.conv_match import match_conv

    try:
        sch = s_tir.Schedule(func)
        axes = match_conv(sch)
    except Exception:  # noqa: BLE001 -- not one root block: no conv
        return {}
    if axes is not None:
        block = sch.get(axes.block)
        data = [r.source for r in block.reads if r.source.name != block.reads[-1].source.name]
        weight = block.reads[-1].source
        sig = conv_signature([int(d) for d in data[0].shape] if data else [],
                             [int(d) for d in weight.shape],
                             [int(d) for d in block.writes[0].source.shape])
        return dict(zip(("signature", "class", "macs"), sig))
    try:
        mm = match_matmul(s_tir.Schedule(func))
    except Exception:  # noqa: BLE001
        mm = None
    if mm is None or not mm.all_static():
        return {}
    prod = lambda xs: int(np.prod(xs)) if xs else 1  # noqa: E731
    sig = matmul_signature(prod(mm.s_extents), prod(mm.i_extents), prod(mm.k_extents),
                           prod(mm.j_extents))
    return dict(zip(("signature", "class", "macs"), sig))


def _other_class(name: str) -> str:
    """The class of a kernel that is neither a conv nor a matmul, from its name."""
    for word, cls in (("attention", "attention"), ("softmax", "softmax"),
                      ("layer_norm", "norm"), ("rms_norm", "norm"), ("pool", "pool"),
                      ("mean", "reduce"), ("sum", "reduce"), ("transpose", "layout"),
                      ("reshape", "layout"), ("concat", "layout"), ("take", "gather"),
                      ("conv", "conv (fused chain)"), ("matmul", "matmul (other)")):
        if word in name:
            return cls
    return "elementwise"


def ours_profile(path, shapes, rounds: int, threads: int) -> dict:
    """Our default fast build (``schedule=True``, host CPU): per kernel, time and signature."""
    import tvm
    from tvm import relax, tirx
    from tvm.ir.instrument import pass_instrument

    from relax_memplan.frontend import import_onnx, make_random_inputs
    from relax_memplan.pipeline import get_pipeline
    from relax_memplan.runtime import kernel_profile
    from relax_memplan.schedules import host_target

    mod, info = import_onnx(path, shapes)
    feeds = make_random_inputs(path, info)
    meta, rules = {}, {}

    @pass_instrument
    class _RecordKernels:
        """Each PrimFunc's signature before ``CPUSchedule``, its rule after."""

        def run_before_pass(self, m, info):
            if info.name == "CPUSchedule":
                meta.update({gv.name_hint: _classify_prim_func(f)
                             for gv, f in m.functions_items() if isinstance(f, tirx.PrimFunc)})

        def run_after_pass(self, m, info):
            if info.name != "CPUSchedule":
                return
            for gv, func in m.functions_items():
                if isinstance(func, tirx.PrimFunc):
                    attrs = func.attrs or {}
                    rules[gv.name_hint] = str(attrs[RULE_ATTR]) if RULE_ATTR in attrs else "-"

    target = host_target()
    t0 = time.perf_counter()
    with tvm.transform.PassContext(instruments=[_RecordKernels()]):
        ex = tvm.compile(mod, target, relax_pipeline=get_pipeline(target, schedule=True))
    compile_s = time.perf_counter() - t0
    vm = relax.VirtualMachine(ex, tvm.cpu())
    args = [tvm.runtime.tensor(a) for a in feeds.values()]
    clock = time.thread_time if threads == 1 else time.perf_counter
    vm["main"](*args)
    samples, calls, totals = defaultdict(list), {}, []
    for _ in range(rounds):
        t0 = clock()
        vm["main"](*args)
        totals.append(clock() - t0)
    for _ in range(rounds):
        for k, (s, n) in kernel_profile(vm, args, merge_numbered=False, clock=clock).items():
            samples[k].append(s * 1e3)
            calls[k] = int(n)
    kernels = []
    for name, values in samples.items():
        base = name.removesuffix("_prepacked")
        info_ = meta.get(base) or meta.get(name) or {}
        kernels.append({"name": name, "rule": rules.get(name, rules.get(base, "?")),
                        "ms": statistics.median(values),
                        "class": info_.get("class") or _other_class(base),
                        "signature": info_.get("signature"), "calls": calls[name],
                        "macs": info_.get("macs", 0) * calls[name]})
    return {"total_ms": statistics.median(totals) * 1e3, "compile_s": compile_s,
            "kernels": kernels, "feeds": feeds}


def scaled_to_total(kernels: list, total_ms: float) -> list:
    """``kernels`` with each ``ms`` scaled so that they sum to ``total_ms`` (the raw sum kept
    as ``profiled_ms``): a profiler's per-node wall times carry the load of a shared host and
    the profiler's own cost; their shares applied to the run's time with profiling off give
    per-node times comparable with ours."""
    raw = sum(k["ms"] for k in kernels)
    factor = total_ms / raw if raw else 1.0
    return [{**k, "profiled_ms": k["ms"], "ms": k["ms"] * factor, "scale": factor}
            for k in kernels]


# ---------------------------------------------------------------------------- onnxruntime
def _ort_kernel(op: str, shapes_in, shapes_out) -> dict:
    def dims(entry):
        return next(iter(entry.values())) if entry else []

    ins = [dims(s) for s in shapes_in]
    outs = [dims(s) for s in shapes_out]
    if op in ("Conv", "FusedConv") and len(ins) >= 2 and outs:
        sig = conv_signature(ins[0], ins[1], outs[0])
        return dict(zip(("signature", "class", "macs"), sig))
    # a constant B is not listed among the inputs: A and the output give the shape
    if op in ("MatMul", "FusedMatMul", "Gemm", "MatMulNBits") and ins and outs:
        a, out = ins[0], outs[0]
        k = int(a[-1])
        n, m = int(out[-1]), int(out[-2]) if len(out) >= 2 else 1
        batch = int(np.prod(out[:-2])) if len(out) > 2 else 1
        sig = matmul_signature(batch, m, k, n)
        return dict(zip(("signature", "class", "macs"), sig))
    return {"class": _ORT_CLASSES.get(op, "elementwise")}


_ORT_CLASSES = {"MaxPool": "pool", "AveragePool": "pool", "GlobalAveragePool": "pool",
                "ReorderInput": "layout", "ReorderOutput": "layout", "Transpose": "layout",
                "Reshape": "layout", "Concat": "layout", "Gather": "gather",
                "LayerNormalization": "norm", "SkipLayerNormalization": "norm",
                "Softmax": "softmax", "Attention": "attention",
                "MultiHeadAttention": "attention", "ReduceMean": "reduce"}


def ort_profile(path, feeds, rounds: int, threads: int, workdir: str) -> dict:
    """onnxruntime (its default session options, ``intra_op_num_threads`` set): the median
    total with profiling off, and each node's fastest time over the runs with its profiler on
    (wall time: the fastest run is the one least disturbed by other processes)."""
    import onnxruntime as ort

    def session(profile: bool):
        opts = ort.SessionOptions()
        opts.intra_op_num_threads = threads
        if profile:
            opts.enable_profiling = True
            opts.profile_file_prefix = os.path.join(workdir, "ort_profile")
        return ort.InferenceSession(str(path), opts, providers=["CPUExecutionProvider"])

    clock = time.thread_time if threads == 1 else time.perf_counter
    sess = session(False)
    sess.run(None, feeds)
    totals = []
    for _ in range(rounds):
        t0 = clock()
        sess.run(None, feeds)
        totals.append(clock() - t0)
    prof = session(True)
    for _ in range(rounds + 1):
        prof.run(None, feeds)
    events = json.loads(open(prof.end_profiling()).read())
    per_node = defaultdict(list)
    for e in events:
        if e.get("cat") == "Node" and e["name"].endswith("_kernel_time"):
            per_node[e["name"][:-len("_kernel_time")]].append(e)
    kernels = []
    for name, evs in per_node.items():
        args = evs[0]["args"]
        durs = [e["dur"] / 1e3 for e in evs[1:]] or [evs[0]["dur"] / 1e3]
        kernels.append({"name": name, "op": args.get("op_name"), "ms": min(durs),
                        **_ort_kernel(args.get("op_name", ""), args.get("input_type_shape", []),
                                      args.get("output_type_shape", []))})
    total = statistics.median(totals) * 1e3
    return {"total_ms": total, "kernels": scaled_to_total(kernels, total)}


# ------------------------------------------------------------------------------- OpenVINO
def _ov_kernel(op) -> dict:
    rt = op.get_rt_info()
    layer = rt["layerType"].astype(str)
    shapes = [[int(d) for d in op.input(i).get_partial_shape().to_shape()]
              if op.input(i).get_partial_shape().is_static else []
              for i in range(op.get_input_size())]
    out = ([int(d) for d in op.output(0).get_partial_shape().to_shape()]
           if op.get_output_size() and op.output(0).get_partial_shape().is_static else [])
    if layer in ("Convolution", "GroupConvolution") and len(shapes) >= 2 and out:
        w = shapes[1]
        groups = None
        if layer == "GroupConvolution" or len(w) == len(out) + 1:
            groups, w = w[0], [w[0] * w[1]] + w[2:]
        sig = conv_signature(shapes[0], w, out, groups=groups)
        return dict(zip(("signature", "class", "macs"), sig))
    if layer in ("FullyConnected", "MatMul") and len(shapes) >= 2 and out:
        k = shapes[0][-1]
        batch = int(np.prod(out[:-2])) if len(out) > 2 else 1
        sig = matmul_signature(batch, out[-2] if len(out) >= 2 else 1, k, out[-1])
        return dict(zip(("signature", "class", "macs"), sig))
    return {"class": _OV_CLASSES.get(layer, "elementwise")}


_OV_CLASSES = {"Pooling": "pool", "Reorder": "layout", "Transpose": "layout",
               "Reshape": "layout", "Concatenation": "layout", "Gather": "gather",
               "MVN": "norm", "RMS": "norm", "Softmax": "softmax",
               "ScaledDotProductAttention": "attention", "Reduce": "reduce"}


def ov_profile(path, feeds, rounds: int, threads: int, precision: str = "f32") -> dict:
    """OpenVINO CPU plugin (``INFERENCE_NUM_THREADS``; ``precision``: ``f32``, or ``default``
    for the plugin's own choice, bf16 on CPUs with AVX-512 BF16): median total with
    ``PERF_COUNT`` off, each executed node's fastest ``execTimeMcs`` with it on (as
    :func:`ort_profile`)."""
    import openvino as ov

    core = ov.Core()

    def compiled(perf: bool):
        config = {"INFERENCE_NUM_THREADS": threads, "PERF_COUNT": perf}
        if precision != "default":
            config["INFERENCE_PRECISION_HINT"] = precision
        return core.compile_model(str(path), "CPU", config)

    clock = time.process_time if threads == 1 else time.perf_counter
    req = compiled(False).create_infer_request()
    req.infer(feeds)
    totals = []
    for _ in range(rounds):
        t0 = clock()
        req.infer(feeds)
        totals.append(clock() - t0)
    model = compiled(True)
    req = model.create_infer_request()
    per_node = defaultdict(list)
    req.infer(feeds)
    for _ in range(rounds):
        req.infer(feeds)
        for op in model.get_runtime_model().get_ordered_ops():
            rt = op.get_rt_info()
            if "execTimeMcs" in rt:
                value = rt["execTimeMcs"].astype(str)
                if re.fullmatch(r"\d+", value):
                    per_node[op.get_friendly_name()].append((int(value) / 1e3, op))
    kernels = []
    for name, vals in per_node.items():
        ms = min(v for v, _ in vals)
        if ms > 0:
            kernels.append({"name": name, "ms": ms, "op": vals[0][1].get_rt_info()[
                "layerType"].astype(str), **_ov_kernel(vals[0][1])})
    precision_used = str(compiled(False).get_property("INFERENCE_PRECISION_HINT"))
    total = statistics.median(totals) * 1e3
    return {"total_ms": total, "kernels": scaled_to_total(kernels, total),
            "precision": precision_used}
