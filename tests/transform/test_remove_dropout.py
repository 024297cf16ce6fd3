"""RemoveDropout: inference Dropout disappears; bias + activation stay in the matmul's kernel."""

import re

import numpy as np
import pytest
import tvm
from onnx import TensorProto, helper, numpy_helper
from tvm import relax
from tvm.script import ir as I, relax as R

from relax_memplan.frontend import import_onnx, run_onnxruntime
from relax_memplan.pipeline import get_pipeline
from relax_memplan.transform.remove_dropout import RemoveDropout


@I.ir_module
class Before:
    @R.function
    def main(x: R.Tensor((4, 8), "float32")) -> R.Tensor((4, 8), "float32"):
        with R.dataflow():
            y = R.nn.relu(x)
            d = R.nn.dropout(y, rate=0.1)
            out = d[0]
            R.output(out)
        return out


@I.ir_module
class Expected:
    @R.function
    def main(x: R.Tensor((4, 8), "float32")) -> R.Tensor((4, 8), "float32"):
        with R.dataflow():
            y = R.nn.relu(x)
            out = y
            R.output(out)
        return out


def test_dropout_output_becomes_its_input():
    pass_ = RemoveDropout()
    tvm.ir.assert_structural_equal(pass_(Before), Expected)
    assert pass_.removed == 1


def test_dropout_whose_mask_is_read_is_kept_for_the_mask():
    @I.ir_module
    class WithMask:
        @R.function
        def main(x: R.Tensor((4, 8), "float32")):
            with R.dataflow():
                d = R.nn.dropout(x, rate=0.1)
                out = d[0]
                mask = d[1]
                res = (out, mask)
                R.output(res)
            return res

    after = RemoveDropout()(WithMask)
    assert "R.nn.dropout" in after.script()
    assert "out: R.Tensor((4, 8), dtype=\"float32\") = x" in after.script()


def test_module_without_dropout_is_returned_unchanged():
    assert RemoveDropout()(Expected).same_as(Expected)


_ACTIVATIONS = {
    "relu": [("Relu", ["y"], "a")],
    "gelu": [("Div", ["y", "sqrt2"], "d"), ("Erf", ["d"], "e"), ("Add", ["e", "one"], "e1"),
             ("Mul", ["y", "e1"], "m"), ("Mul", ["m", "half"], "a")],
    "silu": [("Sigmoid", ["y"], "s"), ("Mul", ["y", "s"], "a")],
}


def _epilogue_model(activation):
    """x (n, 16) @ W + b, the activation, Dropout (as exported for inference)."""
    rng = np.random.default_rng(0)
    consts = {"W": rng.standard_normal((16, 32)), "b": rng.standard_normal(32),
              "sqrt2": np.array(np.sqrt(2.0)), "one": np.array(1.0), "half": np.array(0.5)}
    nodes = [helper.make_node("MatMul", ["x", "W"], ["mm"]),
             helper.make_node("Add", ["mm", "b"], ["y"])]
    nodes += [helper.make_node(op, ins, [out]) for op, ins, out in _ACTIVATIONS[activation]]
    nodes.append(helper.make_node("Dropout", ["a"], ["out"]))
    graph = helper.make_graph(
        nodes, activation, [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["n", 16])],
        [helper.make_tensor_value_info("out", TensorProto.FLOAT, ["n", 32])],
        [numpy_helper.from_array(v.astype("float32"), k) for k, v in consts.items()])
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])


def _kernels(mod, fusion, tmp_path):
    dump = tmp_path / f"dump_{fusion}"
    ex = tvm.compile(mod, "llvm", relax_pipeline=get_pipeline("llvm", dump_dir=dump,
                                                                fusion=fusion))
    legalized = (dump / "1_legalize.py").read_text()
    return ex, re.findall(r"R\.call_tir\(cls\.(\w+)", legalized[legalized.index("def main"):])


@pytest.mark.parametrize("activation", sorted(_ACTIVATIONS))
def test_bias_activation_dropout_is_one_kernel_matching_onnxruntime(activation, tmp_path):
    model = _epilogue_model(activation)
    mod, _ = import_onnx(model, {"x": (5, 16)})
    x = np.random.default_rng(1).standard_normal((5, 16)).astype("float32")
    expected = run_onnxruntime(model, {"x": x})[0]
    for fusion in (False, True):
        ex, kernels = _kernels(mod, fusion, tmp_path)
        assert len(kernels) == 1, kernels  # TVM's FuseOps already takes bias + activation
        assert ("dropout" in kernels[0]) != fusion
        got = relax.VirtualMachine(ex, tvm.cpu())["main"](tvm.runtime.tensor(x)).numpy()
        np.testing.assert_allclose(got, expected, rtol=1e-5, atol=1e-5)
