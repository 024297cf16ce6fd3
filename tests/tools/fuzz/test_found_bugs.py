"""Graphs the fuzz campaign found wrong, kept as regression tests: each minimized repro file
(``repros/``, as ``python -m relax_memplan.tools.fuzz`` saved it) must now be ``ok``."""

from pathlib import Path

import onnx

from relax_memplan.tools.fuzz.runner import run_graph

REPROS = Path(__file__).resolve().parent / "repros"


def test_a_pointwise_conv_with_a_symbolic_batch_and_a_narrow_map_is_right():
    """Seed 1209: one 1x1 Conv over N x 3 x 8 x 8 (N symbolic, 2 output channels). The
    symbolic-extent matmul rule tiled the fused N x H x W columns 32 wide, so its write-back
    ran one vector (16) wide over rows of 8 with no guard: wrong values at every N and a
    corrupted heap. The rule now declines maps whose row is not a multiple of the tile."""
    model = onnx.load(str(REPROS / "wrong_seed1209.onnx"))
    result = run_graph(model, seed=1209, symbolic=True, variants=["default"])
    assert result.outcome == "ok", result.detail
    assert result.sizes == [1, 3, 4]
