"""FoldMatmulReshape: reshape -> matmul -> reshape back becomes the N-d matmul, so FuseOps puts
the bias + activation after it into the matmul's kernel."""

import re

import numpy as np
import tvm
from tvm import relax
from tvm.script import ir as I, relax as R

from relax_memplan.pipeline import get_pipeline
from relax_memplan.transform.fold_matmul_reshape import FoldMatmulReshape


def _linear_gelu(out_shape=(2, 8, 32)):
    @I.ir_module
    class Before:
        @R.function
        def main(x: R.Tensor((2, 8, 16), "float32"), w: R.Tensor((16, 32), "float32"),
                 b: R.Tensor((32,), "float32")):
            with R.dataflow():
                x2 = R.reshape(x, R.shape([16, 16]))
                y2 = R.matmul(x2, w)
                y = R.reshape(y2, R.shape(list(out_shape)))
                z = R.nn.gelu(R.add(y, b))
                R.output(z)
            return z
    return Before


def _kernels(mod):
    lowered = get_pipeline("llvm", planner="tvm", fusion=False)(mod)  # TVM's FuseOps alone
    return re.findall(r"^    (\w+)\(", lowered["main"].script(show_meta=False), re.M)


def _run(mod, args):
    ex = tvm.compile(mod, "llvm", relax_pipeline=get_pipeline("llvm", planner="tvm"))
    return relax.VirtualMachine(ex, tvm.cpu())["main"](*args).numpy()


def test_the_sandwich_becomes_one_matmul_and_one_kernel_with_its_epilogue():
    before = _linear_gelu()
    pass_ = FoldMatmulReshape()
    after = pass_(before)
    assert pass_.folded == 1
    script = after["main"].script()
    assert "R.reshape" not in script and script.count("R.matmul") == 1
    assert len(_kernels(before)) == 2 and len(_kernels(after)) == 1
    rng = np.random.default_rng(0)
    args = [tvm.runtime.tensor(rng.standard_normal(s).astype("float32"))
            for s in ((2, 8, 16), (16, 32), (32,))]
    np.testing.assert_allclose(_run(after, args), _run(before, args), rtol=1e-5, atol=1e-6)


def test_a_reshape_to_other_leading_dims_is_left_alone():
    before = _linear_gelu(out_shape=(4, 4, 32))
    pass_ = FoldMatmulReshape()
    assert pass_(before).same_as(before) and pass_.folded == 0
