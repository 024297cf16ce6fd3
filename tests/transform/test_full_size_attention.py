"""Every attention block of the full-size transformers fused, static and symbolic (slow).

The models are the exports of ``shared/models/full_size/export.py`` and
``benchmarks/export_transformers.py`` (random weights, both torch exporters); the folders are
read from ``FULL_SIZE_MODELS`` (several separated by ``os.pathsep``); the tests skip when it
is unset or a model is missing.
"""

import os
from pathlib import Path

import numpy as np
import pytest
import tvm

from relax_memplan.errors import UnsupportedOperatorError
from relax_memplan.frontend import import_onnx
from relax_memplan.transform.clamp_empty_slices import ClampEmptySlices
from relax_memplan.transform.fold_constants_first import FoldConstantsFirst
from relax_memplan.transform.fold_matmul_reshape import FoldMatmulReshape
from relax_memplan.transform.fuse_attention import FuseAttention
from relax_memplan.transform.remove_dropout import RemoveDropout

pytestmark = pytest.mark.slow

#: model -> attention blocks (self-attention layers; the decoder's cross-attention counted)
LAYERS = {"bert_base": 12, "bert_base_legacy": 12, "gpt2": 12, "gpt2_legacy": 12,
          "vit_b_16": 12, "vit_b_16_legacy": 12, "whisper_tiny_encoder": 4,
          "distilbert": 6, "distilbert_legacy": 6, "llama": 8, "deit_small": 12,
          "deit_small_legacy": 12, "swin_t": 12, "swin_t_legacy": 12, "t5_small_encoder": 6,
          "t5_small_encoder_legacy": 6, "whisper_tiny_decoder": 8}


def _model(name) -> Path:
    folders = [Path(p) for p in os.environ.get("FULL_SIZE_MODELS", "").split(os.pathsep) if p]
    if not folders:
        pytest.skip("FULL_SIZE_MODELS is not set")
    for folder in folders:
        if (folder / f"{name}.onnx").exists():
            return folder / f"{name}.onnx"
    pytest.skip(f"{name}.onnx is in none of {[str(f) for f in folders]}")


@pytest.mark.parametrize("dynamic", [False, True], ids=["static", "symbolic"])
@pytest.mark.parametrize("name", sorted(LAYERS))
def test_every_attention_block_is_fused(name, dynamic):
    path = _model(name)
    shapes = None if dynamic else {n: v.shape for n, v in
                                   np.load(path.with_suffix(".inputs.npz")).items()}
    try:
        mod, _ = import_onnx(path, shapes, keep_dynamic=dynamic)
    except UnsupportedOperatorError as err:  # TVM's importer, before any pass of ours
        pytest.skip(f"not importable with symbolic dims: {err}")
    fuse = FuseAttention()
    tvm.transform.Sequential([ClampEmptySlices(), FoldConstantsFirst(), FoldMatmulReshape(),
                              RemoveDropout(), fuse])(mod)
    record = fuse.records[0]
    assert (record.fused, record.candidates) == (LAYERS[name], LAYERS[name]), record.reasons()


def test_whisper_encoder_lower_bound_without_its_scores_and_outputs_as_onnxruntime():
    # (6 heads x 1500 x 1500) float32 scores dominated the unfused bound (107 MB)
    from tvm import relax

    from relax_memplan.compile import build
    from relax_memplan.frontend import run_onnxruntime
    from relax_memplan.pipeline import PipelineOptions, PipelinePasses
    from relax_memplan.transform.plan_static_memory import PlanStaticMemory

    path = _model("whisper_tiny_encoder")
    feeds = dict(np.load(path.with_suffix(".inputs.npz")))
    mod, _ = import_onnx(path, {n: v.shape for n, v in feeds.items()})
    plan = PlanStaticMemory(time_limit_s=0.5)
    ex = build(mod, "llvm", PipelineOptions(), PipelinePasses(plan=plan))
    assert plan.plans["main"].lower_bound_bytes <= 25e6
    got = relax.VirtualMachine(ex, tvm.cpu())["main"](
        *[tvm.runtime.tensor(v) for v in feeds.values()]).numpy()
    expected = run_onnxruntime(path, feeds)[0]
    assert np.abs(got - expected).max() <= 1e-4 * np.abs(expected).max()
