"""One dense kernel, three builds: static, dynamic generic, dynamic + dispatch (open issue).

``x (8, seq, 768) @ W (768, 3072)`` (W constant), our CPU schedules, host target, through the
Relax VM. Prints the best-of-10 ms of each build at seq 64 (the bucket) and 128, and the
number of ``noalias`` attributes in each build's LLVM IR: the specialized branch of the
dispatch kernel runs at the generic speed, not the static one, and symbolic kernels carry no
``noalias`` (see the closing note of the kernel-dispatch issue).

Usage: python benchmarks/dispatch_micro.py
"""

from __future__ import annotations

import os

os.environ.setdefault("TVM_THREAD_POOL_SPIN_COUNT", "0")

import numpy as np  # noqa: E402
import tvm  # noqa: E402
from tvm import relax  # noqa: E402

from relax_memplan.pipeline import get_pipeline  # noqa: E402
from relax_memplan.schedules import host_target  # noqa: E402


def _dense(seq, w):
    bb = relax.BlockBuilder()
    x = relax.Var("x", relax.TensorType([8, seq, 768], "float32"))
    with bb.function("main", [x]):
        with bb.dataflow():
            out = bb.emit_output(bb.emit(relax.op.matmul(x, relax.const(w))))
        bb.emit_func_output(out)
    return bb.get()


def _noalias(ex) -> int:
    for mod in [ex.mod] + list(getattr(ex.mod, "imports", []) or []):
        try:
            source = mod.inspect_source("ll")
        except Exception:  # noqa: BLE001 - modules without LLVM IR
            continue
        if "define" in source:
            return source.count("noalias")
    return -1


def main() -> None:
    rng = np.random.default_rng(0)
    w = (rng.standard_normal((768, 3072)) * 0.02).astype("float32")
    tgt = host_target()
    seq = tvm.tirx.Var("seq", "int64")
    ranges = {"seq": (1, 128)}
    builds = {
        "dynamic generic": tvm.compile(_dense(seq, w), tgt, relax_pipeline=get_pipeline(
            tgt, schedule=True, dim_ranges=ranges)),
        "dynamic + dispatch": tvm.compile(_dense(seq, w), tgt, relax_pipeline=get_pipeline(
            tgt, schedule=True, dim_ranges=ranges, dispatch={"seq": [64, 128]})),
    }
    print(f"target {tgt}")
    for s in (64, 128):
        static = tvm.compile(_dense(s, w), tgt, relax_pipeline=get_pipeline(tgt, schedule=True))
        x = rng.standard_normal((8, s, 768)).astype("float32")
        gflop = 2 * 8 * s * 768 * 3072 / 1e9
        for name, ex in [(f"static seq={s}", static)] + list(builds.items()):
            vm = relax.VirtualMachine(ex, tvm.cpu())
            xs = tvm.runtime.tensor(x)
            np.testing.assert_allclose(vm["main"](xs).numpy(), x @ w, rtol=1e-3, atol=1e-3)
            t = min(vm.time_evaluator("main", tvm.cpu(), number=3, repeat=10)(xs).results)
            print(f"seq {s:>3}  {name:<20} {t * 1e3:8.1f} ms  {gflop / t:6.1f} GFLOP/s  "
                  f"noalias in IR: {_noalias(ex)}")


if __name__ == "__main__":
    main()
