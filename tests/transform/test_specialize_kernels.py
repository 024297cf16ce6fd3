"""Tests of SpecializeKernels: bucket versions of a symbolic kernel, dispatched in the kernel."""

from __future__ import annotations

import re

import numpy as np
import pytest
import tvm
from tvm import relax, tirx
from tvm.script import ir as I
from tvm.script import relax as R
from tvm.script import tirx as T

from relax_memplan.pipeline import backend_phases, get_pipeline
from relax_memplan.transform.specialize_kernels import (
    BUCKETS_ATTR,
    GENERIC,
    SpecializeKernels,
    dispatch_path,
)

SEQS = (16, 32, 7, 1, 40)
BUCKETS = {"seq": [16, 32]}
RNG = np.random.default_rng(0)
W = RNG.standard_normal((64, 32)).astype("float32")
B = RNG.standard_normal((32,)).astype("float32")


@I.ir_module
class Dense:
    @R.function
    def main(x: R.Tensor(("seq", 64), "float32"), w: R.Tensor((64, 32), "float32"),
             b: R.Tensor((32,), "float32")):
        R.func_attr({"tir_var_upper_bound": {"seq": 64}, "tir_var_lower_bound": {"seq": 1}})
        with R.dataflow():
            y = R.matmul(x, w)
            z = R.add(y, b)
            r = R.nn.relu(z)
            R.output(r)
        return r


@I.ir_module
class ScalarParams:
    @T.prim_func(private=True, s_tir=True)
    def add_dims(a: T.handle, n: T.int64, m: T.int64, o: T.handle):
        A = T.match_buffer(a, (m, 4))
        O = T.match_buffer(o, (m, 4))
        for i, j in T.grid(m, 4):
            with T.sblock("c"):
                vi, vj = T.axis.remap("SS", [i, j])
                O[vi, vj] = A[vi, vj] + T.Cast("float32", n * 10 + m)

    @T.prim_func(private=True, s_tir=True)
    def static_copy(a: T.Buffer((4, 4), "float32"), o: T.Buffer((4, 4), "float32")):
        for i, j in T.grid(4, 4):
            with T.sblock("c"):
                vi, vj = T.axis.remap("SS", [i, j])
                o[vi, vj] = a[vi, vj]

    @R.function
    def main(x: R.Tensor(("m", 4), "float32"), s: R.Shape(["n"]), c: R.Tensor((4, 4), "float32")):
        n = T.int64()
        m = T.int64()
        cls = ScalarParams
        y = R.call_tir(cls.add_dims, (x, n, m), out_ty=R.Tensor((m, 4), "float32"))
        z = R.call_tir(cls.static_copy, (c,), out_ty=R.Tensor((4, 4), "float32"))
        return (y, z)


def _dense_module():
    return relax.transform.BindParams("main", {"w": W, "b": B})(Dense)


def _legalized(dispatch_pass=None, target="llvm"):
    """The module after the library_dispatch and legalize phases."""
    tgt = tvm.target.Target(target)
    phases = dict(backend_phases(tgt, dispatch_pass=dispatch_pass))
    with tgt:
        mod = tvm.transform.Sequential(phases["library_dispatch"])(_dense_module())
        return tvm.transform.Sequential(phases["legalize"])(mod)


def _kernel_name(specialized):
    (name,) = specialized
    return name


def _marker_schedule(func, _target):
    """Test-only 'schedule': a static (specialized) version fills its output with the bucket value.

    The generic version (symbolic shapes) is returned unchanged, so its output is the
    real result; a specialized branch's output says which branch ran.
    """
    out = func.params[-1]
    shapes = [p.shape for p in func.params if tirx.is_buffer_var(p)]
    if not all(isinstance(d, tirx.IntImm) for shape in shapes for d in shape):
        return func
    value = tirx.FloatImm("float32", float(int(out.shape[0])))
    loops = [tirx.Var(f"i{k}", "int64") for k in range(len(out.shape))]
    body = tirx.BufferStore(out, value, loops)
    for var, extent in reversed(list(zip(loops, out.shape))):
        body = tirx.For(var, tirx.IntImm("int64", 0), tirx.IntImm("int64", int(extent)),
                        tirx.ForKind.SERIAL, body)
    return func.with_body(body)


def _build(dispatch_pass, target="llvm"):
    tgt = tvm.target.Target(target)
    return tvm.compile(_dense_module(), tgt,
                       relax_pipeline=get_pipeline(tgt, dispatch_pass=dispatch_pass))


