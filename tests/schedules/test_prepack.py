"""Constant matmul weights packed at compile time (relax_memplan.schedules.prepack)."""

import numpy as np
import pytest
import tvm
from tvm import relax, tirx

from relax_memplan.pipeline import get_pipeline
from relax_memplan.schedules import cpu_schedule_pass
from relax_memplan.schedules.prepack import (LAYOUT_FREE_ATTR, mark_constant_weights,
                                             split_prepacked_weights)

AVX512 = tvm.target.Target({"kind": "llvm", "mcpu": "skylake-avx512"})  # 16 lanes, FMA
RNG = np.random.default_rng(0)


def _dense(m, k, n, weight_is_param=False, transposed=False):
    """``relu(x @ W + b)`` with ``W`` a constant (or a parameter); ``transposed``: ``x @ Wt.T``."""
    w_np = RNG.standard_normal((n, k) if transposed else (k, n)).astype("float32")
    b_np = RNG.standard_normal(n).astype("float32")
    x = relax.Var("x", relax.TensorType([m, k], "float32"))
    params = [x]
    if weight_is_param:
        w = relax.Var("w", relax.TensorType(list(w_np.shape), "float32"))
        params.append(w)
    else:
        w = relax.const(w_np)
    bb = relax.BlockBuilder()
    with bb.function("main", params):
        with bb.dataflow():
            rhs = relax.op.permute_dims(w) if transposed else w
            y = bb.emit(relax.op.add(relax.op.matmul(x, rhs), relax.const(b_np)))
            out = bb.emit_output(bb.emit(relax.op.nn.relu(y)))
        bb.emit_func_output(out)
    return bb.get(), (w_np.T if transposed else w_np), b_np


def _scheduled(mod, target=AVX512):
    seq = tvm.transform.Sequential([
        relax.transform.LegalizeOps(), relax.transform.AnnotateTIROpPattern(),
        relax.transform.FoldConstant(), relax.transform.FuseOps(), relax.transform.FuseTIR(),
        mark_constant_weights(), cpu_schedule_pass(target), split_prepacked_weights()])
    with target:
        return seq(mod)


def _main_constants(mod):
    found = []

    def _visit(node):
        if isinstance(node, tvm.ir.GenericConst):
            found.append(node.value.numpy())

    relax.analysis.post_order_visit(mod["main"].body, _visit)
    return found


@pytest.mark.parametrize("transposed", [False, True], ids=["NN", "NT"])
def test_constant_weight_is_passed_in_panel_layout(transposed):
    """The kernel receives W as (N / nr, K, nr) panels, computed when compiling."""
    mod, w, _ = _dense(7, 33, 96, transposed=transposed)
    out = _scheduled(mod)
    kernels = {gv.name_hint: f for gv, f in out.functions_items() if isinstance(f, tirx.PrimFunc)}
    assert any(name.endswith("_prepacked") for name in kernels), sorted(kernels)
    packed = [c for c in _main_constants(out) if c.ndim == 3]
    assert len(packed) == 1
    panels, k, nr = packed[0].shape
    assert k == 33 and panels * nr == 96
    np.testing.assert_array_equal(packed[0], w.reshape(33, panels, nr).transpose(1, 0, 2))
    assert all(LAYOUT_FREE_ATTR not in (f.attrs or {}) for f in kernels.values())


def test_weight_given_at_run_time_is_packed_per_call():
    mod, _, _ = _dense(7, 33, 96, weight_is_param=True)
    out = _scheduled(mod)
    names = [gv.name_hint for gv, f in out.functions_items() if isinstance(f, tirx.PrimFunc)]
    assert not any(n.endswith("_prepacked") for n in names)
    assert all(c.ndim < 3 for c in _main_constants(out))


