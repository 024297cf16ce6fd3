"""Tests of node_names: guarded bindings are traced to their ONNX node, the IR unchanged."""

import numpy as np
import pytest
import tvm

from relax_memplan.analysis.onnx_nodes import NAMED_OPS
from onnx import TensorProto, helper, numpy_helper
from tvm.relax.frontend.onnx import onnx_frontend

from relax_memplan.analysis.onnx_nodes import NAMED_OPS, ONNX_NODES_ATTR
from relax_memplan.frontend import import_onnx
from tests.conftest import shared_model


def _table(mod):
    attrs = mod["main"].attrs
    if attrs is None or ONNX_NODES_ATTR not in attrs:
        return {}
    return {var: {k: str(v) for k, v in entry.items()}
            for var, entry in attrs[ONNX_NODES_ATTR].items()}


def _without_table(mod):
    mod["main"] = mod["main"].without_attr(ONNX_NODES_ATTR)
    return mod


def _binding_names(mod):
    return [b.var.name for block in mod["main"].body.blocks for b in block.bindings]


def test_bert_tiny_module_unchanged_and_embedding_gathers_named():
    path = shared_model("bert-tiny-randw.onnx")
    plain, _ = import_onnx(path, keep_dynamic=True, node_names=False)
    named, _ = import_onnx(path, keep_dynamic=True)
    table = _table(named)
    assert _binding_names(named) == _binding_names(plain)  # same names, same order
    tvm.ir.assert_structural_equal(_without_table(named), plain)
    words = [var for var, e in table.items() if e["name"] == "/m/embeddings/word_embeddings/Gather"]
    assert len(words) == 1 and table[words[0]]["op"] == "relax.take"
    # bert-tiny has no LayerNormalization node (its norms are decomposed) and no ReduceMean
    # left after the import's own folding
    assert {e["onnx_op"] for e in table.values()} <= set(NAMED_OPS)
    assert {e["onnx_op"] for e in table.values()} >= {"Gather", "Slice", "MatMul", "Softmax",
                                                      "Add", "Where"}


def _two_gathers():
    """``Gather(Relu(Gather(table, ids)), pick)``: a named inner Gather, an unnamed one whose
    output is the graph output (bound by the importer as ``gv``)."""
    nodes = [helper.make_node("Gather", ["table", "ids"], ["rows"], name="lookup/Gather", axis=0),
             helper.make_node("Relu", ["rows"], ["act"], name="relu"),
             helper.make_node("Gather", ["act", "pick"], ["out"], axis=1)]
    graph = helper.make_graph(
        nodes, "g", [helper.make_tensor_value_info("ids", TensorProto.INT64, [3])],
        [helper.make_tensor_value_info("out", TensorProto.FLOAT, [3, 2])],
        initializer=[numpy_helper.from_array(np.ones((10, 4), np.float32), "table"),
                     numpy_helper.from_array(np.array([0, 3], np.int64), "pick")])
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 18)])


def test_named_inner_gather_and_unnamed_output_gather_recorded():
    mod, _ = import_onnx(_two_gathers())
    entries = sorted(_table(mod).values(), key=lambda e: e["output"])
    assert entries == [
        {"op": "relax.take", "onnx_op": "Gather", "name": "", "output": "out"},
        {"op": "relax.take", "onnx_op": "Gather", "name": "lookup/Gather", "output": "rows"},
    ]
    plain, _ = import_onnx(_two_gathers(), node_names=False)
    tvm.ir.assert_structural_equal(_without_table(mod), plain)


def test_importer_methods_restored_after_import():
    before = (onnx_frontend._get_convert_map, onnx_frontend.ONNXGraphImporter._parse_value_proto)
    import_onnx(_two_gathers())
    with pytest.raises(Exception):
        import_onnx(helper.make_model(helper.make_graph(
            [helper.make_node("NoSuchOp", ["x"], ["y"])], "bad",
            [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1])],
            [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1])]),
            opset_imports=[helper.make_opsetid("", 18)]))
    after = (onnx_frontend._get_convert_map, onnx_frontend.ONNXGraphImporter._parse_value_proto)
    assert before == after
