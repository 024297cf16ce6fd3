"""The reference case of DESIGN.md: a BERT-base encoder at varying sequence length, four ways.

The model is built with ``onnx.helper`` (weights random normal * 0.02, fixed seed), so that
onnxruntime runs the same graph and inputs: ``hidden_states`` (batch, seq, hidden), additive
``attention_mask`` (batch, 1, 1, seq); per layer MatMul + bias Add (Q, K, V, output, FFN),
Reshape (shapes from Shape/Slice/Concat, so batch and seq stay symbolic) and Transpose for
the heads, Softmax, LayerNormalization, erf GELU. Batch 8, seq in {32, 48, 64, 96, 128}.
Every row uses our CPU schedules (``schedule=True``) and one target, llvm with the host mcpu:

1. **static, padded to 128** -- seq fixed at 128, our static planner (``PlanStaticMemory``);
   each call pads the inputs to 128 (padding masked with -1e4), the output is cut to seq.
2. **dynamic + VM pool** -- symbolic seq (ranges batch (B, B), seq (1, 128)), TVM's planner,
   pooled VM allocator, generic kernels.
3. **dynamic + kernel specialization** -- row 2 with ``dispatch={"seq": [64, 128]}``
   (``SpecializeKernels``: static-shape versions chosen at run time inside each kernel).
4. **exact arena + specialization** -- row 3 with ``PlanDynamicMemory(strategy="exact")``
   (one arena per call, sized for the actual seq), naive allocator (as docs/dynamic_shapes.md advises).
5. **exact arena + specialization + fused attention** -- row 4 with ``fusion=True`` (our
   graph-level fusion: attention as one streaming-softmax kernel, no (batch, heads, seq, seq)
   score tensor; residual add + LayerNorm where it removes a kernel; the FFN over row chunks
   where that lowers the peak).

4i. **row 4 + in-place + reorder** -- row 4 with ``PlanDynamicMemory(inplace=True)`` (an output
   written over an input that dies there, sizes equal as expressions), ``PlanStaticMemory(
   inplace=True)`` and ``ReorderForMemory`` (which leaves blocks with symbolic sizes as they
   are). Per seq the exact arena of row 4 (before) and row 4i (after) from the plans, and row
   4i's lower bound without in-place, are printed and written (``exact_plan_inplace_bytes``).
   The kernel table refuses every kernel ``SpecializeKernels`` made dispatching (one writer
   block per branch), so row 4i finds no in-place call; **4n** is row 4i without
   specialization (the same Relax graph and tensors as row 4, so row 4's arena is its
   "before"). Measured (``--layers 1 --max-seq 512 --seqs 128,256,512 --rows exact_spec,
   exact_spec_inplace,exact_inplace_nospec --repeats 1``, BERT-base layer, batch 8): row 4 arena 18.87 / 56.62 / 213.91 MB at seq
   128 / 256 / 512; row 4i the same (0 in-place calls); row 4n 15.73 / 56.62 / 213.91 MB (one
   call: the FFN's output + bias + residual written over the LayerNorm output; 0.833 x at
   seq 128, where the peak is in the FFN; at 256 and 512 the peak is at the attention scores,
   which no in-place pair touches). Bytes per call 22.02 -> 18.87 MB at seq 128. Numerics
   unchanged (3.7e-6 / 4.8e-6 / 5.5e-6 vs onnxruntime in every row).

``--max-seq 512`` widens the symbolic range to seq in [1, 512] (bucket 512 added; row 1 pads to
512) so that ``--seqs`` may hold 256 and 512. The exact plans of rows 4 and 5 give the lower
bound (peak live bytes) at every seq without and with fusion: ratio "row5/row4 lower bound".
Measured (``--layers 1 --rows exact_spec,exact_spec_fused --max-seq 512 --seqs 128,256,512
--repeats 1``, BERT-base layer, batch 8): lower
bound row 5 / row 4 = 1.000 at seq 128, 0.667 at 256, 0.353 at 512; bytes per call 22.0 / 22.0,
44.0 / 62.9, 88.1 / 226.5 MB. At seq 128 the peak is in the FFN, not at the scores: the
(8, 128, 3072) GELU output (12.6 MB) with its input and output (8, 128, 768) (3.1 MB each) is
the whole 18.9 MB lower bound, while a score tensor is 6.3 MB. With ``ChunkFeedForward`` (the
FFN over 4 chunks of the batch, in our fusion passes since) the same command measured 0.667 at
seq 128, 0.444 at 256, 0.235 at 512 (bytes per call 15.7 / 22.0, 31.5 / 62.9, 62.9 / 226.5 MB;
``--repeats 3``); row 5 with / without the
chunking alone: ``benchmarks/ffn_chunk_bench.py``. The layers repeat, so one layer gives the
ratio of twelve.

Per row and seq: bytes allocated per call (every ``vm.builtin.alloc_storage``, naive
allocator, ``run_and_measure``), median ms per call (``--repeats`` calls after a warm-up;
rows and onnxruntime interleaved, the machine being shared), max abs error against
onnxruntime (flagged above 1e-3 * max|ref| + 1e-4); per row, heap bytes held after one call
at every seq (glibc ``mallinfo2`` after clearing the VM pool, as ``pool_bench.py``); per seq,
onnxruntime ms (2 intra-op threads). Ratios: row 3 / row 2 time at bucket seqs (the
specialization speedup, target <= 0.75) and elsewhere (dispatch overhead, target <= 1.02);
row 4 / row 2 bytes.

Thread pools do not spin (``TVM_THREAD_POOL_SPIN_COUNT=0``, onnxruntime
``allow_spinning=0``), so interleaved runs do not steal each other's cores.

Cost of the run-time index checks (``--check-cost``): row 4 built again with
``check_indices=False`` ("4b"), timed in the same interleaved rounds; per seq, ms with and
without checks and their ratio, and the check kernels alone timed with the VM instrument hook
(independent of the machine's noise). The encoder alone has no value-dependent op, so nothing
is checked: ``--embeddings`` puts BERT's embedding layer first (inputs ``input_ids``,
``token_type_ids``; word table 30522 rows, position ids a Slice of a constant ``0..511``,
proved in range; the word and token-type Gathers are checked at run time).
``--rows exact_spec`` compiles only the rows named (the check-cost row follows row 4).

Usage: python benchmarks/bert_case.py [--quick] [--layers N] [--hidden H] [--repeats R]
[--seqs 32,64] [--max-seq 512] [--embeddings] [--check-cost] [--rows KEY,...] [--json PATH]
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from pathlib import Path

import numpy as np
import onnx
from onnx import TensorProto, helper, numpy_helper

REPO = Path(__file__).resolve().parents[1]
BUCKETS = (64, 128)
FULL = dict(hidden=768, layers=12, heads=12, ffn=3072, batch=8)
QUICK = dict(hidden=256, layers=4, heads=4, ffn=1024, batch=2)
VOCAB, MAX_POSITIONS, TOKEN_TYPES = 30522, 512, 2
"""BERT-base's embedding tables (``--embeddings``)."""
CHECK_KERNEL = "relax_memplan_check_indices"


