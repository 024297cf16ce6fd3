"""FastSigmoidTanh: float32 sigmoid/tanh become vectorisable kernels with TVM's kernel names."""

import numpy as np
import tvm
from tvm import relax, tirx

from relax_memplan.pipeline import backend_phases, get_pipeline
from relax_memplan.schedules import host_target
from relax_memplan.transform.fast_sigmoid_tanh import FastSigmoidTanh
from tests.conftest import relax_ops


def _module(dtype="float32"):
    """``x * sigmoid(x) + tanh(x)`` (SiLU plus tanh) on a (3, 37) tensor."""
    bb = relax.BlockBuilder()
    x = relax.Var("x", relax.TensorType((3, 37), dtype))
    with bb.function("main", [x]):
        with bb.dataflow():
            s = bb.emit(relax.op.sigmoid(x))
            y = bb.emit(relax.op.multiply(x, s))
            z = bb.emit_output(relax.op.add(y, relax.op.tanh(x)))
        bb.emit_func_output(z)
    return bb.get()


def test_float32_calls_become_call_tir_named_like_tvm():
    pass_ = FastSigmoidTanh()
    mod = pass_(_module())
    assert pass_.replaced == 2
    assert "relax.sigmoid" not in relax_ops(mod) and "relax.tanh" not in relax_ops(mod)
    names = sorted(gv.name_hint for gv, f in mod.functions_items()
                   if isinstance(f, tirx.PrimFunc))
    assert names == ["tir_sigmoid", "tir_tanh"]


def test_other_dtypes_are_left_to_tvm():
    pass_ = FastSigmoidTanh()
    mod = pass_(_module("float16"))
    assert pass_.replaced == 0 and "relax.sigmoid" in relax_ops(mod)


def test_scheduled_pipeline_uses_it_and_matches_numpy():
    target = host_target()
    ex = tvm.compile(_module(), target, relax_pipeline=get_pipeline(target, schedule=True))
    x = np.concatenate([np.linspace(-30, 30, 100), [np.nan] * 11]).astype("float32")
    x = x.reshape(3, 37)
    got = relax.VirtualMachine(ex, tvm.cpu())["main"](tvm.runtime.tensor(x)).numpy()
    x64 = x.astype("float64")
    want = x64 / (1 + np.exp(-x64)) + np.tanh(x64)
    np.testing.assert_allclose(got, want, rtol=1e-6, atol=1e-6)  # NaN where x is NaN


def test_only_scheduled_llvm_builds_run_it():
    def names(schedule):
        legalize = dict(backend_phases(tvm.target.Target("llvm"), schedule=schedule))["legalize"]
        return [p.info.name for p in legalize]

    with_it = names(True)
    assert with_it.index("FastSigmoidTanh") + 1 == with_it.index("LegalizeOps")
    assert "FastSigmoidTanh" not in names(False)
