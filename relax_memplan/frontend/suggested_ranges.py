"""Placeholder ``--dim`` ranges for an ONNX model's symbolic dims, read from the graph alone.

By the dim's name (a batch, a sequence length, an image side) and, for the N, H, W of an image
input, on the model's downsampling grid (the product of the strides on the path from the
inputs). No TVM: :func:`relax_memplan.frontend.input_shapes.plan_inputs` uses them for its
hints, :func:`relax_memplan.compile.dim_suggestions.checked_dim_ranges` checks them against
the imported model, ``relax-memplan inspect`` prints them.
"""

from __future__ import annotations

import re
from typing import Dict, Mapping, Optional, Sequence

__all__ = ["suggest_dim_range", "suggest_dim_ranges", "downsampling_factor", "dim_locations",
           "graph_constants"]

_BATCH = re.compile(r"batch|^n$|^b$|^N$", re.IGNORECASE)
_SEQUENCE = re.compile(r"seq|len|token|time|step|position|past|sentence", re.IGNORECASE)
_SPATIAL = re.compile(r"height|width|^h$|^w$", re.IGNORECASE)


def graph_constants(graph) -> Dict[str, object]:
    """Name -> numpy value of the graph's initializers and Constant node outputs."""
    from onnx import numpy_helper

    values = {t.name: numpy_helper.to_array(t) for t in graph.initializer}
    for node in graph.node:
        if node.op_type == "Constant":
            for attr in node.attribute:
                if attr.name == "value":
                    values[node.output[0]] = numpy_helper.to_array(attr.t)
    return values


def suggest_dim_range(name: str) -> str:
    """A placeholder ``LO..HI[:STEP]`` for a symbolic dim, from its name: ``1..8`` for a batch,
    ``1..128`` for a sequence length or the like, ``32..320:32`` for an image height or width
    (CNNs with stride 32 take multiples of 32), ``1..64`` otherwise."""
    if _BATCH.search(name):
        return "1..8"
    if _SPATIAL.search(name):
        return "32..320:32"
    if _SEQUENCE.search(name):
        return "1..128"
    return "1..64"


_STRIDED = ("Conv", "ConvInteger", "QLinearConv", "MaxPool", "AveragePool", "LpPool")


def downsampling_factor(graph) -> int:
    """The largest product of spatial strides on a path from the graph's inputs (``Conv``
    and pooling ``strides``); an image side must be a multiple of it for the feature maps
    of different scales to line up again (FPN/YOLO necks: a ``Resize`` or strided conv
    output added or concatenated to a finer map). A strided op multiplies the factor of its
    data input, an upsampling (``Resize``/``Upsample`` with constant scales,
    ``ConvTranspose``) divides it, other ops take the largest of their inputs'. 32 for
    ppocrv4-det and yolov8n; 1 without strided ops.
    """
    constants = graph_constants(graph)
    factor: Dict[str, int] = {}
    for node in graph.node:
        f = max((factor.get(name, 1) for name in node.input[:1] if name), default=1)
        if node.op_type not in _STRIDED + _UPSAMPLING:  # elementwise, Concat, ...: the max
            f = max((factor.get(name, 1) for name in node.input if name), default=1)
        elif node.op_type in _STRIDED:
            f *= _stride(node)
        elif node.op_type == "ConvTranspose":
            f = max(1, f // _stride(node))
        else:  # Resize / Upsample with constant scales
            scales = [constants.get(name) for name in node.input[1:] if name]
            scales = [x for x in scales if x is not None and x.dtype.kind == "f" and x.size]
            f = max(1, f // max(1, int(max(scales[0].reshape(-1))))) if scales else f
        for name in node.output:
            factor[name] = f
    return max(factor.values(), default=1)


_UPSAMPLING = ("ConvTranspose", "Resize", "Upsample")


def _stride(node) -> int:
    """The largest of a node's ``strides`` (1 without)."""
    strides = [list(a.ints) for a in node.attribute if a.name == "strides"]
    return max(strides[0], default=1) if strides else 1


def _image_dims(input_dims: Mapping[str, Optional[Sequence]], factor: int) -> Dict[str, str]:
    """Suggested ranges for the symbolic N, H and W of 4-D inputs (NCHW) when the model has
    strides: ``1..8`` for N, H and W on the downsampling grid (``32..320:32`` for 32)."""
    if factor <= 1:
        return {}
    images = [dims for dims in input_dims.values() if dims is not None and len(dims) == 4]
    batch = {dims[0]: "1..8" for dims in images if isinstance(dims[0], str)}
    return {**batch, **{d: f"{factor}..{10 * factor}:{factor}" for dims in images
                        for d in dims[2:] if isinstance(d, str)}}


def suggest_dim_ranges(input_dims: Mapping[str, Optional[Sequence]], graph) -> Dict[str, str]:
    """A placeholder ``--dim`` range per symbolic dim of the inputs, in order of appearance:
    by the dim's name (:func:`suggest_dim_range`), and for the N, H, W of an image input on
    the model's downsampling grid (:func:`downsampling_factor`), whatever their names.

    Parameters
    ----------
    input_dims : mapping of str to sequence of (int or str), or None
        Each input's dims (a name per symbolic dim), by input name.
    graph : onnx.GraphProto
    """
    symbolic = list(dict.fromkeys(d for dims in input_dims.values() for d in dims or ()
                                  if isinstance(d, str)))
    return {**{name: suggest_dim_range(name) for name in symbolic},
            **_image_dims(input_dims, downsampling_factor(graph))}


def dim_locations(input_dims: Mapping[str, Optional[Sequence]]) -> Dict[str, str]:
    """Where each symbolic dim first appears: ``{"s27": "axis 1 of input_ids"}`` (a name like
    ``s27`` says nothing; the input and axis say what it is)."""
    where: Dict[str, str] = {}
    for name, dims in input_dims.items():
        for axis, d in enumerate(dims or ()):
            if isinstance(d, str) and d not in where:
                where[d] = f"axis {axis} of {name}"
    return where