def _run(vm, seq):
    x = RNG.standard_normal((seq, 64)).astype("float32")
    out = vm["main"](tvm.runtime.tensor(x)).numpy()
    return out, np.maximum(x @ W + B, 0)


@pytest.fixture(scope="module")
def built():
    dispatch = SpecializeKernels(BUCKETS)
    ex = _build(dispatch)
    return dispatch, relax.VirtualMachine(ex, tvm.cpu())


def test_specialized_and_generic_paths_match_numpy(built):
    dispatch, vm = built
    kernel = _kernel_name(dispatch.specialized)
    paths = set()
    for seq in SEQS:
        out, expected = _run(vm, seq)
        assert out.shape == (seq, 32)
        np.testing.assert_allclose(out, expected, rtol=1e-4, atol=1e-4)
        paths.add(dispatch_path(dispatch.specialized, {"seq": seq})[kernel])
    assert paths == {"seq=16", "seq=32", GENERIC}


def test_specialized_kernels_are_recorded(built):
    dispatch, _vm = built
    kernel = _kernel_name(dispatch.specialized)
    assert kernel.startswith("fused_matmul")
    assert dispatch.specialized == {kernel: {"seq": [16, 32]}}
    assert dispatch.skipped == []


def test_runtime_takes_the_branch_dispatch_path_names():
    dispatch = SpecializeKernels(BUCKETS, schedule=_marker_schedule)
    vm = relax.VirtualMachine(_build(dispatch), tvm.cpu())
    kernel = _kernel_name(dispatch.specialized)
    for seq in SEQS:
        out, expected = _run(vm, seq)
        path = dispatch_path(dispatch.specialized, {"seq": seq})[kernel]
        if path == GENERIC:
            np.testing.assert_allclose(out, expected, rtol=1e-4, atol=1e-4)
        else:
            assert path == f"seq={seq}"
            np.testing.assert_array_equal(out, np.full((seq, 32), float(seq), "float32"))


def test_dispatch_path_labels_and_missing_dim():
    specialized = {"k1": {"seq": [16, 32]}, "k2": {"seq": [16], "batch": [1, 2]}}
    assert dispatch_path(specialized, {"seq": 16, "batch": 2}) == {"k1": "seq=16",
                                                                 "k2": "seq=16,batch=2"}
    assert dispatch_path(specialized, {"seq": 32, "batch": 1}) == {"k1": "seq=32", "k2": GENERIC}
    assert dispatch_path(specialized, {"seq": 8, "batch": 1}) == {"k1": GENERIC, "k2": GENERIC}
    with pytest.raises(ValueError, match="batch"):
        dispatch_path(specialized, {"seq": 16})


def test_kernel_dispatches_on_the_var_and_relax_graph_is_unchanged():
    dispatch = SpecializeKernels(BUCKETS)
    mod = _legalized(dispatch)
    plain = _legalized()
    kernel = _kernel_name(dispatch.specialized)
    func = mod[kernel]
    assert {k: [int(v) for v in vs] for k, vs in func.attrs[BUCKETS_ATTR].items()} == BUCKETS
    assert bool(func.attrs["tirx.is_scheduled"])
    branch = func.body
    conditions = []
    while isinstance(branch, tirx.IfThenElse):
        conditions.append(branch.condition)
        branch = branch.else_case
    assert [re.sub(r"\s+", "", str(c)) for c in conditions] == [
        "T.tvm_thread_invariant(seq==T.int64(16))", "T.tvm_thread_invariant(seq==T.int64(32))"]
    # the generic version is the last else, with the signature's symbolic shapes
    tvm.ir.assert_structural_equal(branch, plain[kernel].body)
    assert [str(p.shape) for p in func.params] == [str(p.shape) for p in plain[kernel].params]
    # same Relax graph, same tensors and shapes: the memory plan holds on every path
    tvm.ir.assert_structural_equal(mod["main"], plain["main"], map_free_vars=True)


def test_bucket_outside_declared_range_is_skipped():
    dispatch = SpecializeKernels({"seq": [16, 128]})
    _legalized(dispatch)
    kernel = _kernel_name(dispatch.specialized)
    assert dispatch.specialized == {kernel: {"seq": [16]}}
    assert len(dispatch.skipped) == 1 and "seq=128" in dispatch.skipped[0]
    assert "[1, 64]" in dispatch.skipped[0]

    none_fit = SpecializeKernels({"seq": [65]})
    mod = _legalized(none_fit)
    assert none_fit.specialized == {}
    tvm.ir.assert_structural_equal(mod, _legalized())


