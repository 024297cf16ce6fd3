"""Small ONNX ``Loop`` and ``Scan`` models built with onnx.helper (fixed-seed weights)."""

import numpy as np
from onnx import TensorProto, helper, numpy_helper

from .helpers import tensor, tiny_model

F = TensorProto.FLOAT


def loop_model(trip=5, trip_as_input=False, cond_from_iter=False, width=4, seed=0):
    """``Loop``: carried ``x [1, width]``, ``x' = tanh(x·W + iter)``; scan output ``x'·2``."""
    rng = np.random.default_rng(seed)
    w = numpy_helper.from_array((rng.standard_normal((width, width)) / np.sqrt(width)).astype("float32"), "W")
    body_nodes = [
        helper.make_node("MatMul", ["x_in", "W"], ["xw"]),
        helper.make_node("Cast", ["iter"], ["iter_f"], to=F),
        helper.make_node("Add", ["xw", "iter_f"], ["pre"]),
        helper.make_node("Tanh", ["pre"], ["x_out"]),
        helper.make_node("Add", ["x_out", "x_out"], ["y_out"]),
    ]
    if cond_from_iter:
        body_nodes.append(helper.make_node("Less", ["iter", "three"], ["cond_out"]))
    else:
        body_nodes.append(helper.make_node("Identity", ["cond_in"], ["cond_out"]))
    body = helper.make_graph(
        body_nodes, "body",
        [tensor("iter", TensorProto.INT64, []), tensor("cond_in", TensorProto.BOOL, []),
         tensor("x_in", F, [1, width])],
        [tensor("cond_out", TensorProto.BOOL, []), tensor("x_out", F, [1, width]),
         tensor("y_out", F, [1, width])],
        initializer=[numpy_helper.from_array(np.array(3, "int64"), "three")],
    )
    inits = [w, numpy_helper.from_array(np.array(True), "cond")]
    inputs = [tensor("x0", F, [1, width])]
    if trip_as_input:
        inputs.append(tensor("M", TensorProto.INT64, []))
    else:
        inits.append(numpy_helper.from_array(np.array(trip, "int64"), "M"))
    node = helper.make_node("Loop", ["M", "cond", "x0"], ["x_final", "ys"], body=body,
                            name="loop0")
    return tiny_model([node], inputs,
                      [tensor("x_final", F, [1, width]), tensor("ys", F, [None, 1, width])],
                      inits)


def scan_model(length=6, width=4, seq="static", seed=0):
    """``Scan``: state ``s [width]``, ``s' = tanh(s·W + x_t)``, scan output ``s'``."""
    rng = np.random.default_rng(seed)
    w = numpy_helper.from_array((rng.standard_normal((width, width)) / np.sqrt(width)).astype("float32"), "W")
    body = helper.make_graph(
        [helper.make_node("MatMul", ["s_in", "W"], ["sw"]),
         helper.make_node("Add", ["sw", "x_t"], ["pre"]),
         helper.make_node("Tanh", ["pre"], ["s_out"]),
         helper.make_node("Identity", ["s_out"], ["y_t"])],
        "body",
        [tensor("s_in", F, [width]), tensor("x_t", F, [width])],
        [tensor("s_out", F, [width]), tensor("y_t", F, [width])],
    )
    n = length if seq == "static" else seq
    node = helper.make_node("Scan", ["s0", "xs"], ["s_final", "ys"], body=body,
                            num_scan_inputs=1, name="scan0")
    return tiny_model([node], [tensor("s0", F, [width]), tensor("xs", F, [n, width])],
                      [tensor("s_final", F, [width]), tensor("ys", F, [n, width])], [w])


def cumsum_loop_model(width=3, seed=0):
    """``Loop`` whose trip count is computed (``Shape(xs)[0]``) and whose body reads ``xs``
    from the enclosing scope: ``acc' = acc + xs[iter] * w``; scan output ``acc'``."""
    rng = np.random.default_rng(seed)
    w = numpy_helper.from_array(rng.standard_normal(width).astype("float32"), "w")
    body = helper.make_graph(
        [helper.make_node("Gather", ["xs", "iter"], ["row"], axis=0),
         helper.make_node("Mul", ["row", "w"], ["scaled"]),
         helper.make_node("Add", ["acc_in", "scaled"], ["acc_out"]),
         helper.make_node("Identity", ["acc_out"], ["y_out"]),
         helper.make_node("Identity", ["cond_in"], ["cond_out"])],
        "body",
        [tensor("iter", TensorProto.INT64, []), tensor("cond_in", TensorProto.BOOL, []),
         tensor("acc_in", F, [width])],
        [tensor("cond_out", TensorProto.BOOL, []), tensor("acc_out", F, [width]),
         tensor("y_out", F, [width])],
    )
    nodes = [helper.make_node("Shape", ["xs"], ["shape"]),
             helper.make_node("Gather", ["shape", "zero"], ["M"], axis=0),
             helper.make_node("Loop", ["M", "cond", "acc0"], ["acc_final", "ys"], body=body,
                              name="cumsum")]
    inits = [w, numpy_helper.from_array(np.array(True), "cond"),
             numpy_helper.from_array(np.array(0, "int64"), "zero")]
    return tiny_model(nodes, [tensor("xs", F, ["seq", width]), tensor("acc0", F, [width])],
                      [tensor("acc_final", F, [width]), tensor("ys", F, ["seq", width])], inits)


