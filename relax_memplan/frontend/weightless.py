"""A copy of an ONNX model without the bytes of its large weights, for the tools that read
only its structure: ONNX shape inference and onnxruntime's graph optimizer.

Both take a serialized model: for a 500 MB model that is one 500 MB copy to serialize, one
more to parse on the C++ side and, for shape inference, two more to send the result back, each
paid in freshly faulted pages. Neither looks at the values of a weight tensor: shape inference
reads an initializer's dims, and the values only of small shape-like constants (a Reshape's
target, Slice bounds); onnxruntime's fusions match the graph and small scalars (a GELU's 0.5,
a norm's epsilon). So the large initializers keep their name, dtype and dims and become
external data in one file (:data:`ZERO_FILE`) that a caller who needs the bytes makes sparse
(:func:`write_zero_file`).
"""

from __future__ import annotations

import os
from typing import Tuple

import onnx

__all__ = ["ZERO_FILE", "MIN_BYTES", "weightless_copy", "write_zero_file", "save_weightless"]

ZERO_FILE = "zeros.bin"
"""The external-data location every dropped initializer points at (offset 0)."""

MIN_BYTES = 1024
"""Initializers with at least this many bytes of ``raw_data`` are dropped: a shape-like
constant is a few int64 values (rank <= 8: 64 bytes)."""


def weightless_copy(model: onnx.ModelProto, min_bytes: int = MIN_BYTES
                    ) -> Tuple[onnx.ModelProto, int]:
    """``(copy, largest)``: ``model`` with each top-level initializer of at least
    ``min_bytes`` bytes of ``raw_data`` turned into external data at offset 0 of
    :data:`ZERO_FILE`, and the largest such tensor's size in bytes (0: none dropped).

    Nodes, inputs, outputs, value infos, functions, opsets, the small initializers and any
    whose ``raw_data`` does not have the size its dims and type call for are copied as they
    are (subgraphs of If/Loop/Scan with their own initializers included);
    ``model`` is not changed.
    """
    graph = model.graph
    lean = onnx.ModelProto()
    for name in ("ir_version", "producer_name", "producer_version", "domain",
                 "model_version", "doc_string"):
        setattr(lean, name, getattr(model, name))
    lean.opset_import.extend(model.opset_import)
    lean.functions.extend(model.functions)
    lean.metadata_props.extend(model.metadata_props)
    out = lean.graph
    out.name, out.doc_string = graph.name, graph.doc_string
    for name in ("node", "input", "output", "value_info", "sparse_initializer",
                 "quantization_annotation"):
        getattr(out, name).extend(getattr(graph, name))
    largest = 0
    for tensor in graph.initializer:
        size = len(tensor.raw_data) if tensor.HasField("raw_data") else 0
        if size < min_bytes or tensor.data_location == onnx.TensorProto.EXTERNAL \
                or size != _declared_bytes(tensor):
            out.initializer.append(tensor)  # a size that does not fit: the checker says so
            continue
        stub = out.initializer.add()
        stub.name, stub.data_type = tensor.name, tensor.data_type
        stub.dims.extend(tensor.dims)
        stub.data_location = onnx.TensorProto.EXTERNAL
        for key, value in (("location", ZERO_FILE), ("offset", "0"), ("length", str(size))):
            entry = stub.external_data.add()
            entry.key, entry.value = key, value
        largest = max(largest, size)
    return lean, largest


def _declared_bytes(tensor: onnx.TensorProto) -> int:
    """Bytes the tensor's dims and element type call for; -1 for a type without a fixed
    size (strings) or unknown here."""
    try:
        itemsize = onnx.helper.tensor_dtype_to_np_dtype(tensor.data_type).itemsize
    except (KeyError, TypeError, ValueError):
        return -1
    count = 1
    for d in tensor.dims:
        count *= d
    return count * itemsize


def write_zero_file(folder, size: int) -> str:
    """Write :data:`ZERO_FILE` of ``size`` bytes in ``folder`` as a sparse file (no page is
    written) and return its path: the bytes a reader of :func:`weightless_copy`'s external
    data finds, zeros."""
    path = os.path.join(os.fspath(folder), ZERO_FILE)
    with open(path, "wb") as f:
        f.truncate(size)
    return path


def save_weightless(model: onnx.ModelProto, folder, name: str = "model.onnx") -> Tuple[str, int]:
    """``(path, largest)``: :func:`weightless_copy` of ``model`` saved as ``folder/name``
    beside its sparse :data:`ZERO_FILE` (none written when nothing was dropped), for a tool
    that reads a model from a path (``onnx.checker``, onnxruntime)."""
    lean, largest = weightless_copy(model)
    if largest:
        write_zero_file(folder, largest)
    path = os.path.join(os.fspath(folder), name)
    with open(path, "wb") as f:
        f.write(lean.SerializeToString())
    return path, largest
