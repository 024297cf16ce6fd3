"""The generator: the same seed gives the same model; every model passes the checker."""

import onnx

from relax_memplan.tools.fuzz import SYMBOLIC_DIM, generate
from relax_memplan.tools.fuzz.generator import MOTIFS


def test_the_same_seed_gives_the_same_model_byte_for_byte():
    for seed in (0, 5, 17):
        assert generate(seed).model.SerializeToString() == generate(seed).model.SerializeToString()
    assert generate(1).model.SerializeToString() != generate(2).model.SerializeToString()


def test_every_graph_of_a_seed_range_is_valid_and_every_motif_is_drawn():
    motifs, symbolic = set(), 0
    for seed in range(120):
        graph = generate(seed)
        onnx.checker.check_model(graph.model, full_check=True)
        onnx.shape_inference.infer_shapes(graph.model, check_type=True, strict_mode=True)
        motifs.update(graph.motifs)
        symbolic += graph.symbolic
    assert motifs == set(MOTIFS)
    assert 10 < symbolic < 110


def test_a_symbolic_graph_names_its_leading_dim():
    graph = generate(3, symbolic=True)
    dims = [vi.type.tensor_type.shape.dim[0].dim_param for vi in graph.model.graph.input
            if vi.type.tensor_type.shape.dim]
    assert dims and set(dims) == {SYMBOLIC_DIM}
