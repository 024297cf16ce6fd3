"""The ``attention`` case of ``benchmarks/gpu_check.py``: our fused attention kernel on a GPU.

For bert-tiny and gpt2-tiny (causal), four CUDA builds each: fused (``fusion=True``, our
:class:`~relax_memplan.transform.FuseAttention` with its CUDA kernel) and unfused (TVM's
FuseOps alone), each static at seq 77 (not a multiple of any block size) and symbolic
(seq in [1, 128]) run at seq 1, 77 and 128. Every run is compared with onnxruntime on the CPU
(same inputs): max abs error and max relative error ``max|out - ref| / max|ref|`` over all
outputs, which must be <= :data:`REL_TOL` (1e-4) for the fused builds; the unfused ones are
reported for reference. Kernel time: with the VM's instrument hook and a device sync around
every packed call, ms per ``main`` call of ``fused_attention`` and of the kernels the fusion
replaces (QK^T matmul with scale and mask, softmax, PV matmul, transposes: the multiset
difference of the two builds' kernel names), min over interleaved rounds.

Each build and each run is in its own ``try``: a failure is a row with its error (printed as
a ``FAILED`` line by gpu_check), the rest still runs.
"""

from __future__ import annotations

import dataclasses
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Dict, List, Optional, Tuple

import numpy as np
import tvm
from tvm import relax

from attention_bench import kernel_times  # benchmarks/, next to this file
from relax_memplan import frontend
from relax_memplan.compile import build
from relax_memplan.pipeline import PipelineOptions, PipelinePasses
from relax_memplan.errors import RelaxMemplanError
from relax_memplan.runtime import kernels_per_call

REL_TOL = 1e-4
MODELS = {  # name -> (file, batch dim, seq dim)
    "bert-tiny": ("bert-tiny-randw.onnx", "batch", "seq"),
    "gpt2-tiny": ("gpt2-tiny-randw.onnx", None, None),  # dims read from the import
}
STATIC_SEQ = 77
SYMBOLIC_SEQS = (1, 77, 128)
SEQ_RANGE = (1, 128)


@dataclass
class AttentionRow:
    """One build of one model run at one seq (times in ms)."""

    model: str
    build: str  # "fused static", "unfused symbolic", ...
    seq: int
    build_s: Optional[float] = None
    max_abs_error: Optional[float] = None
    max_rel_error: Optional[float] = None
    fused_kernel_ms: Optional[float] = None  # fused builds: fused_attention per main call
    replaced_kernels_ms: Optional[float] = None  # the unfused build's kernels it replaces
    kernels_per_call: Optional[int] = None
    error: Optional[str] = None

    @property
    def verified(self) -> Optional[bool]:
        if self.max_rel_error is None or not self.build.startswith("fused"):
            return None
        return self.max_rel_error <= REL_TOL


def _dims(mod) -> Tuple[str, str]:
    """(batch dim, seq dim) names of the first input."""
    shape = mod["main"].params[0].ty.shape.values
    return str(shape[0]), str(shape[1])


def _errors(outputs, reference) -> Tuple[float, float]:
    abs_err = max(float(np.abs(np.asarray(o, "float64") - r).max()) for o, r in zip(outputs, reference))
    ref_max = max(float(np.abs(r).max()) for r in reference)
    return abs_err, abs_err / ref_max if ref_max else abs_err


def _outputs(result) -> List[np.ndarray]:
    items = result if isinstance(result, (tvm.ir.Array, list, tuple)) else [result]
    return [x.numpy() for x in items]


def _builds(name: str, path: Path, target, say) -> Tuple[object, Dict[str, Tuple]]:
    """Import and build the four ways: build label -> (executable or error, seconds, module)."""
    onnx_model = frontend.load_onnx(path)
    probe, _ = frontend.import_onnx(onnx_model, keep_dynamic=True)
    batch, seq = _dims(probe)
    names = [p.name for p in probe["main"].params]
    static, static_info = frontend.import_onnx(onnx_model, {n: (1, STATIC_SEQ) for n in names})
    dynamic, dynamic_info = frontend.import_onnx(onnx_model, keep_dynamic=True)
    ranges = {batch: (1, 2), seq: SEQ_RANGE}
    builds = {}
    for fusion in (True, False):
        for kind, mod, info, kwargs in (("static", static, static_info, {}),
                                        ("symbolic", dynamic, dynamic_info,
                                         {"dim_ranges": ranges})):
            label = f"{'fused' if fusion else 'unfused'} {kind}"
            say(f"attention: building {name} {label} for {target.attrs.get('arch', 'cuda')}")
            t0 = time.perf_counter()
            try:
                ex = build(mod, target, PipelineOptions(fusion=fusion, **kwargs),
                           PipelinePasses())
            except (RelaxMemplanError, tvm.error.TVMError) as err:
                ex = RelaxMemplanError(" ".join(str(err).split())[:300])
            builds[label] = (ex, round(time.perf_counter() - t0, 2), info)
    return onnx_model, builds


