#!/usr/bin/env python3
"""Export more transformer architectures to ONNX for the attention integration set.

Random weights (``torch.manual_seed(0)``, default init from code configs), eval mode, no hub
downloads; both of torch's exporters where they work: the dynamo exporter (``torch.export``,
opset 18) as ``<name>.onnx`` and the TorchScript exporter (opset 17) as
``<name>_legacy.onnx``. Beside each file: ``<name>.inputs.npz`` (batch 1, seq 128 / 224x224
images), ``<name>.ref.npz`` (PyTorch eager outputs for those inputs) and ``<name>.meta.json``
(source, exporter, errors, layers with attention, onnxruntime vs PyTorch).

Runs in a torch environment (torch, transformers, onnx, onnxscript, onnxruntime), not in the
package's own; one model per process keeps memory low::

    python benchmarks/export_transformers.py list
    python benchmarks/export_transformers.py export NAME [NAME ...] [--out DIR] [--force]

Models: ``distilbert`` (DistilBERT-base), ``llama`` (a Llama-style decoder: grouped-query
attention 12 query / 4 key-value heads, RoPE, RMSNorm, SwiGLU; 8 layers), ``deit_small``
(DeiT-small, transformers' DeiT), ``swin_t`` (Swin-T: window attention with a relative-position
bias over a batch of windows, shifted windows with their mask), ``t5_small_encoder`` (T5-small's
encoder: relative-position bias, RMSNorm), ``llama_small`` (the Llama-style decoder at 2 layers,
hidden 256, 8 query / 2 key-value heads), ``whisper_tiny_decoder`` (Whisper-tiny's decoder:
causal self-attention and cross-attention on the encoder states, given as an input).
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
import traceback

import numpy as np
import torch
from torch import nn

DYNAMO_OPSET = 18
TS_OPSET = 17
EXPORT_BATCH, EXPORT_SEQ = 2, 64  # trace example: nothing specialises on 1
TYPICAL_BATCH, TYPICAL_SEQ = 1, 128
ID_HIGH = 1000


class _Outputs(nn.Module):
    """Positional inputs in, plain tensors out (the names given at export)."""

    def __init__(self, model, input_names, output_names, **fixed):
        super().__init__()
        self.m, self.input_names, self.output_names, self.fixed = (
            model, input_names, output_names, fixed)

    def forward(self, *args):
        out = self.m(**dict(zip(self.input_names, args)), **self.fixed, return_dict=True)
        got = tuple(getattr(out, n) for n in self.output_names)
        return got if len(got) > 1 else got[0]


def _text(kind_mask=True):
    spec = [("input_ids", "ids", {0: "batch", 1: "seq"})]
    if kind_mask:
        spec.append(("attention_mask", "mask", {0: "batch", 1: "seq"}))
    return spec


def distilbert():
    from transformers import DistilBertConfig, DistilBertModel
    cfg = DistilBertConfig()
    return dict(model=DistilBertModel(cfg), inputs=_text(), outputs=["last_hidden_state"],
                layers=cfg.n_layers, seq_max=cfg.max_position_embeddings,
                source="transformers DistilBertModel, DistilBertConfig() (6L, h768, 12 heads)")


def llama():
    from transformers import LlamaConfig, LlamaForCausalLM
    cfg = LlamaConfig(hidden_size=768, intermediate_size=2048, num_hidden_layers=8,
                      num_attention_heads=12, num_key_value_heads=4, vocab_size=32000,
                      max_position_embeddings=2048, use_cache=False)
    return dict(model=LlamaForCausalLM(cfg), inputs=_text(kind_mask=False), outputs=["logits"],
                layers=cfg.num_hidden_layers, seq_max=cfg.max_position_embeddings,
                fixed=dict(use_cache=False),
                source="transformers LlamaForCausalLM, LlamaConfig(h768, 8L, 12 q heads, "
                       "4 kv heads, ffn 2048, vocab 32000): GQA, RoPE, RMSNorm, SwiGLU")


def llama_small():
    from transformers import LlamaConfig, LlamaForCausalLM
    cfg = LlamaConfig(hidden_size=256, intermediate_size=688, num_hidden_layers=2,
                      num_attention_heads=8, num_key_value_heads=2, vocab_size=1000,
                      max_position_embeddings=512, use_cache=False)
    return dict(model=LlamaForCausalLM(cfg), inputs=_text(kind_mask=False), outputs=["logits"],
                layers=cfg.num_hidden_layers, seq_max=cfg.max_position_embeddings,
                fixed=dict(use_cache=False),
                source="transformers LlamaForCausalLM, LlamaConfig(h256, 2L, 8 q heads, "
                       "2 kv heads, ffn 688, vocab 1000): GQA, RoPE, RMSNorm, SwiGLU")


def deit_small():
    from transformers import DeiTConfig, DeiTModel
    cfg = DeiTConfig(hidden_size=384, num_hidden_layers=12, num_attention_heads=6,
                     intermediate_size=1536)
    return dict(model=DeiTModel(cfg, add_pooling_layer=False),
                inputs=[("pixel_values", "image", {0: "batch"})],
                outputs=["last_hidden_state"], layers=cfg.num_hidden_layers,
                source="transformers DeiTModel, DeiTConfig(h384, 12L, 6 heads): DeiT-small")


def swin_t():
    from transformers import SwinConfig, SwinModel
    cfg = SwinConfig()  # swin-tiny: embed 96, depths 2/2/6/2, heads 3/6/12/24, window 7
    return dict(model=SwinModel(cfg), inputs=[("pixel_values", "image", {0: "batch"})],
                outputs=["last_hidden_state"], layers=sum(cfg.depths),
                source="transformers SwinModel, SwinConfig() (Swin-T: embed 96, depths 2-2-6-2, "
                       "window 7)")


def t5_small_encoder():
    from transformers import T5Config, T5EncoderModel
    cfg = T5Config(d_model=512, d_ff=2048, d_kv=64, num_layers=6, num_heads=8, vocab_size=32128)
    return dict(model=T5EncoderModel(cfg), inputs=_text(), outputs=["last_hidden_state"],
                layers=cfg.num_layers, seq_max=512,
                source="transformers T5EncoderModel, T5Config(d512, 6L, 8 heads, d_kv 64): "
                       "T5-small's encoder")


def whisper_tiny_decoder():
    from transformers import WhisperConfig, WhisperModel
    cfg = WhisperConfig(d_model=384, encoder_layers=4, decoder_layers=4,
                        encoder_attention_heads=6, decoder_attention_heads=6,
                        encoder_ffn_dim=1536, decoder_ffn_dim=1536, num_mel_bins=80,
                        vocab_size=51865, max_source_positions=1500,
                        max_target_positions=448, use_cache=False)
    return dict(model=WhisperModel(cfg).get_decoder(),
                inputs=[("input_ids", "ids", {0: "batch", 1: "seq"}),
                        ("encoder_hidden_states", "states", {0: "batch"})],
                outputs=["last_hidden_state"], layers=2 * cfg.decoder_layers, seq_max=448,
                fixed=dict(use_cache=False),
                source="transformers WhisperModel(tiny: d384, 4L, 6 heads).decoder: causal "
                       "self-attention + cross-attention on encoder_hidden_states (1500 x 384)")


MODELS = {f.__name__: f for f in (distilbert, llama, llama_small, deit_small, swin_t, t5_small_encoder,
                                  whisper_tiny_decoder)}


def make_inputs(spec, batch, seq, seed):
    g = torch.Generator().manual_seed(seed)
    out = {}
    for name, kind, _ in spec["inputs"]:
        if kind == "image":
            out[name] = torch.randn(batch, 3, 224, 224, generator=g)
        elif kind == "ids":
            out[name] = torch.randint(0, ID_HIGH, (batch, seq), generator=g)
        elif kind == "mask":
            out[name] = torch.ones(batch, seq, dtype=torch.int64)
        elif kind == "states":
            out[name] = torch.randn(batch, 1500, 384, generator=g)
        else:
            raise ValueError(f"unknown input kind {kind!r} of {name}")
    return out


def _dynamic_shapes(spec):
    from torch.export import Dim
    dims = {"batch": Dim("batch", min=1, max=1024)}
    if "seq_max" in spec:
        dims["seq"] = Dim("seq", min=1, max=spec["seq_max"])
    # one entry: the wrapper's forward takes *args
    return (tuple({ax: dims[d] for ax, d in axes.items()} for _, _, axes in spec["inputs"]),)


def _rename_dims(path, spec):
    """The graph inputs' symbolic dims named batch/seq (dynamo may write s0, s1)."""
    import onnx
    model = onnx.load(path)
    want = {n: axes for n, _, axes in spec["inputs"]}
    mapping = {}
    for vi in model.graph.input:
        for ax, sym in want.get(vi.name, {}).items():
            dim = vi.type.tensor_type.shape.dim[ax]
            if dim.dim_param and dim.dim_param != sym:
                mapping[dim.dim_param] = sym
    if mapping:
        for vi in list(model.graph.input) + list(model.graph.output) + list(model.graph.value_info):
            for dim in vi.type.tensor_type.shape.dim:
                if dim.dim_param in mapping:
                    dim.dim_param = mapping[dim.dim_param]
        onnx.save(model, path)
    return mapping


