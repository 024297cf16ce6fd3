"""Memory-behaviour table: which kernels may write an output over an input."""

import numpy as np
from hypothesis import given, settings
from hypothesis import strategies as st
import pytest
import tvm
from tvm.script import tirx as T

from relax_memplan.analysis.inplace import InplacePair, inplace_kernel, inplace_pairs, kernel_table


@T.prim_func(private=True, s_tir=True)
def add(a: T.Buffer((8, 4), "float32"), b: T.Buffer((8, 4), "float32"),
        c: T.Buffer((8, 4), "float32")):
    for i, j in T.grid(8, 4):
        with T.sblock("c"):
            vi, vj = T.axis.remap("SS", [i, j])
            c[vi, vj] = a[vi, vj] + b[vi, vj]


@T.prim_func(private=True, s_tir=True)
def transpose(a: T.Buffer((4, 4), "float32"), c: T.Buffer((4, 4), "float32")):
    for i, j in T.grid(4, 4):
        with T.sblock("c"):
            vi, vj = T.axis.remap("SS", [i, j])
            c[vi, vj] = a[vj, vi]


@T.prim_func(private=True, s_tir=True)
def cumsum(a: T.Buffer((8,), "float32"), c: T.Buffer((8,), "float32")):
    for i, k in T.grid(8, 8):
        with T.sblock("c"):
            vi, vk = T.axis.remap("SR", [i, k])
            with T.init():
                c[vi] = T.float32(0)
            c[vi] = c[vi] + T.if_then_else(vk <= vi, a[vk], T.float32(0))


@T.prim_func(private=True, s_tir=True)
def matmul(a: T.Buffer((4, 4), "float32"), b: T.Buffer((4, 4), "float32"),
           c: T.Buffer((4, 4), "float32")):
    for i, j, k in T.grid(4, 4, 4):
        with T.sblock("c"):
            vi, vj, vk = T.axis.remap("SSR", [i, j, k])
            with T.init():
                c[vi, vj] = T.float32(0)
            c[vi, vj] = c[vi, vj] + a[vi, vk] * b[vk, vj]


@T.prim_func(private=True, s_tir=True)
def softmax(a: T.Buffer((4,), "float32"), c: T.Buffer((4,), "float32")):
    s = T.sblock_alloc_buffer((1,))
    for k in range(4):
        with T.sblock("sum"):
            vk = T.axis.remap("R", [k])
            with T.init():
                s[0] = T.float32(0)
            s[0] = s[0] + T.exp(a[vk])
    for i in range(4):
        with T.sblock("div"):
            vi = T.axis.remap("S", [i])
            c[vi] = T.exp(a[vi]) / s[0]


@T.prim_func(private=True, s_tir=True)
def two_outputs_late_read(a: T.Buffer((4,), "float32"), c: T.Buffer((4,), "float32"),
                          d: T.Buffer((4,), "float32")):
    """c = a * 2 then d = a + 1: writing c over a would corrupt d."""
    for i in range(4):
        with T.sblock("c"):
            vi = T.axis.remap("S", [i])
            c[vi] = a[vi] * T.float32(2)
    for i in range(4):
        with T.sblock("d"):
            vi = T.axis.remap("S", [i])
            d[vi] = a[vi] + T.float32(1)


def test_elementwise_add_may_write_over_either_input():
    assert inplace_pairs(add) == [InplacePair(2, 0), InplacePair(2, 1)]


@pytest.mark.parametrize("kernel", [transpose, cumsum, matmul, softmax],
                         ids=["transpose", "cumsum", "matmul", "softmax"])
def test_non_identity_kernels_need_fresh_memory(kernel):
    assert inplace_pairs(kernel) == []
    with pytest.raises(ValueError, match="not an identity-index"):
        inplace_kernel(kernel, InplacePair(len(kernel.params) - 1, 0))


def test_input_read_after_the_writer_is_refused():
    # d may still be written over a (nothing reads a after block d), c may not
    assert inplace_pairs(two_outputs_late_read) == [InplacePair(2, 0)]


def _run(func, *arrays):
    f = func.with_attr("global_symbol", "main")
    ex = tvm.compile(tvm.IRModule({"main": f}), target="llvm")
    tensors = [tvm.runtime.tensor(a) for a in arrays]
    ex["main"](*tensors)
    return [t.numpy() for t in tensors]


def test_inplace_kernel_writes_the_input_and_matches_the_original():
    rng = np.random.default_rng(0)
    a, b = rng.normal(size=(8, 4)).astype("float32"), rng.normal(size=(8, 4)).astype("float32")
    new = inplace_kernel(add, InplacePair(2, 0))
    assert len(new.params) == 2
    got_a, _ = _run(new, a.copy(), b)
    np.testing.assert_allclose(got_a, a + b, rtol=1e-6)


@pytest.mark.parametrize("kernel,expect", [(transpose, lambda a: a.T),
                                           (cumsum, np.cumsum)], ids=["transpose", "cumsum"])
