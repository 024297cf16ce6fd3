"""Placeholder --dim ranges from the ONNX graph: by the dim's name, image sides on the
model's downsampling grid."""

import numpy as np
from onnx import TensorProto, helper

from relax_memplan.frontend.suggested_ranges import downsampling_factor, suggest_dim_range


def test_suggested_ranges_follow_the_dim_name():
    assert suggest_dim_range("batch_size") == "1..8"
    assert suggest_dim_range("sequence_length") == "1..128"
    assert suggest_dim_range("height") == "32..320:32"


def _fpn_model(strides=(2, 2), scale=2.0):
    """x [n, 3, h, w] -> two strided 1x1 convs -> Resize x``scale`` -> Add to the first
    conv's output (an FPN merge): downsampling factor ``strides[0] * strides[1] / scale``."""
    from onnx import numpy_helper

    w = numpy_helper.from_array(np.ones((3, 3, 1, 1), np.float32), "w")
    scales = numpy_helper.from_array(np.array([1, 1, scale, scale], np.float32), "scales")
    graph = helper.make_graph(
        [helper.make_node("Conv", ["x", "w"], ["c1"], strides=[strides[0]] * 2),
         helper.make_node("Conv", ["c1", "w"], ["c2"], strides=[strides[1]] * 2),
         helper.make_node("Resize", ["c2", "", "scales"], ["up"], mode="nearest"),
         helper.make_node("Add", ["up", "c1"], ["y"])], "fpn",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["n", 3, "rows", "cols"])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, None)], initializer=[w, scales])
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 13)])


def test_downsampling_factor_multiplies_strides_and_divides_by_upsampling():
    assert downsampling_factor(_fpn_model().graph) == 4  # the coarsest map, not after Resize
    assert downsampling_factor(_fpn_model((2, 4), 4.0).graph) == 8
    assert downsampling_factor(_fpn_model((1, 1), 1.0).graph) == 1