def _export(wrapped, spec, args, path, dynamo, ts_opset=TS_OPSET):
    names = [n for n, _, _ in spec["inputs"]]
    with torch.no_grad():
        if dynamo:
            torch.onnx.export(wrapped, args, path, input_names=names,
                              output_names=spec["outputs"], opset_version=DYNAMO_OPSET,
                              dynamo=True, external_data=False,
                              dynamic_shapes=_dynamic_shapes(spec), optimize=True)
        else:
            torch.onnx.export(wrapped, args, path, input_names=names,
                              output_names=spec["outputs"], opset_version=ts_opset,
                              dynamo=False, do_constant_folding=True,
                              dynamic_axes={n: dict(axes) for n, _, axes in spec["inputs"]})


def _check(path, wrapped, spec, out_dir, stem):
    """onnxruntime vs PyTorch eager at the typical shape; inputs and references saved."""
    import onnxruntime as ort
    feeds = make_inputs(spec, TYPICAL_BATCH, TYPICAL_SEQ, seed=123)
    with torch.no_grad():
        ref = wrapped(*feeds.values())
    ref = ref if isinstance(ref, tuple) else (ref,)
    np.savez(os.path.join(out_dir, f"{stem}.inputs.npz"), **{k: v.numpy() for k, v in feeds.items()})
    np.savez(os.path.join(out_dir, f"{stem}.ref.npz"),
             **{o: r.float().numpy() for o, r in zip(spec["outputs"], ref)})
    options = ort.SessionOptions()
    options.intra_op_num_threads = 2
    sess = ort.InferenceSession(path, options, providers=["CPUExecutionProvider"])
    got = sess.run(None, {k: v.numpy() for k, v in feeds.items()})
    return {n: dict(max_abs=float(np.abs(g - r.numpy()).max()), ref_max_abs=float(r.abs().max()))
            for n, g, r in zip(spec["outputs"], got, ref)}


