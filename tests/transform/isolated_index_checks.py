"""Run in a subprocess by test_check_index_bounds.py (an unchecked index would crash pytest):
small ONNX models with index inputs, built once each with our pipeline, run at in-range
extremes (compared with onnxruntime) and at out-of-range values (must raise)."""

import json
import sys

import numpy as np
import onnx
import tvm
from onnx import TensorProto, helper
from tvm import relax

from relax_memplan.frontend import import_onnx, run_onnxruntime
from relax_memplan.pipeline import get_pipeline


def model(op, data_shape, idx_shape, out_shape, updates_shape=None, **attrs):
    """``op(data, indices[, updates])`` with all three as graph inputs."""
    inputs = [helper.make_tensor_value_info("data", TensorProto.FLOAT, data_shape),
              helper.make_tensor_value_info("indices", TensorProto.INT64, idx_shape)]
    names = ["data", "indices"]
    if updates_shape is not None:
        inputs.append(helper.make_tensor_value_info("updates", TensorProto.FLOAT, updates_shape))
        names.append("updates")
    node = helper.make_node(op, names, ["out"], name=f"my_{op.lower()}", **attrs)
    graph = helper.make_graph([node], op, inputs,
                              [helper.make_tensor_value_info("out", TensorProto.FLOAT, out_shape)])
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 18)])


CASES = {
    # name: (model, indices that are in range (extremes), indices out of range)
    "Gather": (model("Gather", [5, 3], [4], [4, 3], axis=0),
               [[4, -5, -1, 0]], [[5, 0, 0, 0], [0, -6, 0, 0]]),
    "GatherElements": (model("GatherElements", [3, 4], [3, 2], [3, 2], axis=1),
                       [[[3, -4], [0, -1], [2, 1]]], [[[4, 0], [0, 0], [0, 0]], [[0, 0], [0, -5], [0, 0]]]),
    "GatherND": (model("GatherND", [3, 4], [2, 2], [2]),
                 [[[2, 3], [-3, -4]]], [[[3, 0], [0, 0]], [[0, 4], [0, 0]], [[0, -5], [0, 0]]]),
    "ScatterElements": (model("ScatterElements", [3, 4], [3, 1], [3, 4], updates_shape=[3, 1], axis=1),
                        [[[3], [-4], [-1]]], [[[4], [0], [0]], [[0], [-5], [0]]]),
    "ScatterND": (model("ScatterND", [3, 4], [2, 2], [3, 4], updates_shape=[2]),
                  [[[2, 3], [-3, -4]]], [[[3, 0], [0, 0]], [[0, 0], [0, 4]]]),
}


def run_case(name):
    onnx_model, good, bad = CASES[name]
    onnx.checker.check_model(onnx_model)
    mod, info = import_onnx(onnx_model)
    ex = tvm.compile(mod, "llvm", relax_pipeline=get_pipeline("llvm"))
    vm = relax.VirtualMachine(ex, tvm.cpu())
    rng = np.random.default_rng(0)
    shapes = info.input_shapes
    result = {"good": [], "bad": []}
    for kind, values in (("good", good), ("bad", bad)):
        for idx in values:
            feed = {"data": rng.standard_normal(shapes["data"]).astype("float32"),
                    "indices": np.array(idx, dtype="int64")}
            if "updates" in shapes:
                feed["updates"] = rng.standard_normal(shapes["updates"]).astype("float32")
            try:
                out = vm["main"](*[tvm.runtime.tensor(v) for v in feed.values()]).numpy()
            except Exception as err:  # noqa: BLE001 - the message is what the test checks
                result[kind].append({"error": str(err).strip().splitlines()[-1]})
                continue
            if kind == "good":
                ref = run_onnxruntime(onnx_model, feed)[0]
                result[kind].append({"max_abs_error": float(np.max(np.abs(out - ref)))})
            else:
                result[kind].append({"error": None})
    return result


if __name__ == "__main__":
    print("RESULT " + json.dumps({name: run_case(name) for name in sys.argv[1:]}))