def passthrough_scan_model(width=4):
    """``Scan`` with two carried values, one returned unchanged (``b' = b``): the body's
    output is its own input."""
    body = helper.make_graph(
        [helper.make_node("Add", ["a_in", "x_t"], ["a_out"]),
         helper.make_node("Identity", ["b_in"], ["b_out"]),
         helper.make_node("Mul", ["a_out", "b_in"], ["y_t"])],
        "body",
        [tensor("a_in", F, [width]), tensor("b_in", F, [width]), tensor("x_t", F, [width])],
        [tensor("a_out", F, [width]), tensor("b_out", F, [width]), tensor("y_t", F, [width])],
    )
    node = helper.make_node("Scan", ["a0", "b0", "xs"], ["a_final", "b_final", "ys"],
                            body=body, num_scan_inputs=1, name="scan_pass")
    return tiny_model([node], [tensor("a0", F, [width]), tensor("b0", F, [width]),
                               tensor("xs", F, ["seq", width])],
                      [tensor("a_final", F, [width]), tensor("b_final", F, [width]),
                       tensor("ys", F, ["seq", width])])


def axis_scan_model(width=3, reverse=True, seq="seq"):
    """``Scan`` over axis 1 of ``xs [width, seq]``, reversed, its output stacked on axis 1:
    a running sum ``s' = s + x_t``."""
    body = helper.make_graph(
        [helper.make_node("Add", ["s_in", "x_t"], ["s_out"]),
         helper.make_node("Identity", ["s_out"], ["y_t"])],
        "body", [tensor("s_in", F, [width]), tensor("x_t", F, [width])],
        [tensor("s_out", F, [width]), tensor("y_t", F, [width])],
    )
    node = helper.make_node("Scan", ["s0", "xs"], ["s_final", "ys"], body=body,
                            num_scan_inputs=1, scan_input_axes=[1], scan_output_axes=[1],
                            scan_input_directions=[int(reverse)], name="scan_axis")
    return tiny_model([node], [tensor("s0", F, [width]), tensor("xs", F, [width, seq])],
                      [tensor("s_final", F, [width]), tensor("ys", F, [width, seq])])


def while_loop_model():
    """``Loop`` without a trip count (a while loop on a run-time condition)."""
    body = helper.make_graph(
        [helper.make_node("Add", ["x_in", "x_in"], ["x_out"]),
         helper.make_node("ReduceSum", ["x_out"], ["total"], keepdims=0),
         helper.make_node("Less", ["total", "limit"], ["cond_out"])],
        "body",
        [tensor("iter", TensorProto.INT64, []), tensor("cond_in", TensorProto.BOOL, []),
         tensor("x_in", F, [2])],
        [tensor("cond_out", TensorProto.BOOL, []), tensor("x_out", F, [2])],
        initializer=[numpy_helper.from_array(np.array(100.0, "float32"), "limit")],
    )
    node = helper.make_node("Loop", ["", "cond", "x0"], ["x_final"], body=body, name="while0")
    return tiny_model([node], [tensor("x0", F, [2])], [tensor("x_final", F, [2])],
                      [numpy_helper.from_array(np.array(True), "cond")])


