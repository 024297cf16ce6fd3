"""A kernel that LLVM's SLP vectorizer miscompiles is linked again with the vectorizer off.

The graph is the fuzz campaign's seed 5912 (``benchmarks/results/fuzz_repros``): a 1x1
stride-2 convolution with bias and ReLU over a 1 x 4 x 6 x 5 map. For ``znver3`` LLVM 22's SLP
vectorizer makes code that LLVM's own module verifier refuses.
"""

import numpy as np
import onnx
import pytest
import tvm
from onnx import TensorProto, helper, numpy_helper

from relax_memplan.compile import BuildOptions, CheckOptions, compile_model
from relax_memplan.compile.build import SLP_OFF, compile_module, without_slp
from relax_memplan.frontend import import_onnx
from relax_memplan.pipeline import get_pipeline

ZNVER3 = {"kind": "llvm", "mcpu": "znver3"}


def strided_conv_model() -> onnx.ModelProto:
    rng = np.random.default_rng(5912)
    w = numpy_helper.from_array(rng.normal(size=(4, 4, 1, 1)).astype(np.float32), "w")
    b = numpy_helper.from_array(rng.normal(size=(4,)).astype(np.float32), "b")
    graph = helper.make_graph(
        [helper.make_node("Conv", ["x", "w", "b"], ["c"], kernel_shape=[1, 1], strides=[2, 2]),
         helper.make_node("Relu", ["c"], ["y"])],
        "strided_conv", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 4, 6, 5])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, 4, 3, 3])], [w, b])
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])


def reference(model, x):
    w, b = (numpy_helper.to_array(t) for t in model.graph.initializer)
    conv = np.einsum("fc,nchw->nfhw", w[:, :, 0, 0], x[:, :, ::2, ::2]) + b[None, :, None, None]
    return np.maximum(conv, 0)


def test_the_graph_still_trips_llvms_verifier_when_built_directly():
    """The premise: without the second link this build fails (if a later LLVM fixes its
    vectorizer, this test says the fallback can go)."""
    mod, _ = import_onnx(strided_conv_model())
    target = tvm.target.Target(ZNVER3)
    with pytest.raises(Exception, match="LLVM module verification failed"):
        tvm.compile(mod, target, relax_pipeline=get_pipeline(target))


def test_the_build_is_linked_again_without_slp_and_computes_the_convolution():
    model = strided_conv_model()
    mod, _ = import_onnx(model)
    target = tvm.target.Target(ZNVER3)
    notes = []
    executable = compile_module(mod, target, get_pipeline(target), notes=notes)
    assert len(notes) == 1 and "SLP vectorizer off" in notes[0]
    x = np.random.default_rng(0).normal(size=(1, 4, 6, 5)).astype(np.float32)
    vm = tvm.relax.VirtualMachine(executable, tvm.cpu())
    got = vm["main"](tvm.runtime.tensor(x)).numpy()
    np.testing.assert_allclose(got, reference(model, x), rtol=1e-5, atol=1e-5)


def test_the_report_says_the_kernels_were_generated_again():
    result = compile_model(strided_conv_model(), options=BuildOptions(cpu="znver3"),
                           check=CheckOptions())
    assert any("SLP vectorizer off" in n for n in result.report.notes)
    assert "SLP vectorizer off" in result.report.format_text()


def test_other_build_failures_are_not_retried():
    mod, _ = import_onnx(strided_conv_model())

    def broken(m, _ctx):
        raise RuntimeError("not a verifier failure")

    notes = []
    with pytest.raises(RuntimeError, match="not a verifier failure"):
        compile_module(mod, tvm.target.Target(ZNVER3),
                       tvm.transform.module_pass(broken, opt_level=0, name="Broken"), notes=notes)
    assert notes == []


def test_without_slp_keeps_the_target_and_adds_the_option_once_per_call():
    target = tvm.target.Target({"kind": "llvm", "mcpu": "znver3", "cl-opt": ["-x86-asm-syntax=intel"]})
    changed = without_slp(target)
    assert changed.attrs["mcpu"] == "znver3"
    assert list(changed.attrs["cl-opt"]) == ["-x86-asm-syntax=intel", SLP_OFF]