def check_attention(models_dir: Path, target, dev, run: bool, say,
                    models=tuple(MODELS), rounds: int = 20, repeats: int = 3) -> List[AttentionRow]:
    """Rows for every model, build and seq; nothing runs when ``run`` is False."""
    rows: List[AttentionRow] = []
    for name in models:
        path = models_dir / MODELS[name][0]
        if not path.exists():
            rows.append(AttentionRow(name, "-", 0, error=f"skipped: {path} not found"))
            continue
        try:
            onnx_model, builds = _builds(name, path, target, say)
        except Exception as err:  # noqa: BLE001 -- one model's failure must not stop the rest
            rows.append(AttentionRow(name, "import", 0, error=f"{type(err).__name__}: {err}"))
            continue
        for seq in SYMBOLIC_SEQS:
            rows += _run_seq(name, onnx_model, builds, seq, dev, run, say, rounds, repeats)
    return rows


def _run_seq(name, onnx_model, builds, seq, dev, run, say, rounds, repeats) -> List[AttentionRow]:
    """The builds that serve ``seq`` (static ones only at their seq), run and timed."""
    labels = [b for b in builds if "symbolic" in b or seq == STATIC_SEQ]
    rows = {b: AttentionRow(name, b, seq, build_s=builds[b][1]) for b in labels}
    for b, row in rows.items():
        if isinstance(builds[b][0], Exception):
            row.error = f"build failed: {builds[b][0]}"
    if not run:
        return list(rows.values())
    info = builds[labels[0]][2]
    point = dataclasses.replace(info, input_shapes={n: (1, seq) for n in info.input_shapes})
    feed = frontend.make_random_inputs(onnx_model, point, seed=seq)
    reference = [np.asarray(r, "float64") for r in frontend.run_onnxruntime(onnx_model, feed)]
    vms = {}
    for b, row in rows.items():
        if row.error:
            continue
        say(f"attention: running {name} {b} at seq {seq}")
        try:
            vm = relax.VirtualMachine(builds[b][0], dev)
            args = [tvm.runtime.tensor(x, dev) for x in feed.values()]
            row.max_abs_error, row.max_rel_error = _errors(_outputs(vm["main"](*args)), reference)
            vms[b] = (vm, args)
        except Exception as err:  # noqa: BLE001 -- reported as a FAILED row
            row.error = f"run failed: {type(err).__name__}: {' '.join(str(err).split())[:300]}"
    for kind in ("static", "symbolic"):
        fused, plain = f"fused {kind}", f"unfused {kind}"
        if fused in vms and plain in vms:
            try:
                _time_pair(rows[fused], rows[plain], vms[fused], vms[plain], dev, rounds, repeats)
            except Exception as err:  # noqa: BLE001
                rows[fused].error = f"timing failed: {type(err).__name__}: {err}"
    return list(rows.values())


def _time_pair(fused_row, plain_row, fused, plain, dev, rounds, repeats) -> None:
    fused_ms, replaced_ms = [], []
    for _ in range(repeats):  # interleaved; the min is the least disturbed round
        ours = kernel_times(*fused, rounds, sync=dev.sync)
        theirs = kernel_times(*plain, rounds, sync=dev.sync)
        fused_ms.append(ours.get("fused_attention", float("nan")))
        replaced_ms.append(sum(t for k, t in theirs.items() if k not in ours))
    fused_row.fused_kernel_ms = round(1e3 * min(fused_ms), 4)
    fused_row.replaced_kernels_ms = round(1e3 * min(replaced_ms), 4)
    fused_row.kernels_per_call, plain_row.kernels_per_call = (
        kernels_per_call(*pair) for pair in (fused, plain))



def format_attention(rows: List[AttentionRow]) -> str:
    """The table gpu_check prints; a FAILED line under each row with an error."""
    def f(x, spec):
        return "-" if x is None else format(x, spec)

    header = (f"{'model':<11}{'build':<18}{'seq':>5}{'kernels':>8}{'abs err':>10}{'rel err':>10}"
              f"{'fused ms':>10}{'replaced':>10}{'ratio':>7}  ok")
    lines = [header, "-" * len(header)]
    for r in rows:
        ratio = (r.fused_kernel_ms / r.replaced_kernels_ms
                 if r.fused_kernel_ms is not None and r.replaced_kernels_ms else None)
        ok = {True: "yes", False: "NO", None: "-"}[r.verified]
        lines.append(f"{r.model:<11}{r.build:<18}{r.seq:>5}{f(r.kernels_per_call, 'd'):>8}"
                     f"{f(r.max_abs_error, '.2g'):>10}{f(r.max_rel_error, '.2g'):>10}"
                     f"{f(r.fused_kernel_ms, '.4f'):>10}{f(r.replaced_kernels_ms, '.4f'):>10}"
                     f"{f(ratio, '.2f'):>7}  {ok}")
        if r.error:
            lines.append(f"    FAILED: {r.model} {r.build} seq {r.seq}: {r.error}")
    return "\n".join(lines)
