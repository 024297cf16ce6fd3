"""Conv chain candidates: each counted once with a reason, the same total in every mode.

Regression on yolov8n: "conv chains fused 2x, conv chains refused 4x" (no reason, one of
its 7 strided convs in no count), "skipped: 7 x dense consumer" under --schedule, and nothing
at all with ``fusion_conv_chain: off``. A small model with the same patterns stands in.
"""

import numpy as np
import pytest
from onnx import TensorProto, helper, numpy_helper

from relax_memplan.report.fusion_summary import fusion_skips
from relax_memplan.pipeline import fusion_counts, fusion_passes, get_pipeline

C = 8


def _conv(name, src, dst, kernel, stride, group=1, cin=C):
    weight = numpy_helper.from_array(
        np.random.default_rng(len(name)).standard_normal((C, cin // group, kernel, kernel))
        .astype(np.float32) * 0.1, f"{name}_w")
    node = helper.make_node("Conv", [src, weight.name], [dst], kernel_shape=[kernel] * 2,
                            strides=[stride] * 2, pads=[kernel // 2] * 4, group=group)
    return node, weight


def _model():
    """Five strided convs: a dense pair (conv -> relu -> 3x3 s2), a depthwise pair, a strided
    conv on the graph input (no producer), a 1x1 s2 (kernel below stride) and a pair whose
    intermediate has another reader (a Relu output of the graph)."""
    specs = [("stem", "x", "a", 3, 1, 1, 3), ("a2", "a_r", "b", 3, 2, 1, C),
             ("p", "b", "c", 1, 1, 1, C), ("dw", "c_r", "d", 3, 2, C, C),
             ("in", "x", "e", 3, 2, 1, 3), ("k1", "d", "f", 1, 2, 1, C),
             ("q", "f", "g", 1, 1, 1, C), ("sh", "g_r", "h", 3, 2, 1, C)]
    nodes, weights = [], []
    for name, src, dst, k, s, grp, cin in specs:
        node, w = _conv(name, src, dst, k, s, grp, cin)
        nodes.append(node)
        weights.append(w)
        if dst in ("a", "c", "g"):
            nodes.append(helper.make_node("Relu", [dst], [f"{dst}_r"]))
    graph = helper.make_graph(
        nodes, "chains", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 3, 64, 64])],
        [helper.make_tensor_value_info(v, TensorProto.FLOAT, None) for v in ("h", "e", "g_r")],
        initializer=weights)
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 13)])


@pytest.fixture(scope="module")
def module():
    from relax_memplan.frontend import import_onnx

    mod, _ = import_onnx(_model(), {})
    return mod


def _run(mod, mode, schedule, target=None):
    import tvm

    target = target or tvm.target.Target("llvm")
    passes = fusion_passes(target, mode, schedule)
    get_pipeline(target, fusion=True, fusion_pass_list=passes)(mod)
    return fusion_counts(passes), fusion_skips(passes)


_ALL = {"refused: intermediate has another reader": 1, "skipped: input not made by a conv": 1,
        "skipped: kernel smaller than its stride": 1}
# review: "dense consumer" was checked first and took in (no producer) and sh (another
# reader) too; each is counted by its own reason, a2 alone is left to our schedules
_SCHEDULED = {"skipped: dense consumer under --schedule": 1,
              "refused: intermediate has another reader": 1, "skipped: input not made by a conv": 1,
              "skipped: kernel smaller than its stride": 1}


# 8 channels: the register-blocked chain kernel on plain llvm (4 lanes), which ``auto`` fuses
# under our schedules too; not for an AVX-512 CPU (16 lanes), where a2 is left to our schedules
_AVX512 = {"kind": "llvm", "mcpu": "skylake-avx512"}


@pytest.mark.parametrize("mode, schedule, target, fused, reasons", [
    ("auto", False, None, 2, _ALL), ("auto", True, None, 2, _ALL),
    ("auto", True, _AVX512, 1, _SCHEDULED), ("memory", True, None, 2, _ALL)])
def test_every_strided_conv_is_counted_once_with_a_reason(module, mode, schedule, target, fused,
                                                          reasons):
    import tvm

    counts, got = _run(module, mode, schedule, target and tvm.target.Target(target))
    assert got == reasons
    assert counts["conv_chain"] == fused
    assert counts["conv_chain_candidates"] == fused + sum(got.values()) == 5
    assert counts["conv_chain_refused"] == sum(n for why, n in got.items()
                                               if why.startswith("refused: "))


def test_off_is_said_not_left_out(module):
    from relax_memplan.compile import BuildOptions
    from relax_memplan.compile.model import _fusion_counts

    counts, reasons = _run(module, "off", False)
    assert "conv_chain" not in counts and reasons == {}
    passes = fusion_passes(BuildOptions().tvm_target, "off")
    assert _fusion_counts(passes, BuildOptions(fusion=True, fusion_conv_chain="off"))[
        "conv_chain"] == "off"
    passes = fusion_passes(BuildOptions().tvm_target, "auto")
    assert _fusion_counts(passes, BuildOptions(fusion=True))["conv_chain"] == 0


def test_ort_node_count_includes_if_bodies():
    """Regression: silero's onnxruntime graph was "4 nodes" (Reshape, Gather, Equal and an
    If holding the model) against our 103 kernels."""
    from onnx import TensorProto, helper

    from relax_memplan.report.fusion_summary import _node_counts, ort_optimized_nodes

    def branch(op):
        return helper.make_graph([helper.make_node(op, ["x"], [f"{op}_y"])], op, [],
                                 [helper.make_tensor_value_info(f"{op}_y", TensorProto.FLOAT, [4])])

    graph = helper.make_graph(
        [helper.make_node("If", ["c"], ["y"], then_branch=branch("Relu"),
                          else_branch=branch("Neg"))], "g",
        [helper.make_tensor_value_info("c", TensorProto.BOOL, []),
         helper.make_tensor_value_info("x", TensorProto.FLOAT, [4])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [4])])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    assert _node_counts(model.graph) == (1, 2)
    assert ort_optimized_nodes(model, split=True) == (3, 2)
    assert ort_optimized_nodes(model) == 3