def test_refused_kernels_would_be_wrong_in_place(kernel, expect):
    """What the table protects against: TVM's specialize does write these in place, and the
    result is wrong (each output element overwrites an input element still to be read)."""
    a = np.arange(16 if kernel is transpose else 8, dtype="float32")
    a = a.reshape(4, 4) if kernel is transpose else a
    params = list(kernel.params)
    forced = kernel.specialize({params[-1]: params[0]})
    (got,) = _run(forced, a.copy())
    assert not np.allclose(got, expect(a))


def test_kernel_table_names_every_prim_func():
    mod = tvm.IRModule({"add": add, "transpose": transpose})
    table = kernel_table(mod)
    assert table == {"add": [InplacePair(2, 0), InplacePair(2, 1)], "transpose": []}


# Index maps of a 4x4 input read by a one-block kernel: only the identity is in-place safe.
_INDEX_MAPS = {
    "identity": lambda i, j: (i, j),
    "transpose": lambda i, j: (j, i),
    "reverse_rows": lambda i, j: (3 - i, j),
    "shift": lambda i, j: ((i + 1) % 4, j),
    "broadcast_row": lambda i, j: (0, j),
}


@settings(max_examples=6, deadline=None)
@given(st.lists(st.sampled_from(sorted(_INDEX_MAPS)), min_size=1, max_size=2),
       st.sampled_from(["add", "mul"]))
def test_random_kernels_are_in_place_exactly_when_it_gives_the_same_result(maps, op):
    """Random small TE kernels ``B[i, j] = f(A[m1(i, j)], A[m2(i, j)], ...)``: the table allows
    writing B over A only if every read of A is the identity, and then the in-place kernel
    computes what the original does."""
    from tvm import te

    a = te.placeholder((4, 4), name="A")

    def body(i, j):
        terms = [a[_INDEX_MAPS[m](i, j)] for m in maps]
        out = terms[0]
        for t in terms[1:]:
            out = out + t if op == "add" else out * t
        return out * 2.0

    func = te.create_prim_func([a, te.compute((4, 4), body, name="B")])
    allowed = InplacePair(1, 0) in inplace_pairs(func)
    assert allowed == all(m == "identity" for m in maps)
    x = np.random.default_rng(1).normal(size=(4, 4)).astype("float32")
    _, expect = _run(func, x, np.zeros_like(x))
    params = list(func.params)
    (forced,) = _run(func.specialize({params[1]: params[0]}), x.copy())
    if allowed:
        np.testing.assert_allclose(forced, expect, rtol=1e-6)
    elif any(m not in ("identity", "broadcast_row") for m in maps):
        # a permuting read: writing in place reads elements already overwritten
        assert not np.allclose(forced, expect)


@T.prim_func(private=True)
def no_blocks(a: T.Buffer((4,), "float32"), c: T.Buffer((4,), "float32")):
    for i in range(4):
        c[i] = a[i]


def test_kernel_without_blocks_is_never_in_place():
    assert inplace_pairs(no_blocks) == []


@T.prim_func(private=True, s_tir=True)
def unit_batch_by_constant(a: T.Buffer((1, 4, 4), "float32"), b: T.Buffer((1, 4, 4), "float32"),
                           c: T.Buffer((1, 4, 4), "float32")):
    """The form of a scheduled matmul epilogue: the batch iter var has extent 1 and the
    buffers are indexed by its one value, the constant 0, not by the var."""
    for i, j in T.grid(4, 4):
        with T.sblock("c"):
            v0 = T.axis.spatial(1, 0)
            vi, vj = T.axis.remap("SS", [i, j])
            T.reads(a[0, vi, vj], b[0, vi, vj])
            T.writes(c[0, vi, vj])
            c[0, vi, vj] = a[0, vi, vj] + b[0, vi, vj]


@T.prim_func(private=True, s_tir=True)
def batch_broadcast_by_constant(a: T.Buffer((2, 4, 4), "float32"),
                                c: T.Buffer((2, 4, 4), "float32")):
    """``c[v0] = a[0] * 2`` over a batch of 2: the constant 0 is not the value of v0."""
    for n, i, j in T.grid(2, 4, 4):
        with T.sblock("c"):
            v0, vi, vj = T.axis.remap("SSS", [n, i, j])
            T.reads(a[0, vi, vj])
            T.writes(c[v0, vi, vj])
            c[v0, vi, vj] = a[0, vi, vj] * T.float32(2)


def test_unit_extent_iter_var_indexed_by_its_constant_is_elementwise():
    """Regression (bert-tiny --schedule): the scheduled matmul + residual kernels index the
    unit batch axis by 0, and the rule refused them (5 in-place calls became 1)."""
    assert inplace_pairs(unit_batch_by_constant) == [InplacePair(2, 0), InplacePair(2, 1)]
    rng = np.random.default_rng(0)
    a, b = (rng.normal(size=(1, 4, 4)).astype("float32") for _ in range(2))
    got_a, _ = _run(inplace_kernel(unit_batch_by_constant, InplacePair(2, 0)), a.copy(), b)
    np.testing.assert_allclose(got_a, a + b, rtol=1e-6)


