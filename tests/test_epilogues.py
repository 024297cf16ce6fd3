"""Epilogues after MatMul/Conv (bias, ReLU / SiLU / erf-GELU, Dropout): where FuseOps leaves them.

Measured here on small ONNX graphs built with onnx.helper: TVM's FuseOps alone already fuses
bias + activation (+ the dropout copy) into the producer's kernel in all three seed cases, so
our fusion's only change is RemoveDropout (one store fewer). Each case checks the kernel count
of both builds and the numerics of ours against onnxruntime.
"""

import re

import numpy as np
import pytest
import tvm
from onnx import TensorProto, helper, numpy_helper
from tvm import relax

from relax_memplan.frontend import import_onnx, make_random_inputs, run_onnxruntime
from relax_memplan.pipeline import backend_phases, fusion_counts, fusion_passes, get_pipeline

LLVM = tvm.target.Target("llvm")


def _init(name, shape, rng):
    return numpy_helper.from_array((0.3 * rng.standard_normal(shape)).astype("float32"), name)


def _gelu_nodes(x, out):
    return [helper.make_node("Div", [x, "sq2"], ["d"]), helper.make_node("Erf", ["d"], ["e"]),
            helper.make_node("Add", ["e", "one"], ["e1"]), helper.make_node("Mul", [x, "e1"], ["m"]),
            helper.make_node("Mul", ["m", "half"], [out])]


def epilogue_model(kind: str):
    """MatMul/Conv -> Add(bias) -> activation (-> Dropout) as an ONNX model (opset 17)."""
    rng = np.random.default_rng(0)
    if kind == "conv_silu":
        x = helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 8, 12, 12])
        inits = [_init("w", (16, 8, 3, 3), rng), _init("b", (1, 16, 1, 1), rng)]
        nodes = [helper.make_node("Conv", ["x", "w"], ["c"], pads=[1, 1, 1, 1]),
                 helper.make_node("Add", ["c", "b"], ["a"]),
                 helper.make_node("Sigmoid", ["a"], ["s"]), helper.make_node("Mul", ["a", "s"], ["m"]),
                 helper.make_node("Dropout", ["m"], ["y"])]
        y = helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, 16, 12, 12])
    else:
        x = helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 16, 32])
        inits = [_init("w", (32, 64), rng), _init("b", (64,), rng)]
        nodes = [helper.make_node("MatMul", ["x", "w"], ["c"]),
                 helper.make_node("Add", ["c", "b"], ["a"])]
        if kind == "matmul_relu":
            nodes += [helper.make_node("Relu", ["a"], ["r"]),
                      helper.make_node("Dropout", ["r"], ["y"])]
        else:
            inits += [numpy_helper.from_array(np.array(v, "float32"), n)
                      for n, v in (("sq2", np.sqrt(2.0)), ("one", 1.0), ("half", 0.5))]
            nodes += _gelu_nodes("a", "y")
        y = helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, 16, 64])
    graph = helper.make_graph(nodes, kind, [x], [y], inits)
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])


def _kernels(mod, fusion):
    passes = fusion_passes(LLVM)
    with LLVM:
        for name, phase in backend_phases(LLVM, fusion=fusion, fusion_pass_list=passes):
            mod = tvm.transform.Sequential(phase, name=name)(mod)
            if name == "dataflow_lower":
                break
    return re.findall(r"^    (\w+)\(", mod["main"].script(show_meta=False), re.M), passes


@pytest.mark.parametrize("kind,dropouts", [("matmul_relu", 1), ("conv_silu", 1),
                                           ("matmul_gelu", 0)])
def test_epilogue_is_one_kernel_and_matches_onnxruntime(kind, dropouts):
    model = epilogue_model(kind)
    mod, info = import_onnx(model)
    theirs, _ = _kernels(mod, fusion=False)
    ours, passes = _kernels(mod, fusion=True)
    assert len(theirs) == len(ours) == 1, (theirs, ours)
    assert ("dropout" in theirs[0]) == bool(dropouts) and "dropout" not in ours[0]
    assert fusion_counts(passes)["dropout"] == dropouts
    feed = make_random_inputs(model, info, seed=0)
    ex = tvm.compile(mod, LLVM, relax_pipeline=get_pipeline(LLVM, fusion=True))
    got = relax.VirtualMachine(ex, tvm.cpu())["main"](
        *[tvm.runtime.tensor(v) for v in feed.values()]).numpy()
    (ref,) = run_onnxruntime(model, feed)
    assert np.abs(got - ref).max() <= 1e-4 * np.abs(ref).max()
