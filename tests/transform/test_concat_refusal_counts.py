"""Every concatenation call has a count: written in place or refused with a reason, also when
its kernel is fused with other ops (newcomer trial: yolov8n under --schedule said
"3 written; refused: 1" of its 11 concatenations, 7 in no count)."""

import numpy as np
from onnx import TensorProto, helper, numpy_helper

from relax_memplan.transform._concat_plan import NOT_PLAIN


def _conv(name, src, dst, cin):
    weight = numpy_helper.from_array(np.full((4, cin, 1, 1), 0.1, np.float32), f"{name}_w")
    return helper.make_node("Conv", [src, weight.name], [dst]), weight


def _model():
    """Two concatenations of conv outputs along the channels: a plain one (read by a conv),
    and one whose output only feeds an Add (FuseOps fuses the two into one kernel)."""
    specs = [("c1", "x", "a", 4), ("c2", "x", "b", 4), ("c3", "c", "d", 8),
             ("c4", "d", "e", 4), ("c5", "d", "f", 4)]
    convs = [_conv(*spec) for spec in specs]
    bias = numpy_helper.from_array(np.ones((1, 8, 4, 4), np.float32), "bias")
    nodes = [n for n, _ in convs[:2]] + [helper.make_node("Concat", ["a", "b"], ["c"], axis=1)]
    nodes += [n for n, _ in convs[2:]] + [
        helper.make_node("Concat", ["e", "f"], ["g"], axis=1),
        helper.make_node("Add", ["g", "bias"], ["y"])]
    graph = helper.make_graph(
        nodes, "concats", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 4, 4, 4])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, None)],
        initializer=[w for _, w in convs] + [bias])
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 13)])


def test_a_fused_concatenation_is_counted_as_refused():
    import tvm

    from relax_memplan.frontend import import_onnx
    from relax_memplan.pipeline import get_pipeline
    from relax_memplan.transform.plan_static_memory import PlanStaticMemory

    mod, _ = import_onnx(_model(), {})
    plan = PlanStaticMemory(concat_inplace=True, time_limit_s=0.1)
    get_pipeline(tvm.target.Target("llvm"), plan_pass=plan)(mod)
    fplan = plan.plans["main"]
    assert fplan.concat_refusals.get(NOT_PLAIN) == 1, fplan.concat_refusals
    assert fplan.concat_inplace + sum(fplan.concat_refusals.values()) == 2