def log(msg: str) -> None:
    print(f"[bert_case {time.strftime('%H:%M:%S')}] {msg}", file=sys.stderr, flush=True)


# ----------------------------------------------------------------------------- the model
def build_bert(hidden: int, layers: int, heads: int, ffn: int, seed: int = 0,
               embeddings: bool = False) -> onnx.ModelProto:
    """A BERT encoder as an ONNX graph (opset 17) with symbolic dims ``batch`` and ``seq``;
    with ``embeddings``, BERT's embedding layer first (word, position, token type, LayerNorm)."""
    rng = np.random.default_rng(seed)
    head_dim = hidden // heads
    nodes, inits = [], []

    def const(name, value):
        inits.append(numpy_helper.from_array(np.asarray(value), name))
        return name

    def weight(name, *shape):
        return const(name, (rng.standard_normal(shape) * 0.02).astype(np.float32))

    def node(op, inputs, name, **attrs):
        nodes.append(helper.make_node(op, inputs, [name], name=name, **attrs))
        return name

    def dense(x, p, n_in, n_out, shape_out):
        """x @ W + b on (batch, seq, n_in); reshaped to the heads when ``shape_out`` is ``split``."""
        y = node("Add", [node("MatMul", [x, weight(f"{p}.w", n_in, n_out)], f"{p}.mm"),
                         weight(f"{p}.b", n_out)], f"{p}.add")
        return y if shape_out != split else node("Reshape", [y, shape_out], f"{p}.out")

    def layer_norm(x, p):
        scale = const(f"{p}.gamma", np.ones(hidden, np.float32))
        bias = const(f"{p}.beta", np.zeros(hidden, np.float32))
        return node("LayerNormalization", [x, scale, bias], f"{p}.out", axis=-1, epsilon=1e-12)

    def value(name, dims, elem_type=TensorProto.FLOAT):
        return helper.make_tensor_value_info(name, elem_type, dims)

    inputs = [value("hidden_states", ["batch", "seq", hidden])]
    x = "hidden_states"
    if embeddings:
        inputs = [value(n, ["batch", "seq"], TensorProto.INT64)
                  for n in ("input_ids", "token_type_ids")]
        ids_shape = node("Shape", ["input_ids"], "ids_shape")
        seq_1d = node("Slice", [ids_shape, const("e_one", np.array([1])),
                                const("e_two", np.array([2]))], "seq_1d")
        positions = node("Slice", [const("position_ids", np.arange(MAX_POSITIONS)[None]),
                                   const("e_zero", np.array([0])), seq_1d,
                                   const("e_axis", np.array([1]))], "emb.position_ids")
        tables = (("word", VOCAB, "input_ids"), ("position", MAX_POSITIONS, positions),
                  ("token_type", TOKEN_TYPES, "token_type_ids"))
        gathers = [node("Gather", [weight(f"emb.{n}.table", rows, hidden), ids], f"emb.{n}",
                        axis=0) for n, rows, ids in tables]
        summed = node("Add", [node("Add", gathers[:2], "emb.add1"), gathers[2]], "emb.add2")
        x = layer_norm(summed, "emb.ln")
    inputs.append(value("attention_mask", ["batch", 1, 1, "seq"]))
    bs = node("Slice", [node("Shape", [x], "in_shape"),
                        const("zero", np.array([0])), const("two", np.array([2]))], "batch_seq")
    split, merge, wide = (node("Concat", [bs, const(f"{n}_dims", np.array(d, np.int64))], n,
                               axis=0) for n, d in (("heads_shape", [heads, head_dim]),
                                       ("hidden_shape", [hidden]), ("ffn_shape", [ffn])))
    scale = const("attn_scale", np.array(1.0 / np.sqrt(head_dim), np.float32))
    half, one = const("half", np.array(0.5, np.float32)), const("one", np.array(1.0, np.float32))
    rsqrt2 = const("rsqrt2", np.array(1.0 / np.sqrt(2.0), np.float32))
    for i in range(layers):
        p = f"l{i}"
        q, k, v = (dense(x, f"{p}.{n}", hidden, hidden, split) for n in "qkv")
        q = node("Transpose", [q], f"{p}.qt", perm=[0, 2, 1, 3])   # (b, h, s, d)
        k = node("Transpose", [k], f"{p}.kt", perm=[0, 2, 3, 1])   # (b, h, d, s)
        v = node("Transpose", [v], f"{p}.vt", perm=[0, 2, 1, 3])   # (b, h, s, d)
        s = node("Mul", [node("MatMul", [q, k], f"{p}.qk"), scale], f"{p}.scaled")
        probs = node("Softmax", [node("Add", [s, "attention_mask"], f"{p}.masked")],
                     f"{p}.probs", axis=-1)
        ctx = node("Transpose", [node("MatMul", [probs, v], f"{p}.ctx")], f"{p}.ctxt",
                   perm=[0, 2, 1, 3])
        ctx = node("Reshape", [ctx, merge], f"{p}.ctx3")
        x = layer_norm(node("Add", [x, dense(ctx, f"{p}.o", hidden, hidden, merge)], f"{p}.res1"),
                       f"{p}.ln1")
        h = dense(x, f"{p}.ffn1", hidden, ffn, wide)
        erf = node("Erf", [node("Mul", [h, rsqrt2], f"{p}.hs")], f"{p}.erf")
        gelu = node("Mul", [node("Mul", [h, half], f"{p}.hh"),
                            node("Add", [erf, one], f"{p}.erf1")], f"{p}.gelu")
        x = layer_norm(node("Add", [x, dense(gelu, f"{p}.ffn2", ffn, hidden, merge)], f"{p}.res2"),
                       f"{p}.ln2")
    nodes.append(helper.make_node("Identity", [x], ["last_hidden_state"], name="output"))
    graph = helper.make_graph(nodes, "bert_encoder", inputs,
                              [value("last_hidden_state", ["batch", "seq", hidden])], inits)
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    model.ir_version = 8
    onnx.checker.check_model(model)
    return model