def test_constant_index_of_a_longer_iter_var_is_refused():
    """A constant where the iter var has extent 2 is a broadcast: in place, batch 1 would read
    batch 0 already overwritten."""
    assert inplace_pairs(batch_broadcast_by_constant) == []
    a = np.arange(32, dtype="float32").reshape(2, 4, 4)
    params = list(batch_broadcast_by_constant.params)
    (forced,) = _run(batch_broadcast_by_constant.specialize({params[1]: params[0]}), a.copy())
    assert not np.allclose(forced, np.stack([a[0] * 2, a[0] * 2]))


def _scheduled_matmul_residual():
    """The kernel of ``x @ w + bias + r`` (x, r: 1x8x16, w: 16x16) after LegalizeOps, FuseOps,
    FuseTIR and our CPU schedule (:class:`~relax_memplan.schedules.StaticMatmul`)."""
    from tvm import relax

    from relax_memplan.schedules import SCHEDULE_RULE_ATTR, schedule_prim_func

    shapes = {"x": (1, 8, 16), "w": (16, 16), "bias": (16,), "r": (1, 8, 16)}
    params = {n: relax.Var(n, relax.TensorType(list(s), "float32")) for n, s in shapes.items()}
    bb = relax.BlockBuilder()
    with bb.function("main", list(params.values())):
        with bb.dataflow():
            y = bb.emit(relax.op.matmul(params["x"], params["w"]))
            y = bb.emit(relax.op.add(y, params["bias"]))
            out = bb.emit_output(bb.emit(relax.op.add(y, params["r"])))
        bb.emit_func_output(out)
    seq = tvm.transform.Sequential([relax.transform.LegalizeOps(),
                                    relax.transform.AnnotateTIROpPattern(),
                                    relax.transform.FuseOps(), relax.transform.FuseTIR()])
    (func,) = [f for _, f in seq(bb.get()).functions_items() if isinstance(f, tvm.tirx.PrimFunc)]
    func = schedule_prim_func(func, tvm.target.Target("llvm"))
    assert str(func.attrs[SCHEDULE_RULE_ATTR]) == "StaticMatmul"
    return func, shapes


def test_scheduled_matmul_residual_kernel_is_in_place_and_correct():
    """The scheduled kernel itself (what runs) writes the sum over the residual ``r``: each
    output element is stored after its residual element is read, in the same block instance
    of the tile's write-back, and the result equals numpy's."""
    func, shapes = _scheduled_matmul_residual()
    assert inplace_pairs(func) == [InplacePair(4, 3)]
    rng = np.random.default_rng(1)
    x, w, bias, r = (rng.normal(size=shapes[n]).astype("float32") for n in shapes)
    *_, got = _run(inplace_kernel(func, InplacePair(4, 3)), x, w, bias, r.copy())
    np.testing.assert_allclose(got, x @ w + bias + r, rtol=1e-5, atol=1e-5)


def _random_like(param, rng):
    shape, dtype = [int(d) for d in param.ty.shape], str(param.ty.dtype)
    if dtype.startswith("float"):
        return rng.standard_normal(shape).astype(dtype)
    return rng.integers(0, 2 if dtype == "bool" else 3, shape).astype(dtype)


@pytest.mark.parametrize("model,shapes", [
    ("bert-tiny-randw.onnx", {"input_ids": (1, 128)}),  # ~2-4 s
    pytest.param("mobilenetv2-tiny.onnx", {"x": (1, 3, 96, 96)}, marks=pytest.mark.slow),  # ~6 s
], ids=["bert-tiny", "mobilenetv2"])
def test_every_scheduled_in_place_pair_of_a_model_computes_what_the_kernel_does(model, shapes):
    """Each pair the table accepts in a model's scheduled kernels (our pipeline's phases before
    planning, ``schedule=True``): the in-place variant on random inputs gives the original
    kernel's output bit for bit (a model's output can hide a wrong kernel: mobilenetv2-tiny's
    barely depends on its input). The models whose scheduled pairs the extent-1 rule added."""
    from relax_memplan.frontend import import_onnx
    from relax_memplan.pipeline import backend_phases, fusion_passes
    from relax_memplan.transform import PlanStaticMemory
    from tests.conftest import shared_model

    mod, _ = import_onnx(shared_model(model), shapes)
    target = tvm.target.Target("llvm")
    with target:
        for _, passes in backend_phases(target, plan_pass=PlanStaticMemory(inplace=True),
                                        schedule=True,
                                        fusion_pass_list=fusion_passes(target, "auto", True))[:3]:
            mod = tvm.transform.Sequential(passes)(mod)
    rng = np.random.default_rng(0)
    checked = 0
    for name, pairs in kernel_table(mod).items():
        for pair in pairs:
            args = [_random_like(p, rng) for p in mod[name].params]
            expect = _run(mod[name], *[a.copy() for a in args])[pair.out_index]
            rest = [a.copy() for k, a in enumerate(args) if k != pair.out_index]
            got = _run(inplace_kernel(mod[name], pair), *rest)[
                pair.in_index - (pair.in_index > pair.out_index)]
            np.testing.assert_array_equal(got, expect, err_msg=f"{name} {pair}")
            checked += 1
    assert checked >= 5
