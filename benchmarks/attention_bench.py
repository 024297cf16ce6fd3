"""The fused attention kernel alone against the kernels it replaces, at BERT-base shapes.

One attention block as TVM's ONNX importer writes it (q, k, v (batch, seq, heads, head_dim),
``matmul(q^T, k^T) / sqrt(head_dim) + mask (batch, 1, 1, seq)``, softmax, ``matmul(., v)``,
transposes) is built without and with our fusion, both ways the ``default`` build
(plain ``llvm``, no CPU schedules) and the ``schedule`` build (``schedule=True`` for the host
CPU, :func:`~relax_memplan.schedules.host_target`). Kernels are timed with the VM's instrument
hook (a timestamp before and after each packed call), interleaved rounds, min over rounds.

Columns: ``fused`` ms of the fused kernel; ``three`` ms of the three kernels at the heart of
what the fusion replaces (QK^T matmul with scale and mask, softmax, PV matmul); ``all`` ms of
every kernel the fusion removes (those three and the transposes in and out); ``ratio_all =
fused / all`` (the acceptance figure: <= 1.0 at every row) and ``ratio3 = fused / three``. Rows:
every sequence length of ``--seqs`` (queries = keys) x head dim of ``--head-dims``. The machine
is shared: compare the ratios within one run; ms move with the load.

Usage: python benchmarks/attention_bench.py [--seqs 1,8,16,32,128,512] [--batch 1] [--heads 12]
[--head-dims 32,64,80,128] [--builds default,schedule] [--json PATH]
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

import numpy as np
import tvm
from tvm import relax

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))  # measure this checkout, not another installed copy

from relax_memplan.compile import build  # noqa: E402
from relax_memplan.pipeline import PipelineOptions, PipelinePasses  # noqa: E402
from relax_memplan.runtime import kernel_profile  # noqa: E402
from relax_memplan.schedules import host_target  # noqa: E402

BUILDS = {"default": ("llvm", False), "schedule": (None, True)}  # None: host_target()
THREE = ("fused_matmul_divide_add", "fused_matmul_multiply_add", "matmul", "softmax")


def attention_block(batch: int, seq: int, heads: int, head_dim: int, seed: int = 0):
    """One BERT attention block (importer form) at fixed shapes, and random inputs."""
    from tvm.script import ir as I, relax as R

    scale = float(np.sqrt(head_dim))

    @I.ir_module
    class Block:
        @R.function
        def main(q: R.Tensor(("b", "s", heads, head_dim), "float32"),
                 k: R.Tensor(("b", "s", heads, head_dim), "float32"),
                 v: R.Tensor(("b", "s", heads, head_dim), "float32"),
                 mask: R.Tensor(("b", 1, 1, "s"), "float32")):
            with R.dataflow():
                sc = R.matmul(R.permute_dims(q, [0, 2, 1, 3]), R.permute_dims(k, [0, 2, 3, 1]))
                p = R.nn.softmax(R.add(R.divide(sc, R.const(scale, "float32")), mask), axis=-1)
                o = R.permute_dims(R.matmul(p, R.permute_dims(v, [0, 2, 1, 3])), [0, 2, 1, 3])
                R.output(o)
            return o

    mod = relax.transform.BindSymbolicVars({"b": batch, "s": seq})(Block)
    rng = np.random.default_rng(seed)
    shapes = [(batch, seq, heads, head_dim)] * 3
    arrays = [rng.standard_normal(s).astype("float32") for s in shapes]
    arrays.append(np.where(rng.random((batch, 1, 1, seq)) < 0.1, -10000.0, 0.0).astype("float32"))
    return mod, arrays


def kernel_times(vm, args, rounds: int, sync=None):
    """Kernel name without digits -> seconds per ``main`` call (mean over ``rounds``);
    ``sync`` (e.g. a GPU device's ``sync``) is called around every kernel."""
    return {k: s for k, (s, _n) in kernel_profile(vm, args, rounds, sync=sync).items()}


def measure(mod, arrays, build_name: str, rounds: int, repeats: int) -> dict:
    """ms of the fused kernel, of the three replaced kernels and of all replaced ones."""
    target, schedule = BUILDS[build_name]
    target = target or host_target()
    args = [tvm.runtime.tensor(x) for x in arrays]
    vms, outs = {}, {}
    for fusion in (False, True):
        ex = build(mod, target, PipelineOptions(fusion=fusion, schedule=schedule),
                   PipelinePasses())
        vms[fusion] = relax.VirtualMachine(ex, tvm.cpu())
        outs[fusion] = vms[fusion]["main"](*args).numpy()
    rel_err = float(np.abs(outs[True] - outs[False]).max() / np.abs(outs[False]).max())
    fused, three, every = [], [], []
    for _ in range(repeats):  # interleaved; the min is the least disturbed round
        plain, ours = (kernel_times(vms[f], args, rounds) for f in (False, True))
        fused.append(ours["fused_attention"])
        three.append(sum(t for k, t in plain.items() if k in THREE))
        every.append(sum(t for k, t in plain.items() if k not in ours))
    fused_ms, three_ms, all_ms = (1e3 * min(x) for x in (fused, three, every))
    return {"build": build_name, "fused_ms": round(fused_ms, 3), "three_ms": round(three_ms, 3),
            "all_replaced_ms": round(all_ms, 3), "ratio3": round(fused_ms / three_ms, 3),
            "ratio_all": round(fused_ms / all_ms, 3), "rel_err_vs_unfused": rel_err,
            "unfused_kernels": sorted(plain)}


def main(argv=None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seqs", default="1,8,16,32,64,128,256,512")
    parser.add_argument("--batch", type=int, default=1)
    parser.add_argument("--heads", type=int, default=12)
    parser.add_argument("--head-dims", default="32,64,80,128")
    parser.add_argument("--builds", default="default,schedule")
    parser.add_argument("--rounds", type=int, default=3, help="calls per timed round")
    parser.add_argument("--repeats", type=int, default=5, help="interleaved rounds (min taken)")
    parser.add_argument("--json", default=str(REPO / "benchmarks" / "results" / "attention.json"))
    args = parser.parse_args(argv)
    builds = args.builds.split(",")
    rows = []
    print(f"batch {args.batch}, heads {args.heads}; ms per call, min over {args.repeats} "
          f"interleaved rounds; host {host_target()}; TVM threads {tvm.runtime.num_threads()}")
    print(f"{'dim':>4}{'seq':>5}" + "".join(f"{b + ' fused':>17}{'three':>10}{'all':>10}"
                                            f"{'ratio3':>7}{'r_all':>7}" for b in builds))
    for head_dim in (int(d) for d in args.head_dims.split(",") if d):
        for seq in (int(s) for s in args.seqs.split(",") if s):
            mod, arrays = attention_block(args.batch, seq, args.heads, head_dim, seed=seq)
            line = f"{head_dim:>4}{seq:>5}"
            for b in builds:
                row = dict(measure(mod, arrays, b, args.rounds, args.repeats), seq=seq,
                           head_dim=head_dim)
                rows.append(row)
                line += (f"{row['fused_ms']:>17.4f}{row['three_ms']:>10.4f}"
                         f"{row['all_replaced_ms']:>10.4f}{row['ratio3']:>7.2f}"
                         f"{row['ratio_all']:>7.2f}")
            print(line, flush=True)
    out = Path(args.json)
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps({"batch": args.batch, "heads": args.heads,
                               "host_target": str(host_target()),
                               "threads": tvm.runtime.num_threads(), "rows": rows},
                              indent=2) + "\n")
    print(f"wrote {out}")


if __name__ == "__main__":
    main()