# ----------------------------------------------------------------------------- the builds
def compile_rows(model, cfg, target, keys=None, check_cost=False):
    """Compile the rows (all, or those named in ``keys``): list of dicts (key, label, ex, ...);
    with ``check_cost``, row 4 also without index checks (key ``exact_nocheck``)."""
    import tvm
    from relax_memplan.frontend import import_onnx
    from relax_memplan.pipeline import get_pipeline
    from relax_memplan.schedules import schedule_prim_func
    from relax_memplan.transform.plan_dynamic_memory import PlanDynamicMemory
    from relax_memplan.transform.plan_static_memory import PlanStaticMemory
    from relax_memplan.transform.reorder_for_memory import ReorderForMemory
    from relax_memplan.transform.specialize_kernels import SpecializeKernels

    b, top = cfg["batch"], cfg.get("max_seq", max(BUCKETS))
    buckets = sorted(set(BUCKETS) | {top})
    ranges = {"batch": (b, b), "seq": (1, top)}
    sizes = {"batch": b, "seq": top}
    static_mod, _ = import_onnx(model, {
        i.name: tuple(sizes.get(d.dim_param, d.dim_value) for d in i.type.tensor_type.shape.dim)
        for i in model.graph.input})
    dyn_mod, _ = import_onnx(model, keep_dynamic=True)
    spec = lambda: SpecializeKernels({"seq": buckets}, schedule=schedule_prim_func)  # noqa
    spec3, spec4, exact = spec(), spec(), PlanDynamicMemory(strategy="exact")
    spec5, exact5 = spec(), PlanDynamicMemory(strategy="exact")
    spec4b, exact4b = spec(), PlanDynamicMemory(strategy="exact")
    spec4i, exact4i = spec(), PlanDynamicMemory(strategy="exact", inplace=True)
    exact4n = PlanDynamicMemory(strategy="exact", inplace=True)
    specs = [
        ("static_pad128", f"1 static, padded to {top}", static_mod, "pooled", None,
         dict(schedule=True, fusion=False)),
        ("dynamic_pool", "2 dynamic + VM pool", dyn_mod, "pooled", None,
         dict(planner="tvm", dim_ranges=ranges, schedule=True, fusion=False)),
        ("dynamic_spec", "3 dynamic + specialization", dyn_mod, "pooled", spec3,
         dict(planner="tvm", dim_ranges=ranges, dispatch_pass=spec3, schedule=True,
              fusion=False)),
        ("exact_spec", "4 exact arena + specialization", dyn_mod, "naive", spec4,
         dict(dynamic_pass=exact, dim_ranges=ranges, dispatch_pass=spec4, schedule=True,
              fusion=False)),
        ("exact_spec_fused", "5 exact + spec + fused attention", dyn_mod, "naive", spec5,
         dict(dynamic_pass=exact5, dim_ranges=ranges, dispatch_pass=spec5, schedule=True,
              fusion=True)),
        ("exact_spec_inplace", "4i row 4 + in-place + reorder", dyn_mod, "naive", spec4i,
         dict(dynamic_pass=exact4i, dim_ranges=ranges, dispatch_pass=spec4i, schedule=True,
              fusion=False, plan_pass=PlanStaticMemory(inplace=True),
              reorder_pass=ReorderForMemory())),
        ("exact_inplace_nospec", "4n row 4i without specialization", dyn_mod, "naive", None,
         dict(dynamic_pass=exact4n, dim_ranges=ranges, schedule=True, fusion=False,
              plan_pass=PlanStaticMemory(inplace=True), reorder_pass=ReorderForMemory())),
    ]
    if check_cost:
        specs.append(("exact_nocheck", "4b row 4, no index checks", dyn_mod, "naive", spec4b,
                      dict(dynamic_pass=exact4b, dim_ranges=ranges, dispatch_pass=spec4b,
                           schedule=True, check_indices=False)))
    rows = []
    for key, label, mod, allocator, sk, kwargs in specs:
        if keys is not None and key not in keys and not (key == "exact_nocheck"
                                                          and "exact_spec" in keys):
            continue
        log(f"compiling {label} ...")
        t0 = time.perf_counter()
        ex = tvm.compile(mod, target, relax_pipeline=get_pipeline(target, **kwargs))
        rows.append(dict(key=key, label=label, ex=ex, allocator=allocator,
                         compile_s=time.perf_counter() - t0,
                         specialized_kernels=len(sk.specialized) if sk else 0))
        plan = {"exact_spec": exact, "exact_spec_fused": exact5, "exact_spec_inplace": exact4i,
                "exact_inplace_nospec": exact4n}.get(key)
        if plan is not None:
            rows[-1]["exact_plan"] = plan.plans.get("main")
        rows[-1]["pad_to"] = top
        log(f"  done in {rows[-1]['compile_s']:.0f} s")
    return rows


