"""The minimizer reduces a graph to the node a planted failure needs."""

import onnx
from onnx import TensorProto, helper

from relax_memplan.tools.fuzz import generate
from relax_memplan.tools.fuzz.minimize import minimize, remove_nodes


def _has(op):
    return lambda m: any(n.op_type == op for n in m.graph.node)


def test_a_planted_failure_reduces_to_its_op():
    graph = next(g for g in map(generate, range(50))
                 if "Softmax" in [n.op_type for n in g.model.graph.node]
                 and len(g.model.graph.node) > 6)
    small = minimize(graph.model, _has("Softmax"))
    assert [n.op_type for n in small.graph.node] == ["Softmax"]
    onnx.checker.check_model(small, full_check=True)


def _chain(first):
    x = helper.make_tensor_value_info("x", TensorProto.FLOAT, [2, 3])
    graph = helper.make_graph([first, helper.make_node("Tanh", ["r"], ["y"])], "g", [x],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, None)])
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])


def test_a_cut_tensor_is_replaced_by_an_input_of_its_shape():
    small = remove_nodes(_chain(helper.make_node("Relu", ["x"], ["r"])), [1])
    assert [i.name for i in small.graph.input] == ["x"]
    assert list(small.graph.node[0].input) == ["x"]


def test_a_cut_tensor_of_another_shape_becomes_a_graph_input():
    model = _chain(helper.make_node("Transpose", ["x"], ["r"], perm=[1, 0]))
    small = remove_nodes(model, [1])
    assert [i.name for i in small.graph.input] == ["r"]
    assert [o.name for o in small.graph.output] == ["y"]
    assert remove_nodes(model, []) is None
