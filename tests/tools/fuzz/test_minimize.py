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


def test_a_cut_tensor_becomes_a_graph_input():
    x = helper.make_tensor_value_info("x", TensorProto.FLOAT, [2, 3])
    y = helper.make_tensor_value_info("y", TensorProto.FLOAT, [2, 3])
    graph = helper.make_graph([helper.make_node("Relu", ["x"], ["r"]),
                               helper.make_node("Tanh", ["r"], ["y"])], "g", [x], [y])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    small = remove_nodes(model, [1])
    assert [i.name for i in small.graph.input] == ["r"]
    assert [o.name for o in small.graph.output] == ["y"]
    assert remove_nodes(model, []) is None