# ----------------------------------------------------------------------------- measuring
def make_inputs(batch, seq, hidden, seed, embeddings=False):
    """The graph's inputs by name, in graph order (ids in range for ``embeddings``)."""
    rng = np.random.default_rng(seed)
    if embeddings:
        feed = {"input_ids": rng.integers(0, VOCAB, (batch, seq), dtype=np.int64),
                "token_type_ids": rng.integers(0, TOKEN_TYPES, (batch, seq), dtype=np.int64)}
    else:
        feed = {"hidden_states": rng.standard_normal((batch, seq, hidden)).astype(np.float32)}
    feed["attention_mask"] = np.zeros((batch, 1, 1, seq), np.float32)
    return feed


def row_inputs(row, feed):
    """The inputs a row is called with: padded to the static length (padding masked) for row 1."""
    if row["key"] != "static_pad128":
        return list(feed.values())
    top, padded = row.get("pad_to", max(BUCKETS)), []
    for name, a in feed.items():
        axis, fill = (3, -1e4) if name == "attention_mask" else (1, 0)
        widths = [(0, top - a.shape[axis] if k == axis else 0) for k in range(a.ndim)]
        padded.append(np.pad(a, widths, constant_values=np.array(fill, a.dtype)))
    return padded


def ort_session(model):
    import onnxruntime as ort
    opts = ort.SessionOptions()
    opts.intra_op_num_threads, opts.inter_op_num_threads = 2, 1
    opts.log_severity_level = 3
    opts.add_session_config_entry("session.intra_op.allow_spinning", "0")
    return ort.InferenceSession(model.SerializeToString(), opts, providers=["CPUExecutionProvider"])


