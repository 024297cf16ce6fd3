"""clamp_padded_reads: a padded matmul operand read as ``X[min(i, n - 1)]`` instead of a select."""

import numpy as np
import tvm
from tvm import relax, tirx
from tvm.script import tirx as T

from relax_memplan.pipeline import get_pipeline
from relax_memplan.schedules import host_target, schedule_prim_func
from relax_memplan.schedules._clamp_pad import clamp_padded_reads


@T.prim_func(private=True, s_tir=True)
def _reads(a: T.handle, b: T.handle, c: T.handle):
    n = T.int64()
    A = T.match_buffer(a, (n, T.int64(8)), "float32")
    B = T.match_buffer(b, (n, T.int64(8)), "float32")
    C = T.match_buffer(c, (n + T.int64(3), T.int64(8)), "float32")
    for i, k in T.grid(n + T.int64(3), T.int64(8)):
        with T.sblock("c"):
            vi, vk = T.axis.remap("SS", [i, k])
            C[vi, vk] = (T.if_then_else(vi < n, A[vi, vk], T.float32(0))
                         + T.if_then_else(vi < n, B[vi, vk], T.float32(0))
                         + T.if_then_else(vi < n, A[vi, vk], T.float32(1)))


def _count(func, needle):
    return func.script().count(needle)


def test_only_zero_padded_reads_of_the_named_operands_are_clamped():
    func = _reads.with_attr("global_symbol", "main")
    out = clamp_padded_reads(func, [tirx.decl_buffer((1,), name="A")])
    text = out.script()
    assert "A[T.min(vi, n - T.int64(1)), vk]" in text
    assert "T.if_then_else(vi < n, B[vi, vk], T.float32(0.0))" in text  # B not named
    assert "T.if_then_else(vi < n, A[vi, vk], T.float32(1.0))" in text  # pads with 1, kept


def test_nothing_to_clamp_returns_the_function_itself():
    func = _reads.with_attr("global_symbol", "main")
    assert clamp_padded_reads(func, [tirx.decl_buffer((1,), name="Z")]).same_as(func)


def _dense(seq, k=40, n=48):
    x = relax.Var("x", relax.TensorType([2, seq, k], "float32"))
    w = relax.Var("w", relax.TensorType([k, n], "float32"))
    bb = relax.BlockBuilder()
    with bb.function("main", [x, w]):
        with bb.dataflow():
            out = bb.emit_output(bb.emit(relax.op.matmul(x, w)))
        bb.emit_func_output(out)
    return bb.get()


def test_generic_matmul_reads_padded_rows_clamped_and_stays_exact():
    """The symbolic-row kernel has no select left in its micro-kernel and gives x @ w for
    row counts that are not a multiple of the 4-row tile (1, 5, 7) and one that is (8)."""
    seq = tirx.Var("seq", "int64")
    mod = relax.transform.LegalizeOps()(_dense(seq))
    (func,) = [f for _, f in mod.functions_items() if isinstance(f, tirx.PrimFunc)]
    text = schedule_prim_func(func, host_target()).script()
    assert "T.min(v1, seq - T.int64(1))" in text and "if_then_else" not in text
    target = host_target()
    ex = tvm.compile(_dense(seq), target, relax_pipeline=get_pipeline(target, schedule=True))
    vm = relax.VirtualMachine(ex, tvm.cpu())
    rng = np.random.default_rng(0)
    w = rng.standard_normal((40, 48)).astype("float32")
    for s in (1, 5, 7, 8):
        x = rng.standard_normal((2, s, 40)).astype("float32")
        out = vm["main"](tvm.runtime.tensor(x), tvm.runtime.tensor(w)).numpy()
        np.testing.assert_allclose(out, x @ w, rtol=1e-4, atol=1e-4, err_msg=f"seq={s}")