def two_scans_model(width=4):
    """Two ``Scan`` nodes in a row (the second scans the first's outputs) and, in the
    first one's body, a ``Loop`` of a constant trip count 2 (unrolled inside the body)."""
    inner = helper.make_graph(
        [helper.make_node("Add", ["v_in", "v_in"], ["v_out"]),
         helper.make_node("Identity", ["cond_in"], ["cond_out"])],
        "inner", [tensor("iter", TensorProto.INT64, []), tensor("cond_in", TensorProto.BOOL, []),
                  tensor("v_in", F, [width])],
        [tensor("cond_out", TensorProto.BOOL, []), tensor("v_out", F, [width])])
    first = helper.make_graph(
        [helper.make_node("Add", ["s_in", "x_t"], ["sum"]),
         helper.make_node("Loop", ["two", "true", "sum"], ["s_out"], body=inner, name="inner"),
         helper.make_node("Tanh", ["s_out"], ["y_t"])],
        "first", [tensor("s_in", F, [width]), tensor("x_t", F, [width])],
        [tensor("s_out", F, [width]), tensor("y_t", F, [width])],
        initializer=[numpy_helper.from_array(np.array(2, "int64"), "two"),
                     numpy_helper.from_array(np.array(True), "true")])
    second = helper.make_graph(
        [helper.make_node("Mul", ["p_in", "y_in"], ["p_out"]),
         helper.make_node("Identity", ["p_out"], ["z_t"])],
        "second", [tensor("p_in", F, [width]), tensor("y_in", F, [width])],
        [tensor("p_out", F, [width]), tensor("z_t", F, [width])])
    nodes = [helper.make_node("Scan", ["s0", "xs"], ["s_final", "ys"], body=first,
                              num_scan_inputs=1, name="scan_a"),
             helper.make_node("Scan", ["s_final", "ys"], ["p_final", "zs"], body=second,
                              num_scan_inputs=1, name="scan_b")]
    return tiny_model(nodes, [tensor("s0", F, [width]), tensor("xs", F, ["seq", width])],
                      [tensor("p_final", F, [width]), tensor("zs", F, ["seq", width])])


def batch_scan_model(width=8, seed=0):
    """``Scan`` with a symbolic batch as well: state ``s [B, width]``, ``xs [seq, B, width]``,
    ``s' = tanh(s·W + x_t)``, scan output ``s'`` (the body's storage is sized by ``B``)."""
    rng = np.random.default_rng(seed)
    w = numpy_helper.from_array((rng.standard_normal((width, width)) / 3).astype("float32"), "W")
    body = helper.make_graph(
        [helper.make_node("MatMul", ["s_in", "W"], ["sw"]),
         helper.make_node("Add", ["sw", "x_t"], ["pre"]),
         helper.make_node("Tanh", ["pre"], ["s_out"]),
         helper.make_node("Identity", ["s_out"], ["y_t"])],
        "body", [tensor("s_in", F, ["B", width]), tensor("x_t", F, ["B", width])],
        [tensor("s_out", F, ["B", width]), tensor("y_t", F, ["B", width])])
    node = helper.make_node("Scan", ["s0", "xs"], ["s_final", "ys"], body=body,
                            num_scan_inputs=1, name="scan_batch")
    return tiny_model([node], [tensor("s0", F, ["B", width]), tensor("xs", F, ["seq", "B", width])],
                      [tensor("s_final", F, ["B", width]), tensor("ys", F, ["seq", "B", width])],
                      [w])


def range_loop_model():
    """``Loop`` whose body makes a tensor of ``iter + 1`` elements (``Range``, read by two
    reductions, so it is materialized): its size depends on the iteration.
    ``acc' = acc + sum(0..iter) + iter``."""
    body = helper.make_graph(
        [helper.make_node("Add", ["iter", "one"], ["stop"]),
         helper.make_node("Range", ["zero", "stop", "one"], ["r"]),
         helper.make_node("Cast", ["r"], ["rf"], to=F),
         helper.make_node("ReduceSum", ["rf"], ["total"], keepdims=0),
         helper.make_node("ReduceMax", ["rf"], ["top"], keepdims=0),
         helper.make_node("Add", ["acc_in", "total"], ["partial"]),
         helper.make_node("Add", ["partial", "top"], ["acc_out"]),
         helper.make_node("Identity", ["cond_in"], ["cond_out"])],
        "body",
        [tensor("iter", TensorProto.INT64, []), tensor("cond_in", TensorProto.BOOL, []),
         tensor("acc_in", F, [])],
        [tensor("cond_out", TensorProto.BOOL, []), tensor("acc_out", F, [])],
        initializer=[numpy_helper.from_array(np.array(0, "int64"), "zero"),
                     numpy_helper.from_array(np.array(1, "int64"), "one")])
    node = helper.make_node("Loop", ["M", "cond", "acc0"], ["acc_final"], body=body,
                            name="range_loop")
    return tiny_model([node], [tensor("acc0", F, []), tensor("M", TensorProto.INT64, [])],
                      [tensor("acc_final", F, [])],
                      [numpy_helper.from_array(np.array(True), "cond")])
