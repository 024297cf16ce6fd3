"""Shared test helpers: paths to ../shared and lowering of small Relax modules."""

from pathlib import Path

import pytest

REPO_ROOT = Path(__file__).resolve().parents[1]
SHARED = REPO_ROOT.parent / "shared"
MODELS = SHARED / "models"


def shared_model(name: str) -> Path:
    """Path of a model in ../shared/models, skipping the test when it is absent."""
    path = MODELS / name
    if not path.exists():
        pytest.skip(f"{path} not found (tests read real models from ../shared)")
    return path


@pytest.fixture(scope="session")
def vad_lstm_onnx(tmp_path_factory) -> Path:
    """The generated vad-lstm model (``recurrent_example.vad_lstm_model``) saved once."""
    import onnx

    from relax_memplan.frontend.recurrent_example import vad_lstm_model

    path = tmp_path_factory.mktemp("vad") / "vad_lstm.onnx"
    onnx.save(vad_lstm_model(), str(path))
    return path


def lower_to_alloc_form(mod):
    """Legalize (no fusion) and lower to the form StaticPlanBlockMemory sees.

    The result has ``R.builtin.alloc_tensor`` bindings and PrimFunc calls in
    destination-passing style, with ``R.reshape`` kept as a view.
    """
    import tvm
    from tvm import relax
    from tvm.relax.backend.cpu_generic import pipeline as cpu

    target = tvm.target.Target("llvm")
    with target:
        seq = tvm.transform.Sequential(
            [relax.transform.LegalizeOps()] + cpu.dataflow_lower_passes(target)
        )
        return seq(mod)


def relax_ops(mod, func_name: str = "main") -> list:
    """Names of the Relax operators called in ``mod[func_name]``, in post order."""
    import tvm
    from tvm import relax

    ops = []

    def visit(expr):
        if isinstance(expr, relax.Call) and isinstance(expr.op, tvm.ir.Op):
            ops.append(expr.op.name)

    relax.analysis.post_order_visit(mod[func_name].body, visit)
    return ops


def mlp_model(dim="n"):
    """y[dim, 8] = relu(x[dim, 16] @ w1) @ w2: two intermediate tensors with a symbolic first
    dim, seconds to build (for tests where the model is incidental)."""
    import numpy as np
    import onnx
    from onnx import TensorProto, helper

    rng = np.random.default_rng(0)
    w1 = helper.make_tensor("w1", TensorProto.FLOAT, [16, 32], rng.standard_normal(512).tolist())
    w2 = helper.make_tensor("w2", TensorProto.FLOAT, [32, 8], rng.standard_normal(256).tolist())
    graph = helper.make_graph(
        [helper.make_node("MatMul", ["x", "w1"], ["h"]), helper.make_node("Relu", ["h"], ["r"]),
         helper.make_node("MatMul", ["r", "w2"], ["y"])], "mlp",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, [dim, 16])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [dim, 8])], [w1, w2])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    model.ir_version = 8
    onnx.checker.check_model(model)
    return model