def measure(rows, model, cfg, seqs, repeats):
    """Fill each row's per-seq bytes, errors, pool bytes held and timings; return ORT times."""
    import tvm
    from tvm import relax
    from relax_memplan.runtime import heap_bytes, run_and_measure

    b, h = cfg["batch"], cfg["hidden"]
    embeddings = any(i.name == "input_ids" for i in model.graph.input)
    data = {s: make_inputs(b, s, h, seed=s, embeddings=embeddings) for s in seqs}
    sess = ort_session(model)
    refs = {s: sess.run(None, data[s])[0] for s in seqs}
    clear = tvm.get_global_func("vm.builtin.memory_manager.clear")
    for row in rows:
        log(f"bytes and numerics: {row['label']}")
        row.update(bytes={}, err={}, tol={}, ms={})
        for s in seqs:
            mem = run_and_measure(row["ex"], row_inputs(row, data[s]))
            out = mem.outputs[0][:, :s]
            row["bytes"][s] = mem.alloc_bytes
            row["err"][s] = float(np.max(np.abs(out - refs[s])))
            row["tol"][s] = 1e-3 * float(np.max(np.abs(refs[s]))) + 1e-4
        # bytes the VM allocator holds after one call at every seq
        clear()
        base = heap_bytes()
        vm = relax.VirtualMachine(row["ex"], tvm.cpu(), memory_cfg=row["allocator"])
        for s in seqs:
            out = vm["main"](*[tvm.runtime.tensor(a) for a in row_inputs(row, data[s])])
            del out
        row["held_bytes"] = heap_bytes() - base
        del vm
        clear()
    # timing: rows (and onnxruntime) interleaved, one warm-up round then `repeats` rounds
    vms = [relax.VirtualMachine(r["ex"], tvm.cpu(), memory_cfg=r["allocator"]) for r in rows]
    args = {(i, s): [tvm.runtime.tensor(a) for a in row_inputs(r, data[s])]
            for i, r in enumerate(rows) for s in seqs}
    times = {(i, s): [] for i in range(len(rows) + 1) for s in seqs}
    for rep in range(repeats + 1):
        log(f"timing round {rep}/{repeats}" + (" (warm-up)" if rep == 0 else ""))
        for s in seqs:
            for i, vm in enumerate(vms):
                t0 = time.perf_counter()
                vm["main"](*args[i, s])
                times[i, s].append(time.perf_counter() - t0)
            t0 = time.perf_counter()
            sess.run(None, data[s])
            times[len(rows), s].append(time.perf_counter() - t0)
    med = {k: 1000 * float(np.median(v[1:] if len(v) > 1 else v)) for k, v in times.items()}
    for i, row in enumerate(rows):
        row["ms"] = {s: med[i, s] for s in seqs}
        row["check_kernels"] = {s: check_kernel_time(vms[i], args[i, s], repeats) for s in seqs}
    return {s: med[len(rows), s] for s in seqs}