def test_scalar_params_several_vars_and_untouched_kernel():
    dispatch = SpecializeKernels({"n": [3], "m": [2, 5]})
    mod = dispatch(ScalarParams)
    assert dispatch.specialized == {"add_dims": {"n": [3], "m": [2, 5]}}
    tvm.ir.assert_structural_equal(mod["static_copy"], ScalarParams["static_copy"])
    vm = relax.VirtualMachine(tvm.compile(mod, "llvm"), tvm.cpu())
    c = RNG.standard_normal((4, 4)).astype("float32")
    for n, m in [(3, 2), (3, 5), (4, 2), (3, 7)]:
        x = RNG.standard_normal((m, 4)).astype("float32")
        y, z = vm["main"](tvm.runtime.tensor(x), tvm.runtime.ShapeTuple([n]), tvm.runtime.tensor(c))
        np.testing.assert_allclose(y.numpy(), x + n * 10 + m, rtol=1e-6)
        np.testing.assert_array_equal(z.numpy(), c)
        expected = f"n={n},m={m}" if (n, m) in [(3, 2), (3, 5)] else GENERIC
        assert dispatch_path(dispatch.specialized, {"n": n, "m": m})["add_dims"] == expected


@pytest.mark.parametrize(
    "buckets, error, match",
    [
        ({"seq": [16, 0]}, ValueError, "bucket value 0 of var 'seq' is not positive"),
        ({"seq": [-4]}, ValueError, "not positive"),
        ({"seq": []}, ValueError, "empty"),
        ({"seq": 16}, TypeError, "sequence of ints"),
        ({"seq": [16.0]}, TypeError, "must hold ints"),
        ("seq", TypeError, "buckets must map"),
    ],
)
def test_bad_buckets_rejected_at_construction(buckets, error, match):
    with pytest.raises(error, match=match):
        SpecializeKernels(buckets)


def test_unknown_var_names_the_var():
    with pytest.raises(ValueError, match="'batch'.*not symbolic dims of any function"):
        _legalized(SpecializeKernels({"seq": [16], "batch": [1]}))


def _cuda_kernels(src):
    pattern = r'extern "C" __global__ void (?:__launch_bounds__\(\d+\) )?(\w+)\(([^)]*)\)\s*\{'
    return re.findall(pattern, src)


def _find_module(mod, kind):
    if mod.kind == kind:
        return mod
    for sub in mod.imports:
        found = _find_module(sub, kind)
        if found is not None:
            return found
    return None


def test_cuda_build_has_one_device_kernel_per_branch():
    if tvm.get_global_func("target.build.cuda", allow_missing=True) is None:
        pytest.skip("TVM built without CUDA codegen")
    tgt = tvm.target.Target({"kind": "cuda", "arch": "sm_80"})
    ex = tvm.compile(_dense_module(), tgt, relax_pipeline=get_pipeline(tgt, dispatch=BUCKETS))
    cuda = _find_module(ex.mod, "cuda")
    assert cuda is not None
    kernels = _cuda_kernels(cuda.inspect_source())
    names = [name for name, _ in kernels]
    assert len(names) == len(set(names)) == 3, names
    # two static kernels (seq=16, seq=32) and the generic one taking seq
    assert sorted("seq" in params for _, params in kernels) == [False, False, True]


@pytest.mark.parametrize("target", ["llvm", "cuda"])
def test_pipeline_inserts_the_pass_right_after_fuse_tir(target):
    phases = dict(backend_phases(tvm.target.Target(target), dispatch=BUCKETS))
    names = [p.info.name for p in phases["legalize"]]
    assert names[names.index("FuseTIR") + 1] == "SpecializeKernels"
    assert "SpecializeKernels" not in [p.info.name for p in dict(backend_phases(
        tvm.target.Target(target)))["legalize"]]


def test_pipeline_with_cpu_schedules_runs_every_path():
    tgt = tvm.target.Target("llvm")
    ex = tvm.compile(_dense_module(), tgt,
                     relax_pipeline=get_pipeline(tgt, dispatch=BUCKETS, schedule=True))
    vm = relax.VirtualMachine(ex, tvm.cpu())
    for seq in SEQS:
        out, expected = _run(vm, seq)
        np.testing.assert_allclose(out, expected, rtol=1e-4, atol=1e-4)
