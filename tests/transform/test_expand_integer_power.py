"""ExpandIntegerPower: x**2/3/4 as multiplications (TVM's CUDA pow gave NaN for x < 0)."""

import numpy as np
import pytest
import tvm
from tvm import relax
from tvm.script import ir as I
from tvm.script import relax as R

from relax_memplan.pipeline import get_pipeline
from relax_memplan.targets import cuda_source
from relax_memplan.transform import ExpandIntegerPower
from relax_memplan.transform.expand_integer_power import small_integer_exponent
from tests.conftest import relax_ops


def _power_module(exponent: float):
    bb = relax.BlockBuilder()
    x = relax.Var("x", relax.TensorType((4, 8), "float32"))
    with bb.function("main", [x]):
        with bb.dataflow():
            y = bb.emit(relax.op.power(x, relax.const(exponent, "float32")))
            z = bb.emit_output(relax.op.add(y, x))
        bb.emit_func_output(z)
    return bb.get()


@pytest.mark.parametrize("n", [2, 3, 4])
def test_small_integer_powers_become_multiplications_and_match_numpy(n):
    pass_ = ExpandIntegerPower()
    mod = pass_(_power_module(float(n)))
    assert pass_.expanded == 1
    assert "relax.power" not in relax_ops(mod)
    assert relax_ops(mod).count("relax.multiply") == (1 if n == 2 else 2)
    ex = tvm.compile(mod, "llvm", relax_pipeline=get_pipeline("llvm"))
    x = np.linspace(-3, 3, 32, dtype="float32").reshape(4, 8)  # negative bases included
    out = relax.VirtualMachine(ex, tvm.cpu())["main"](tvm.runtime.tensor(x)).numpy()
    np.testing.assert_allclose(out, np.power(x, n) + x, rtol=1e-6, atol=1e-6)


@pytest.mark.parametrize("exponent", [2.5, 5.0, 1.0, -2.0])
def test_other_exponents_are_left_to_tvm(exponent):
    pass_ = ExpandIntegerPower()
    mod = pass_(_power_module(exponent))
    assert pass_.expanded == 0 and "relax.power" in relax_ops(mod)


def test_exponent_must_be_a_one_element_float_constant():
    assert small_integer_exponent(relax.const(3.0, "float32")) == 3
    assert small_integer_exponent(relax.const(np.array([2.0], "float32"))) == 2
    assert small_integer_exponent(relax.const(np.array([2.0, 3.0], "float32"))) is None
    assert small_integer_exponent(relax.const(3, "int32")) is None
    assert small_integer_exponent(relax.const(3.0000002, "float32")) is None
    assert small_integer_exponent(relax.Var("e", relax.TensorType((), "float32"))) is None


def test_a_broadcasting_power_is_left_alone():
    @I.ir_module
    class Broadcast:
        @R.function
        def main(x: R.Tensor((1, 8), "float32")):
            with R.dataflow():
                y = R.power(x, R.const(np.full((4, 1), 3.0, "float32")))
                R.output(y)
            return y

    # the exponent has 4 elements: not matched, so the output shape (4, 8) is never lost
    pass_ = ExpandIntegerPower()
    pass_(Broadcast)
    assert pass_.expanded == 0


def test_cuda_build_has_no_pow_where_tvm_alone_emits_one():
    # regression: on an H200, TVM's CUDA kernel for power(x, 3) returned NaN for every x < 0
    # (gpt2-tiny's GELU: all 16,000 outputs NaN). Without a GPU we check the generated source:
    # TVM's own pipeline emits powf (the check can fail), ours emits multiplications.
    sm90 = tvm.target.Target({"kind": "cuda", "arch": "sm_90"})
    mod = _power_module(3.0)
    plain = tvm.compile(mod, sm90)  # TVM's default pipeline for cuda
    assert "pow" in cuda_source(plain)
    ours = tvm.compile(mod, sm90, relax_pipeline=get_pipeline(sm90))
    assert "pow" not in cuda_source(ours)