def export_one(name, out_dir, force=False, ts_opset=TS_OPSET):
    torch.manual_seed(0)
    spec = MODELS[name]()
    spec["model"].eval()
    names = [n for n, _, _ in spec["inputs"]]
    wrapped = _Outputs(spec["model"], names, spec["outputs"], **spec.get("fixed", {})).eval()
    example = make_inputs(spec, EXPORT_BATCH, EXPORT_SEQ, seed=1)
    args = tuple(example[n] for n in names)
    results = []
    legacy = f"{name}_legacy" + ("" if ts_opset == TS_OPSET else f"_op{ts_opset}")
    for dynamo, stem in ((True, name), (False, legacy)):
        path = os.path.join(out_dir, f"{stem}.onnx")
        if os.path.exists(path) and not force:
            continue
        info = dict(name=stem, source=spec["source"], layers=spec["layers"],
                    params=sum(p.numel() for p in spec["model"].parameters()),
                    exporter=(f"dynamo (torch.export), opset {DYNAMO_OPSET}" if dynamo
                              else f"torchscript (dynamo=False), opset {ts_opset}"),
                    dims={n: dict(axes) for n, _, axes in spec["inputs"]})
        start = time.time()
        try:
            _export(wrapped, spec, args, path, dynamo, ts_opset)
            info["renamed_dims"] = _rename_dims(path, spec)
            info["ort_vs_torch"] = _check(path, wrapped, spec, out_dir, stem)
            info["status"] = "exported"
        except Exception as exc:  # noqa: BLE001 - recorded in the meta, the other exporter runs
            traceback.print_exc()
            info["status"] = "export failed"
            info["error"] = (str(exc).strip().splitlines() or [repr(exc)])[0][:300]
            if os.path.exists(path):
                os.remove(path)
        info["export_s"] = round(time.time() - start, 1)
        with open(os.path.join(out_dir, f"{stem}.meta.json"), "w") as f:
            json.dump(info, f, indent=1)
        results.append(info)
    return results


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("command", choices=["list", "export"])
    parser.add_argument("names", nargs="*")
    parser.add_argument("--out", default="/tmp/full_size_extra")
    parser.add_argument("--force", action="store_true", help="export again over existing files")
    parser.add_argument("--ts-opset", type=int, default=TS_OPSET,
                        help="TorchScript exporter's opset (below 17 layer norms are written as "
                             "ReduceMean/Sub/Pow/Sqrt/Div: <name>_legacy_op<N>.onnx)")
    args = parser.parse_args(argv)
    if args.command == "list":
        print(" ".join(MODELS))
        return 0
    unknown = [n for n in args.names if n not in MODELS]
    if unknown:
        parser.error(f"unknown model(s) {unknown}; known: {list(MODELS)}")
    os.makedirs(args.out, exist_ok=True)
    for name in args.names or list(MODELS):
        for info in export_one(name, args.out, args.force, args.ts_opset):
            print(json.dumps({k: info.get(k) for k in ("name", "status", "error", "export_s",
                                                       "ort_vs_torch")}))
    return 0


if __name__ == "__main__":
    sys.exit(main())
