"""Differential fuzzing of the pipeline: random ONNX graphs run by onnxruntime, by TVM's
default pipeline and by ours, compared; failures minimized and saved as repro files.

- :mod:`.generator` -- :func:`generate`: a random valid ONNX graph per seed;
- :mod:`.runner` -- :func:`run_graph`: the three runs, compared and classified;
- :mod:`.minimize` -- :func:`minimize`: delta debugging over a failing graph's nodes.

onnxruntime (the oracle) is imported on first use: install ``relax_memplan[test]``.
``python -m relax_memplan.tools.fuzz --seeds 0:200 --out DIR`` runs a seed range
(``docs/fuzzing.md``).
"""

from .generator import SYMBOLIC_DIM, FuzzGraph, generate

__all__ = ["SYMBOLIC_DIM", "FuzzGraph", "generate"]
