"""Resident bytes of a build: distinct constants as the VM stores them, kernel workspace by
whether a parallel loop encloses it, and the report's total."""

import json
import re

import numpy as np
import pytest
import tvm
from tvm import relax
from tvm.script import tirx as T

from relax_memplan.cli import main
from relax_memplan.analysis.resident import (MAX_STACK_ALLOCA_BYTES, KernelWorkspace,
                                            ResidentBytes, constant_tensors, kernel_workspace)


def _module_with_constants(*arrays):
    """main(x) adds each constant in turn (their order, repeats allowed)."""
    bb = relax.BlockBuilder()
    x = relax.Var("x", relax.TensorType((4, 4), "float32"))
    with bb.function("main", [x]):
        with bb.dataflow():
            value = x
            for array in arrays:
                value = bb.emit(relax.op.add(value, array))
            out = bb.emit_output(value)
        bb.emit_func_output(out)
    return bb.get()


def test_equal_constants_count_once_as_the_vm_stores_them():
    w = np.random.default_rng(0).random((4, 4), dtype=np.float32)
    other = w.copy()
    other[3, 3] += 1  # equal but for the last element: its own tensor
    one = relax.const(w)
    mod = _module_with_constants(one, one, relax.const(w.copy()), relax.const(other))
    assert constant_tensors(mod) == (2, 2 * 64)
    pool = tvm.compile(mod, "llvm").mod["stats"]().splitlines()[1]
    assert len(re.findall(r"(?<![a-z])\[4, 4\]", pool)) == 2  # the VM's pool agrees


@T.prim_func
def _kernel(A: T.Buffer((1024,), "float32"), B: T.Buffer((1024,), "float32")):
    big = T.alloc_buffer((1024,), "float32")
    small = T.alloc_buffer((16,), "float32")
    for i in T.parallel(4):
        tmp = T.alloc_buffer((512,), "float32")
        for j in range(256):
            tmp[j] = A[i * 256 + j]
        for j in range(256):
            big[i * 256 + j] = tmp[j]
    for i in range(1024):
        small[i % 16] = big[i]
        B[i] = small[i % 16]


def test_kernel_workspace_counts_per_thread_buffers_and_skips_stack_ones():
    ws = kernel_workspace("k", _kernel)
    assert ws == KernelWorkspace("k", shared_bytes=4096, per_thread_bytes=2048)
    assert 16 * 4 <= MAX_STACK_ALLOCA_BYTES  # why `small` is not counted
    assert ws.bytes_with(3) == 4096 + 3 * 2048


def test_resident_total_takes_the_largest_kernel_at_the_thread_count():
    resident = ResidentBytes(constants_bytes=1000, num_constants=2, threads=4,
                             kernels=[KernelWorkspace("a", 5000, 0),
                                      KernelWorkspace("b", 1000, 2000)])
    assert resident.largest_workspace.kernel == "b" and resident.workspace_bytes == 9000
    assert resident.total_bytes(300) == 1000 + 300 + 9000
    resident.threads = 1
    assert resident.largest_workspace.kernel == "a" and resident.total_bytes(0) == 6000


def test_compile_report_gives_constants_per_call_and_workspace(tmp_path, capsys):
    from .conftest import dense_model
    import onnx

    onnx.save(dense_model(0), str(tmp_path / "m.onnx"))
    assert main(["compile", str(tmp_path / "m.onnx"), "--no-compare", "--report",
                 str(tmp_path / "r.json")]) == 0
    text = capsys.readouterr().out
    report = json.loads((tmp_path / "r.json").read_text())
    resident = report["resident"]
    assert resident["constants_bytes"] == (64 * 256 + 256) * 4
    assert resident["per_call_bytes"] == report["expected_runtime_alloc_bytes"]
    assert resident["resident_bytes"] == (resident["constants_bytes"] + resident["per_call_bytes"]
                                          + resident["workspace_bytes"])
    assert f"{resident['resident_bytes']:,} B" in text and "constants in the library" in text
