"""Tiny models of the standard ONNX ``Attention`` operator (opset 23) built with onnx.helper,
and random feeds for them."""

import numpy as np
import onnx
from onnx import TensorProto, helper

INPUTS = ("q", "k", "v", "attn_mask", "past_key", "past_value", "nonpad_kv_seqlen")
OUTPUTS = ("y", "present_key", "present_value", "qk_matmul_output")


def attention_model(shapes, outputs=("y",), opset=23, name="att", mask_dtype="bool",
                    **attrs):
    """One ``Attention`` node whose inputs are the graph inputs ``shapes`` names.

    ``shapes``: input name (of :data:`INPUTS`) -> shape (ints or dim names); inputs it does
    not name are left out.  ``outputs``: names of :data:`OUTPUTS` to produce (the others are
    left empty).  The mask is ``mask_dtype``, the other inputs float32.
    """
    last = max(INPUTS.index(n) for n in shapes)
    node_inputs = [n if n in shapes else "" for n in INPUTS[:last + 1]]
    last_out = max(OUTPUTS.index(n) for n in outputs)
    node_outputs = [n if n in outputs else "" for n in OUTPUTS[:last_out + 1]]
    node = helper.make_node("Attention", node_inputs, node_outputs, name=name, **attrs)
    elem = {"bool": TensorProto.BOOL, "float32": TensorProto.FLOAT, "int64": TensorProto.INT64}
    types = {"attn_mask": elem[mask_dtype], "nonpad_kv_seqlen": TensorProto.INT64}
    graph_inputs = [helper.make_tensor_value_info(n, types.get(n, TensorProto.FLOAT),
                                                  list(shapes[n]))
                    for n in INPUTS if n in shapes]
    ranks = {"y": len(shapes["q"])}  # the others are 4-D
    graph_outputs = [helper.make_tensor_value_info(n, TensorProto.FLOAT, [None] * ranks.get(n, 4))
                     for n in OUTPUTS if n in outputs]
    graph = helper.make_graph([node], "attention", graph_inputs, graph_outputs)
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", opset)])
    model.ir_version = 10
    model = onnx.shape_inference.infer_shapes(model)  # output shapes, for onnx.checker
    onnx.checker.check_model(model)
    return model


def attention_feeds(model, dims=None, seed=0, masked_row=False):
    """Random feeds for the model's inputs, named dims set from ``dims``; with
    ``masked_row``, the bool mask's first query row is all False."""
    rng = np.random.default_rng(seed)
    feeds = {}
    for value in model.graph.input:
        shape = [d.dim_value if d.HasField("dim_value") else dims[d.dim_param]
                 for d in value.type.tensor_type.shape.dim]
        elem = value.type.tensor_type.elem_type
        if elem == TensorProto.INT64:
            feeds[value.name] = rng.integers(1, 1 + shape[-1], shape)
        elif elem == TensorProto.BOOL:
            mask = rng.random(shape) < 0.7
            if masked_row:
                mask[..., 0, :] = False
            feeds[value.name] = mask
        else:
            feeds[value.name] = rng.standard_normal(shape).astype("float32")
    return feeds
