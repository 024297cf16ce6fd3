"""Tests of AnnotateNoAlias: single-pointer helpers marked, so TVM's codegen keeps kernels' noalias."""

from __future__ import annotations

import re

import numpy as np
import pytest
import tvm
from tvm import relax
from tvm.script import ir as I
from tvm.script import relax as R
from tvm.script import tirx as T

from relax_memplan.pipeline import backend_phases, get_pipeline
from relax_memplan.transform.annotate_no_alias import AnnotateNoAlias, pointer_vars
from relax_memplan.transform.plan_static_memory import PlanStaticMemory


@I.ir_module
class Before:
    @T.prim_func(s_tir=True)
    def shape_func(H: T.Buffer((2,), "int64")):
        T.func_attr({"tirx.is_host_func": True})
        H[1] = H[0] * T.int64(3)

    @T.prim_func(s_tir=True)
    def check_dims(seq: T.int64):
        T.evaluate(seq)

    @T.prim_func(s_tir=True)
    def copy(a: T.Buffer((4,), "float32"), b: T.Buffer((4,), "float32")):
        for i in range(4):
            b[i] = a[i]

    @T.prim_func(s_tir=True)
    def kernel(a: T.Buffer((4,), "float32"), b: T.Buffer((4,), "float32")):
        T.func_attr({"tirx.noalias": True})
        for i in range(4):
            b[i] = a[i]


@I.ir_module
class Expected:
    @T.prim_func(s_tir=True)
    def shape_func(H: T.Buffer((2,), "int64")):
        T.func_attr({"tirx.is_host_func": True, "tirx.noalias": True})
        H[1] = H[0] * T.int64(3)

    @T.prim_func(s_tir=True)
    def check_dims(seq: T.int64):
        T.func_attr({"tirx.noalias": True})
        T.evaluate(seq)

    @T.prim_func(s_tir=True)
    def copy(a: T.Buffer((4,), "float32"), b: T.Buffer((4,), "float32")):
        for i in range(4):
            b[i] = a[i]

    @T.prim_func(s_tir=True)
    def kernel(a: T.Buffer((4,), "float32"), b: T.Buffer((4,), "float32")):
        T.func_attr({"tirx.noalias": True})
        for i in range(4):
            b[i] = a[i]


def test_single_pointer_helpers_are_marked_and_two_pointer_func_left_alone():
    annotate = AnnotateNoAlias()
    after = annotate(Before)
    tvm.ir.assert_structural_equal(after, Expected)
    assert sorted(annotate.annotated) == ["check_dims", "shape_func"]
    assert annotate.unrestricted == ["copy: 2 pointers (a, b)"]


def test_pointer_vars_counts_allocated_buffers():
    @T.prim_func(s_tir=True)
    def with_alloc(h: T.Buffer((2,), "int64")):
        tmp = T.alloc_buffer((2,), "int64")
        tmp[0] = h[0]
        h[1] = tmp[0]

    assert pointer_vars(with_alloc) == ["h", "tmp"]
    annotate = AnnotateNoAlias()
    after = annotate(tvm.IRModule({"f": with_alloc}))
    assert annotate.annotated == [] and annotate.unrestricted == ["f: 2 pointers (h, tmp)"]
    tvm.ir.assert_structural_equal(after["f"], with_alloc)


def _llvm_ir(built) -> str:
    """LLVM IR of a ``tvm.compile`` executable or a ``tvm.tirx.build`` module."""
    root = built.mod if isinstance(built, relax.VMExecutable) else built
    for mod in [root] + list(root.imports):
        try:
            source = mod.inspect_source("ll")
        except Exception:  # noqa: BLE001 - modules without LLVM IR
            continue
        if "define" in source:
            return source
    raise AssertionError("no LLVM module in the build")


def _compute_signature(ir: str, kernel: str) -> str:
    (line,) = [ln for ln in ir.splitlines()
               if re.match(rf"define .*@{re.escape(kernel)}_compute_\(", ln)]
    return line


def _tiny_module(helper_symbol: str) -> tvm.IRModule:
    @T.prim_func(s_tir=True)
    def kernel(a: T.Buffer((64,), "float32"), b: T.Buffer((64,), "float32")):
        T.func_attr({"tirx.noalias": True})
        for i in range(64):
            b[i] = a[i]

    @T.prim_func(s_tir=True)
    def helper(n: T.int64):
        T.evaluate(n)

    return tvm.IRModule({"kernel": kernel.with_attr("global_symbol", "kernel"),
                         helper_symbol: helper.with_attr("global_symbol", helper_symbol)})


def test_tvm_codegen_emits_all_functions_with_the_last_symbols_noalias():
    """The TVM 0.27 behaviour AnnotateNoAlias works around (if this fails, TVM fixed it)."""
    last = _llvm_ir(tvm.tirx.build(_tiny_module("zz_helper"), target="llvm"))
    first = _llvm_ir(tvm.tirx.build(_tiny_module("aa_helper"), target="llvm"))
    assert "noalias" not in last  # helper sorts last: the kernel lost its noalias
    assert "noalias" in _compute_signature(first, "kernel")
    fixed = _llvm_ir(tvm.tirx.build(AnnotateNoAlias()(_tiny_module("zz_helper")), target="llvm"))
    assert "noalias" in _compute_signature(fixed, "kernel")


@I.ir_module
class Dense:
    @R.function
    def main(x: R.Tensor(("seq", 64), "float32"), w: R.Tensor((64, 32), "float32")):
        R.func_attr({"tir_var_upper_bound": {"seq": 64}, "tir_var_lower_bound": {"seq": 1}})
        with R.dataflow():
            y = R.matmul(x, w)
            R.output(y)
        return y


def test_symbolic_build_kernels_keep_noalias_and_match_numpy():
    tgt = tvm.target.Target("llvm")
    ex = tvm.compile(Dense, tgt, relax_pipeline=get_pipeline(tgt, schedule=True,
                                                             dim_ranges={"seq": (1, 64)}))
    signature = _compute_signature(_llvm_ir(ex), "matmul")
    assert signature.count("noalias") == 3, signature  # x, w, the output
    vm = relax.VirtualMachine(ex, tvm.cpu())
    rng = np.random.default_rng(0)
    w = rng.standard_normal((64, 32)).astype("float32")
    for seq in (1, 17, 64):
        x = rng.standard_normal((seq, 64)).astype("float32")
        out = vm["main"](tvm.runtime.tensor(x), tvm.runtime.tensor(w)).numpy()
        np.testing.assert_allclose(out, x @ w, rtol=1e-4, atol=1e-4)


@pytest.mark.parametrize("plan_pass", [None, PlanStaticMemory()], ids=["tvm", "relax_memplan"])
def test_pass_is_last_in_finalize_for_both_planners(plan_pass):
    phases = dict(backend_phases(tvm.target.Target("llvm"), plan_pass=plan_pass))
    assert phases["finalize"][-1].info.name == "AnnotateNoAlias"