def check_kernel_time(vm, args, repeats):
    """The index-check kernels alone (VM instrument hook, ``repeats`` calls after one):
    calls, ms per call in them, and ms per call in all packed calls."""
    total, checks, calls, started = 0.0, 0.0, 0, {}

    def hook(func, name, before_run, ret, *_args):
        nonlocal total, checks, calls
        if before_run:
            started[name] = time.perf_counter()
            return
        spent = time.perf_counter() - started.pop(name, time.perf_counter())
        total += spent
        if name.startswith(CHECK_KERNEL):
            checks, calls = checks + spent, calls + 1

    vm["main"](*args)
    vm.set_instrument(hook)
    try:
        for _ in range(max(1, repeats)):
            vm["main"](*args)
    finally:
        vm.set_instrument(None)
    n = max(1, repeats)
    return {"calls": calls // n, "ms": 1000 * checks / n, "all_calls_ms": 1000 * total / n}


# ----------------------------------------------------------------------------- reporting
def ratios(rows, seqs):
    """Row 3 / row 2 time (bucket and other seqs), row 4 / row 2 bytes: those whose rows
    were built."""
    by = {r["key"]: r for r in rows}
    out = {}
    if "dynamic_pool" in by and "dynamic_spec" in by:
        r2, r3 = by["dynamic_pool"], by["dynamic_spec"]
        t32 = {s: r3["ms"][s] / r2["ms"][s] for s in seqs}
        out.update(spec_over_pool_time=t32,
                   spec_speedup_at_buckets={s: t32[s] for s in seqs if s in BUCKETS},
                   dispatch_overhead_elsewhere={s: t32[s] for s in seqs if s not in BUCKETS})
    if "dynamic_pool" in by and "exact_spec" in by:
        r2, r4 = by["dynamic_pool"], by["exact_spec"]
        out["exact_over_pool_bytes"] = {s: r4["bytes"][s] / r2["bytes"][s] for s in seqs}
    return out


def check_cost(rows, seqs):
    """Per seq: row 4 ms with and without index checks, their ratio, and the check kernels
    alone (instrument hook); ``None`` without the ``exact_nocheck`` row."""
    by = {r["key"]: r for r in rows}
    if "exact_spec" not in by or "exact_nocheck" not in by:
        return None
    on, off = by["exact_spec"], by["exact_nocheck"]
    return {s: {"with_checks_ms": on["ms"][s], "without_checks_ms": off["ms"][s],
                "ratio": on["ms"][s] / off["ms"][s],
                "check_kernel_calls": on["check_kernels"][s]["calls"],
                "check_kernels_ms": on["check_kernels"][s]["ms"],
                "check_share_of_packed_calls": on["check_kernels"][s]["ms"]
                / on["check_kernels"][s]["all_calls_ms"],
                "check_kernel_calls_without": off["check_kernels"][s]["calls"]}
            for s in seqs}


def print_check_cost(cost, seqs):
    w = 12
    print("\nindex checks: row 4 with / without (same interleaved rounds), and the check "
          "kernels alone (VM instrument hook)")
    print(f"{'':34s}" + "".join(f"{'seq=' + str(s):>{w}s}" for s in seqs))
    for title, key, spec in (("ms per call, with checks", "with_checks_ms", "{:>%d.2f}"),
                             ("ms per call, without checks", "without_checks_ms", "{:>%d.2f}"),
                             ("ratio with / without", "ratio", "{:>%d.3f}"),
                             ("check kernels, calls per call", "check_kernel_calls", "{:>%dd}"),
                             ("check kernels, us per call", "check_kernels_ms", "{:>%d.1f}"),
                             ("check kernels, share of kernels", "check_share_of_packed_calls",
                              "{:>%d.4%%}")):
        scale = 1000 if key == "check_kernels_ms" else 1
        cells = [cost[s][key] * scale for s in seqs]
        print(f"{title:34s}" + "".join((spec % w).format(c) for c in cells))


def print_table(rows, ort_ms, seqs, cfg, target, repeats, rat):
    w = 12
    head = f"{'':34s}" + "".join(f"{'seq=' + str(s):>{w}s}" for s in seqs)
    print(f"BERT encoder: batch {cfg['batch']}, hidden {cfg['hidden']}, {cfg['layers']} layers, "
          f"{cfg['heads']} heads, FFN {cfg['ffn']}; target {target}")
    for title, fmt in (("bytes allocated per call (MB, naive count)", "bytes"),
                       (f"median ms per call ({repeats} timed after 1 warm-up)", "ms"),
                       ("max abs error vs onnxruntime", "err")):
        print(f"\n{title}\n{head}")
        for row in rows:
            cells = [row[fmt][s] / 1e6 if fmt == "bytes" else row[fmt][s] for s in seqs]
            spec = "{:>%d.2f}" % w if fmt != "err" else "{:>%d.1e}" % w
            print(f"{row['label']:34s}" + "".join(spec.format(c) for c in cells))
        if fmt == "ms":
            print(f"{'onnxruntime (2 threads)':34s}"
                  + "".join(f"{ort_ms[s]:>{w}.2f}" for s in seqs))
    print("\npool/heap bytes held after one call at every seq (mallinfo2):")
    for row in rows:
        print(f"  {row['label']:34s}{row['held_bytes'] / 1e6:10.2f} MB  ({row['allocator']} "
              f"allocator, compile {row['compile_s']:.0f} s)")
    print("\nratios")
    fmt = lambda d: ", ".join(f"seq {s}: {v:.3f}" for s, v in d.items()) or "-"  # noqa: E731
    for text, key in (("row3/row2 time at bucket seqs (target <= 0.75)", "spec_speedup_at_buckets"),
                      ("row3/row2 time elsewhere (target <= 1.02)", "dispatch_overhead_elsewhere"),
                      ("row4/row2 bytes per call", "exact_over_pool_bytes")):
        print(f"  {text:47s} {fmt(rat.get(key, {}))}")
    counts = [f"row {r['label'].split()[0]} {r['specialized_kernels']}" for r in rows
              if r["specialized_kernels"]]
    print(f"  specialized kernels: {', '.join(counts) or '-'}")
    bad = [(r["label"], s, r["err"][s], r["tol"][s]) for r in rows for s in seqs
           if not r["err"][s] <= r["tol"][s]]
    for label, s, err, tol in bad:
        print(f"!!! NUMERICS FAILED: {label} at seq {s}: max abs error {err:.3e} > tolerance "
              f"{tol:.3e} !!!")
    return bad


def inplace_bytes(plans, batch, seqs):
    """Per in-place row (4i, 4n) and seq: the exact arena and lower bound of row 4 (before) and
    of the row (after; its bound without in-place too), in bytes; ``{}`` without row 4."""
    before = plans.get("exact_spec")
    out = {}
    for key in ("exact_spec_inplace", "exact_inplace_nospec"):
        after = plans.get(key)
        if before is None or after is None:
            continue
        out[key] = {}
        for s in seqs:
            dims = {"batch": batch, "seq": s}
            (arena0, lb0, _), (arena1, lb1, _) = before.bytes_at(dims), after.bytes_at(dims)
            out[key][s] = {
                "arena_before_bytes": arena0, "lower_bound_before_bytes": lb0,
                "arena_after_bytes": arena1, "lower_bound_after_bytes": lb1,
                "lower_bound_without_inplace_bytes": after.lower_bound_without_inplace_at(dims),
                "inplace_calls": len(after.inplace), "arena_after_over_before": arena1 / arena0}
    return out


def print_inplace(inplace, seqs):
    w = 12
    print("\nexact arena before (row 4) / after in-place + reorder (rows 4i, 4n), MB, from the "
          f"plans\n{'':34s}" + "".join(f"{'seq=' + str(s):>{w}s}" for s in seqs))
    first = next(iter(inplace.values()))
    print(f"{'row 4 arena (before)':34s}"
          + "".join(f"{first[s]['arena_before_bytes'] / 1e6:>{w}.3f}" for s in seqs))
    for key, by_seq in inplace.items():
        row = "4i" if key == "exact_spec_inplace" else "4n"
        for title, field, scale in ((f"row {row} arena (after)", "arena_after_bytes", 1e-6),
                                    (f"row {row} / row 4 arena", "arena_after_over_before", 1.0)):
            print(f"{title:34s}" + "".join(f"{by_seq[s][field] * scale:>{w}.3f}" for s in seqs))
        print(f"  row {row}: {by_seq[seqs[0]]['inplace_calls']} in-place calls")


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true",
                        help="hidden 256, 4 layers, 4 heads, FFN 1024, batch 2")
    parser.add_argument("--layers", type=int)
    parser.add_argument("--hidden", type=int, help="heads = hidden // 64, FFN = 4 * hidden")
    parser.add_argument("--batch", type=int)
    parser.add_argument("--repeats", type=int, default=3, help="timed calls after 1 warm-up")
    parser.add_argument("--seqs", default="32,48,64,96,128")
    parser.add_argument("--max-seq", type=int, default=max(BUCKETS),
                        help="top of the symbolic seq range (and a bucket); 512 for seq 256/512")
    parser.add_argument("--mcpu", default=None, help="llvm -mcpu for every row (default: host)")
    parser.add_argument("--embeddings", action="store_true",
                        help="BERT's embedding layer first (inputs input_ids, token_type_ids)")
    parser.add_argument("--check-cost", action="store_true",
                        help="also row 4 with check_indices=False; print the checks' cost")
    parser.add_argument("--rows", default=None,
                        help="comma-separated row keys to build (default all): static_pad128, "
                             "dynamic_pool, dynamic_spec, exact_spec, exact_spec_fused, "
                             "exact_spec_inplace, exact_inplace_nospec")
    parser.add_argument("--json", type=Path, default=None,
                        help="default benchmarks/results/bert_case.json, or "
                             "bert_case_check_cost.json with --check-cost")
    args = parser.parse_args(argv)
    name = "bert_case_check_cost.json" if args.check_cost else "bert_case.json"
    args.json = args.json or REPO / "benchmarks" / "results" / name
    keys = tuple(args.rows.split(",")) if args.rows else None
    cfg = dict(QUICK if args.quick else FULL)
    if args.hidden:
        cfg.update(hidden=args.hidden, heads=max(1, args.hidden // 64), ffn=4 * args.hidden)
    cfg.update({k: v for k, v in (("layers", args.layers), ("batch", args.batch)) if v})
    cfg["max_seq"] = args.max_seq
    seqs = [int(s) for s in args.seqs.split(",")]
    if not all(1 <= s <= args.max_seq for s in seqs):
        parser.error(f"--seqs must lie in [1, {args.max_seq}] (--max-seq)")

    os.environ.setdefault("TVM_THREAD_POOL_SPIN_COUNT", "0")
    import tvm
    from relax_memplan.schedules import host_target

    target = tvm.target.Target({"kind": "llvm", "mcpu": args.mcpu}) if args.mcpu else host_target()
    mcpu = target.attrs.get("mcpu", "generic")
    log(f"config {cfg}, seqs {seqs}, target {target}")
    model = build_bert(cfg["hidden"], cfg["layers"], cfg["heads"], cfg["ffn"],
                       embeddings=args.embeddings)
    t0 = time.perf_counter()
    rows = compile_rows(model, cfg, target, keys=keys, check_cost=args.check_cost)
    ort_ms = measure(rows, model, cfg, seqs, args.repeats)
    rat = ratios(rows, seqs)
    bad = print_table(rows, ort_ms, seqs, cfg, f"llvm -mcpu={mcpu}", args.repeats, rat)
    cost = check_cost(rows, seqs)
    if cost is not None:
        print_check_cost(cost, seqs)
    plans = {r["key"]: r.pop("exact_plan") for r in rows if "exact_plan" in r}
    at = lambda plan: {s: plan.bytes_at({"batch": cfg["batch"], "seq": s})[:2]  # noqa: E731
                       for s in seqs} if plan is not None else {}
    arena, arena5 = at(plans.get("exact_spec")), at(plans.get("exact_spec_fused"))
    if arena and arena5:
        rat["fused_over_unfused_lower_bound"] = {s: arena5[s][1] / arena[s][1] for s in seqs}
        print("  row5/row4 lower bound (fusion / none)         "
              + ", ".join(f"seq {s}: {v:.3f}" for s, v in
                          rat["fused_over_unfused_lower_bound"].items()))
    inplace = inplace_bytes(plans, cfg["batch"], seqs)
    if inplace:
        print_inplace(inplace, seqs)
    result = {
        "config": cfg, "embeddings": args.embeddings, "seqs": seqs,
        "buckets": sorted(set(BUCKETS) | {args.max_seq}),
        "target": str(target), "repeats": args.repeats, "total_s": time.perf_counter() - t0,
        "rows": [{k: v for k, v in r.items() if k != "ex"} for r in rows],
        "onnxruntime_ms": ort_ms, "ratios": rat, "check_cost": cost,
        "exact_plan_arena_and_lower_bound_bytes": arena,
        "fused_exact_plan_arena_and_lower_bound_bytes": arena5,
        "exact_plan_inplace_bytes": inplace,
        "numerics_failed": [dict(zip(("row", "seq", "max_abs_error", "tolerance"), b))
                            for b in bad],
    }
    args.json.parent.mkdir(parents=True, exist_ok=True)
    args.json.write_text(json.dumps(result, indent=1, default=str) + "\n", encoding="utf-8")
    print(f"\nwritten {args.json} (total {result['total_s']:.0f} s)")
    return result


if __name__ == "__main__":
    main()
