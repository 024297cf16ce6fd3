"""The comparator and the runner: a wrong value is reported; a sample of graphs agrees."""

import numpy as np
import pytest

from relax_memplan.tools.fuzz import generate
from relax_memplan.tools.fuzz.runner import OUTCOMES, compare, pick_variants, run_graph


def test_the_comparator_reports_a_wrong_value():
    expected = [np.linspace(-1, 1, 12, dtype=np.float32).reshape(3, 4)]
    assert compare([expected[0].copy()], expected) is None
    wrong = expected[0].copy()
    wrong[1, 2] += 1e-2
    assert "max abs error" in compare([wrong], expected)
    assert "max abs error" in compare([wrong], expected, accumulating=True)
    assert "shape" in compare([wrong.T], expected)
    assert "outputs" in compare([], expected)


def test_the_tolerance_scales_with_the_output_magnitude():
    expected = [np.array([1000.0, 0.0], dtype=np.float32)]
    assert compare([np.array([1000.05, 0.005], dtype=np.float32)], expected) is None
    assert compare([np.array([1000.0, 0.05], dtype=np.float32)], expected) is not None


def test_variants_are_chosen_by_seed():
    assert pick_variants(4) == pick_variants(4)
    assert pick_variants(4)[0] == "default" and len(pick_variants(4, 3)) == 3


def _sample(seeds, variants):
    outcomes = {}
    for seed in seeds:
        graph = generate(seed)
        result = run_graph(graph.model, seed, graph.symbolic, graph.static_dim, variants)
        assert result.outcome in OUTCOMES
        outcomes[seed] = (result.outcome, result.detail)
    bad = {s: o for s, o in outcomes.items() if o[0] in ("wrong", "crash_ours")}
    assert not bad, bad


def test_a_fixed_seed_sample_agrees_with_onnxruntime():
    """40 graphs, our default build and TVM's each (about 1-2 s a graph on 2 cores, so the
    200 graphs the issue asks for do not fit the default suite);
    200 graphs with the seed-chosen variants are the slow test below."""
    _sample(range(40), ["default"])


@pytest.mark.slow
def test_two_hundred_graphs_agree_with_onnxruntime():
    _sample(range(200), None)
