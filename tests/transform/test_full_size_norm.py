"""Every layer norm and RMS norm of the full-size transformers found, whatever its spelling,
and every residual add + norm pair counted (slow).

The models are the exports of ``shared/models/full_size/export.py`` and
``benchmarks/export_transformers.py`` (``--ts-opset 14`` for the ``_op14`` ones, whose layer
norms are element-wise steps); the folders are read from ``FULL_SIZE_MODELS`` (several
separated by ``os.pathsep``); the tests skip when it is unset or a model is missing.
"""

import numpy as np
import pytest
import tvm

from relax_memplan.frontend import import_onnx
from relax_memplan.transform.clamp_empty_slices import ClampEmptySlices
from relax_memplan.transform.fold_constants_first import FoldConstantsFirst
from relax_memplan.transform.fold_matmul_reshape import FoldMatmulReshape
from relax_memplan.transform.fuse_add_layer_norm import FuseAddLayerNorm
from relax_memplan.transform.fuse_normalization import FuseNormalization
from relax_memplan.transform.remove_dropout import RemoveDropout
from tests.transform.test_full_size_attention import _model

pytestmark = pytest.mark.slow

#: model -> (norms written as element-wise steps: layer_norm, rms_norm), residual add + norm
#: pairs; the norm ops the importer makes from LayerNormalization are not counted in the first
NORMS = {
    "bert_base": ((0, 0), 25), "bert_base_legacy": ((0, 0), 25),
    "bert_base_legacy_op14": ((25, 0), 25), "gpt2": ((0, 0), 25),
    "vit_b_16": ((0, 0), 25), "vit_b_16_legacy": ((0, 0), 25),
    "whisper_tiny_encoder": ((0, 0), 9), "distilbert": ((0, 0), 13),
    "distilbert_legacy_op14": ((13, 0), 13), "llama_small": ((0, 5), 4),
    "t5_small_encoder": ((0, 13), 12), "t5_small_encoder_legacy": ((0, 13), 12),
}


@pytest.mark.parametrize("name", sorted(NORMS))
def test_every_norm_is_found_and_each_residual_pair_counted(name):
    path = _model(name)
    shapes = {n: v.shape for n, v in np.load(path.with_suffix(".inputs.npz")).items()}
    mod, _ = import_onnx(path, shapes)
    norms, add_norm = FuseNormalization(), FuseAddLayerNorm(memory_check=False)
    tvm.transform.Sequential([ClampEmptySlices(), FoldConstantsFirst(), FoldMatmulReshape(),
                              RemoveDropout(), norms, add_norm])(mod)
    records = {r.name: r for p in (norms, add_norm) for r in p.records}
    (layer, rms), pairs = NORMS[name]
    for kind, n in (("layer_norm", layer), ("rms_norm", rms)):
        assert (records[kind].fused, records[kind].candidates) == (n, n), records[kind].reasons()
    assert records["add_layer_norm"].candidates + records["add_rms_norm"].candidates == pairs
