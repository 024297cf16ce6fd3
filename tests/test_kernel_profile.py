"""runtime.kernel_profile / kernels_per_call: the VM instrument hook the benchmarks share."""

import numpy as np
import tvm
from tvm import relax
from tvm.script import ir as I
from tvm.script import relax as R

from relax_memplan.pipeline import get_pipeline
from relax_memplan.runtime import kernel_profile, kernels_per_call


@I.ir_module
class FourKernels:
    @R.function
    def main(x: R.Tensor((8, 16), "float32")):
        with R.dataflow():
            a = R.nn.softmax(x, axis=-1)
            b = R.nn.softmax(R.permute_dims(a), axis=-1)
            c = R.sum(b, axis=[0])
            R.output(c)
        return c


def _vm():
    ex = tvm.compile(FourKernels, "llvm", relax_pipeline=get_pipeline("llvm", fusion=False,
                                                                     schedule=False))
    vm = relax.VirtualMachine(ex, tvm.cpu())
    args = [tvm.runtime.tensor(np.random.default_rng(0).random((8, 16), dtype="float32"))]
    return vm, args


def test_kernels_per_call_counts_the_four_kernels_not_builtins():
    vm, args = _vm()
    # softmax, transpose, softmax, sum (the allocations and views are vm.builtin calls)
    assert kernels_per_call(vm, args) == 4


def test_kernel_profile_merges_numbered_kernels_and_divides_by_rounds():
    vm, args = _vm()
    merged = kernel_profile(vm, args, rounds=3)
    assert merged["softmax"][1] == 2  # softmax and softmax1, twice per call
    assert all(not k.startswith("vm.builtin.") for k in merged)
    assert all(s >= 0 for s, _n in merged.values())
    exact = kernel_profile(vm, args, rounds=2, merge_numbered=False, include_builtins=True)
    assert {"softmax", "softmax1"} <= set(exact) and exact["softmax"][1] == 1
    assert any(k.startswith("vm.builtin.") for k in exact)
    assert sum(n for _s, n in kernel_profile(vm, args).values()) == kernels_per_call(vm, args)


def test_kernel_profile_reads_the_given_clock():
    vm, args = _vm()
    ticks = iter(range(10 ** 6))
    exact = kernel_profile(vm, args, rounds=2, merge_numbered=False,
                           clock=lambda: float(next(ticks)))
    # a fake clock advancing by 1 per reading: every kernel call lasts exactly 1 "second"
    assert exact["softmax"] == (1.0, 1.0) and exact["softmax1"] == (1.0, 1.0)