def test_mark_constant_weights_needs_a_constant_at_every_call_site():
    """A kernel called once with a constant and once with a variable keeps per-call packing."""
    w_np = RNG.standard_normal((16, 32)).astype("float32")
    x = relax.Var("x", relax.TensorType([4, 16], "float32"))
    v = relax.Var("v", relax.TensorType([16, 32], "float32"))
    bb = relax.BlockBuilder()
    with bb.function("main", [x, v]):
        with bb.dataflow():
            a = bb.emit(relax.op.matmul(x, relax.const(w_np)))
            b = bb.emit(relax.op.matmul(x, v))
            out = bb.emit_output(bb.emit(relax.op.add(a, b)))
        bb.emit_func_output(out)
    seq = tvm.transform.Sequential([relax.transform.LegalizeOps(), mark_constant_weights()])
    marked = seq(bb.get())
    attrs = [f.attrs for gv, f in marked.functions_items()
             if isinstance(f, tirx.PrimFunc) and "matmul" in gv.name_hint]
    assert len(attrs) == 1  # one matmul PrimFunc, shared by both calls
    assert LAYOUT_FREE_ATTR not in attrs[0]
    # the same module with the constant at both call sites is marked
    bb = relax.BlockBuilder()
    with bb.function("main", [x]):
        with bb.dataflow():
            a = bb.emit(relax.op.matmul(x, relax.const(w_np)))
            b = bb.emit(relax.op.matmul(x, relax.const(-w_np)))
            out = bb.emit_output(bb.emit(relax.op.add(a, b)))
        bb.emit_func_output(out)
    marked = seq(bb.get())
    assert [list(f.attrs[LAYOUT_FREE_ATTR]) for gv, f in marked.functions_items()
            if isinstance(f, tirx.PrimFunc) and "matmul" in gv.name_hint] == [[1]]


@pytest.mark.parametrize("m, k, n, transposed", [(7, 33, 96, False), (64, 128, 512, True),
                                                 (1, 768, 3072, False)])
def test_prepacked_build_matches_numpy(m, k, n, transposed):
    mod, w, b = _dense(m, k, n, transposed=transposed)
    target = tvm.target.Target("llvm")
    ex = tvm.compile(mod, target, relax_pipeline=get_pipeline(target, schedule=True))
    vm = relax.VirtualMachine(ex, tvm.cpu())
    x = RNG.standard_normal((m, k)).astype("float32")
    got = vm["main"](tvm.runtime.tensor(x)).numpy()
    np.testing.assert_allclose(got, np.maximum(x @ w + b, 0), rtol=1e-4, atol=1e-3)


def test_each_packing_function_is_built_once_and_run_per_weight(monkeypatch):
    """Regression (compile time): TVM's FoldConstant built the packing PrimFunc again at every
    call site (72 LLVM builds for BERT-base). Two weights of one kernel: one build, and each
    packed constant is its own weight's panels."""
    import relax_memplan.schedules._fold_packing as _fold_packing

    monkeypatch.setattr(_fold_packing, "layout_copy", lambda func: None)  # the TVM-build path
    builds = []
    real_compile = tvm.compile
    monkeypatch.setattr(_fold_packing.tvm, "compile",
                        lambda *a, **k: builds.append(1) or real_compile(*a, **k))
    w1, w2 = (RNG.standard_normal((32, 96)).astype("float32") for _ in range(2))
    x = relax.Var("x", relax.TensorType([7, 32], "float32"))
    bb = relax.BlockBuilder()
    with bb.function("main", [x]):
        with bb.dataflow():
            a = bb.emit(relax.op.matmul(x, relax.const(w1)))
            b = bb.emit(relax.op.matmul(x, relax.const(w2)))
            out = bb.emit_output(relax.Tuple([a, b]))
        bb.emit_func_output(out)
    out = _scheduled(bb.get())
    assert len(builds) == 1
    packed = [c for c in _main_constants(out) if c.ndim == 3]
    assert len(packed) == 2
    panels, k, nr = packed[0].shape
    for got, w in zip(packed, (w1, w2)):
        np.testing.assert_array_equal(got, w.reshape(k, panels, nr).transpose(1, 0, 2))


def _two_kernels():
    """Two matmuls of different shapes on constant weights: two packing PrimFuncs."""
    w1 = RNG.standard_normal((32, 96)).astype("float32")
    w2 = RNG.standard_normal((48, 64)).astype("float32")
    x1 = relax.Var("x1", relax.TensorType([7, 32], "float32"))
    x2 = relax.Var("x2", relax.TensorType([7, 48], "float32"))
    bb = relax.BlockBuilder()
    with bb.function("main", [x1, x2]):
        with bb.dataflow():
            a = bb.emit(relax.op.matmul(x1, relax.const(w1)))
            b = bb.emit(relax.op.matmul(x2, relax.const(w2)))
            out = bb.emit_output(relax.Tuple([a, b]))
        bb.emit_func_output(out)
    return bb.get(), (w1, w2)


