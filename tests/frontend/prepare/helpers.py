"""Tiny ONNX models built with onnx.helper, and a runner that imports them with
``keep_dynamic`` and checks them against onnxruntime at several shapes."""

import re
import warnings

import numpy as np
import onnx
import tvm
from onnx import helper, numpy_helper
from tvm import relax

from relax_memplan.frontend import import_onnx, run_onnxruntime


def tiny_model(nodes, inputs, outputs, initializers=(), opset=17) -> onnx.ModelProto:
    graph = helper.make_graph(nodes, "g", inputs, outputs, initializer=list(initializers))
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", opset)])
    model.ir_version = 8
    onnx.checker.check_model(model)
    return model


def tensor(name, elem_type, shape):
    return helper.make_tensor_value_info(name, elem_type, shape)


def const(name, values, dtype=np.int64):
    return numpy_helper.from_array(np.asarray(values, dtype), name)


def compile_and_compare(model, feeds_list, **import_kwargs):
    """Import with symbolic dims, compile once, run each feed dict; return the module."""
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        mod, _ = import_onnx(model, keep_dynamic=True, **import_kwargs)
    ex = tvm.compile(mod, "llvm")
    vm = relax.VirtualMachine(ex, tvm.cpu())
    for feeds in feeds_list:
        expected = run_onnxruntime(model, feeds)
        got = vm["main"](*[tvm.runtime.tensor(v) for v in feeds.values()])
        got = [got] if hasattr(got, "numpy") else list(got)
        assert len(got) == len(expected)
        for out, ref in zip(got, expected):
            np.testing.assert_allclose(out.numpy(), ref, rtol=1e-5, atol=1e-5)
    return mod


def dims(shape):
    """Static dims as int, symbolic ones as their expression text (``T.int64(1)`` as 1)."""
    return [
        int(d) if isinstance(d, tvm.tirx.IntImm) else re.sub(r"T\.int64\((-?\d+)\)", r"\1", str(d))
        for d in shape
    ]


def param_dims(mod, index=0):
    return dims(mod["main"].params[index].ty.shape)


def output_dims(mod):
    return dims(mod["main"].ret_ty.shape)
