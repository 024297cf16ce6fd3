"""Two small models compiled once with ``relax-memplan compile -o`` (a library and its
manifest each), for the manifest, loader and integrity tests."""

from pathlib import Path

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper, numpy_helper

from relax_memplan.cli import main


def dense_model(seed: int) -> onnx.ModelProto:
    """y = relu(x @ w + b), x: float [4, 64], w: [64, 256] (64 KiB: the embedded weights span
    many pages), b: [256]; the weights drawn from ``seed``."""
    rng = np.random.default_rng(seed)
    w = numpy_helper.from_array(rng.standard_normal((64, 256)).astype("float32"), "w")
    b = numpy_helper.from_array(rng.standard_normal(256).astype("float32"), "b")
    nodes = [helper.make_node("MatMul", ["x", "w"], ["m"]), helper.make_node("Add", ["m", "b"], ["a"]),
             helper.make_node("Relu", ["a"], ["y"])]
    graph = helper.make_graph(nodes, f"dense{seed}",
                              [helper.make_tensor_value_info("x", TensorProto.FLOAT, [4, 64])],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, [4, 256])],
                              [w, b])
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])


def _compile(folder: Path, seed: int) -> Path:
    model = folder / f"dense{seed}.onnx"
    onnx.save(dense_model(seed), str(model))
    library = folder / f"dense{seed}.so"
    assert main(["compile", str(model), "-o", str(library), "--no-compare", "--no-measure",
                 "-q"]) == 0
    return library


@pytest.fixture(scope="session")
def dense_libraries(tmp_path_factory):
    """(library of seed 0, library of seed 1, folder), each with its manifest."""
    folder = tmp_path_factory.mktemp("dense")
    return _compile(folder, 0), _compile(folder, 1), folder


@pytest.fixture
def dense_input(tmp_path):
    """x as a .npy file and as an array."""
    x = np.random.default_rng(3).standard_normal((4, 64)).astype("float32")
    np.save(tmp_path / "x.npy", x)
    return tmp_path / "x.npy", x


def reference(seed: int, x: np.ndarray) -> np.ndarray:
    model = dense_model(seed)
    w, b = (numpy_helper.to_array(i) for i in model.graph.initializer)
    return np.maximum(x @ w + b, 0)