def _packed_panels_are_the_weights(out, weights):
    packed = sorted((c for c in _main_constants(out) if c.ndim == 3), key=lambda c: c.shape[1])
    assert len(packed) == 2
    for got, w in zip(packed, weights):
        panels, k, nr = got.shape
        np.testing.assert_array_equal(got, w.reshape(k, panels, nr).transpose(1, 0, 2))


@pytest.mark.parametrize("numpy_copy", [False, True], ids=["tvm-build", "layout-copy"])
def test_all_packing_functions_are_built_in_one_module(monkeypatch, numpy_copy):
    """Compile time: one LLVM module (one code generation, one JIT) for the packers of
    different kernels, each packed constant its own weight's panels; packers that are a pure
    layout copy (these two) run as numpy, with no LLVM build at all (vad-lstm: 23 -> 2.6 ms)."""
    import relax_memplan.schedules._fold_packing as _fold_packing

    if not numpy_copy:
        monkeypatch.setattr(_fold_packing, "layout_copy", lambda func: None)
    builds = []
    real_compile = tvm.compile
    monkeypatch.setattr(_fold_packing.tvm, "compile",
                        lambda *a, **k: builds.append(a[0]) or real_compile(*a, **k))
    mod, weights = _two_kernels()
    out = _scheduled(mod)
    if numpy_copy:
        assert builds == []
    else:
        assert len(builds) == 1 and len(builds[0].functions_items()) == 2
    _packed_panels_are_the_weights(out, weights)


def test_no_prim_func_left_uncalled_after_the_split():
    # the folded packer and the kernel its split version replaces stayed in the module and
    # were compiled by LLVM for nothing (bert-tiny: 9 of 25 PrimFuncs, ~0.2 CPU s of build)
    mod, _, _ = _dense(7, 33, 96)
    out = _scheduled(mod)
    called = set()
    relax.analysis.post_order_visit(
        out["main"], lambda e: called.add(e.name_hint) if isinstance(e, tvm.ir.GlobalVar) else None)
    prim = [gv.name_hint for gv, f in out.functions_items() if isinstance(f, tirx.PrimFunc)]
    assert any(n.endswith("_prepacked") for n in prim)  # the split happened
    assert sorted(prim) == sorted(called & set(prim)), sorted(set(prim) - called)


def test_weight_read_by_several_calls_is_packed_and_stored_once():
    """Regression: each call site of one constant weight got its own packed copy (ConvNeXt-T's
    feed-forward over 4 row chunks stored every packed weight 4 times), and the split left a
    ``w = <constant>`` and a ``y = y_split`` binding per call, which ``ReorderForMemory``
    modelled as allocations (its lower bound rose 3.61 -> 4.52 MB under our schedules)."""
    w_np = RNG.standard_normal((64, 96)).astype("float32")
    w = relax.const(w_np)
    x = relax.Var("x", relax.TensorType([32, 64], "float32"))
    bb = relax.BlockBuilder()
    with bb.function("main", [x]):
        with bb.dataflow():
            top = bb.emit(relax.op.strided_slice(x, [0], [0], [16]))
            low = bb.emit(relax.op.strided_slice(x, [0], [16], [32]))
            a = bb.emit(relax.op.nn.relu(relax.op.matmul(top, w)))
            b = bb.emit(relax.op.nn.relu(relax.op.matmul(low, w)))
            out = bb.emit_output(bb.emit(relax.op.concat([a, b], axis=0)))
        bb.emit_func_output(out)
    mod = _scheduled(bb.get())
    packed = [c for c in _main_constants(mod) if c.ndim == 3]
    assert len(packed) == 2 and np.array_equal(packed[0], packed[1])
    consts = []
    relax.analysis.post_order_visit(mod["main"].body, lambda n: consts.append(n) if isinstance(
        n, tvm.ir.GenericConst) and n.value.numpy().ndim == 3 else None)
    assert consts[0].same_as(consts[1])  # one constant object: one copy in the library
    bindings = [b for block in mod["main"].body.blocks for b in block.bindings]
    assert not any(isinstance(b.value, (tvm.ir.GenericConst, relax.Var)) for b in bindings)
    ex = tvm.compile(bb.get(), "llvm",
                     relax_pipeline=get_pipeline("llvm", schedule=True))
    xs = RNG.standard_normal((32, 64)).astype("float32")
    got = relax.VirtualMachine(ex, tvm.cpu())["main"](tvm.runtime.tensor(xs)).numpy()
    np.testing.assert_allclose(got, np.maximum(xs @ w_np, 0), rtol=1e-4, atol=1e-4)
