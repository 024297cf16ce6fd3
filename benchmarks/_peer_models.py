"""The models of ``peer_bench.py``: the shared models at their typical shapes
(``../shared/models/README.md``) and the full-size set (``$FULL_SIZE_MODELS``, default
``/tmp/full_size``) at batch 1, sequence 128, with the inputs each runtime is given.

Inputs are drawn once per model (seed 0) and written to one ``.npz`` that every runner reads:
token ids inside the vocabulary (the embedding table's row count, read from the model), masks
of ones, token types of zeros, images in [0, 1), magika's bytes in [0, 256), silero's state
zeros and ``sr`` 16000. The full-size set uses the inputs exported with each model
(``<name>.inputs.npz``).
"""

from __future__ import annotations

import os
from dataclasses import dataclass, field
from pathlib import Path
from typing import Dict, List, Optional, Tuple

import numpy as np

SHARED = Path(__file__).resolve().parents[2] / "shared" / "models"
FULL_SIZE = Path(os.environ.get("FULL_SIZE_MODELS", "/tmp/full_size"))
FULL_SIZE_NAMES = ("resnet50", "mobilenet_v2", "vit_b_16", "bert_base", "gpt2",
                   "whisper_tiny_encoder", "bert_base_legacy", "gpt2_legacy", "vit_b_16_legacy")


@dataclass(frozen=True)
class PeerModel:
    """One model of the benchmark.

    Attributes
    ----------
    name : str
    path : Path
    shapes : dict of str to tuple of int
        Full shape of each input (``--shape`` of ``relax-memplan compile``).
    values : dict of str to numpy.ndarray
        Inputs with fixed values (the others are drawn).
    inputs_file : Path, optional
        Inputs shipped with the model (full-size set).
    full_size : bool
    """

    name: str
    path: Path
    shapes: Dict[str, Tuple[int, ...]] = field(default_factory=dict)
    values: Dict[str, np.ndarray] = field(default_factory=dict)
    inputs_file: Optional[Path] = None
    full_size: bool = False


def _bert(batch: int, seq: int) -> Dict[str, Tuple[int, ...]]:
    return {n: (batch, seq) for n in ("input_ids", "attention_mask", "token_type_ids")}


SHARED_MODELS = [
    PeerModel("mnist-8", SHARED / "mnist-8" / "model.onnx", {"Input3": (1, 1, 28, 28)}),
    PeerModel("squeezenet1.0", SHARED / "squeezenet1.0-randw.onnx", {"data_0": (1, 3, 224, 224)}),
    PeerModel("mobilenetv2-tiny", SHARED / "mobilenetv2-tiny.onnx", {"x": (1, 3, 96, 96)}),
    PeerModel("ultraface", SHARED / "ultraface-rfb-320-opset9.onnx", {"input": (1, 3, 240, 320)}),
    PeerModel("silero-vad", SHARED / "silero-vad-op18-ifless.onnx",
              {"input": (1, 512), "state": (2, 1, 128)},
              {"sr": np.array(16000, np.int64), "state": np.zeros((2, 1, 128), np.float32)}),
    PeerModel("magika", SHARED / "magika-1.0.3.onnx", {"bytes": (1, 2048)}),
    PeerModel("ppocrv4-det", SHARED / "ppocrv4-det.onnx", {"x": (1, 3, 640, 640)}),
    PeerModel("yolov8n", SHARED / "yolov8n-nudenet-320n.onnx", {"images": (1, 3, 320, 320)}),
    PeerModel("bert-tiny", SHARED / "bert-tiny-randw.onnx", _bert(2, 16)),
    PeerModel("gpt2-tiny", SHARED / "gpt2-tiny-randw.onnx", {"input_ids": (2, 16)}),
]


LONG_TEXT = {"bert_base": 512}
"""Full-size text models also run at a long sequence (``bert_base@512``: the score tensors
are 12 x 512 x 512 per layer, where fused attention matters most), with drawn inputs."""


def full_size_models() -> List[PeerModel]:
    """The full-size models exported so far (those whose files exist), then the long-sequence
    rows of :data:`LONG_TEXT`."""
    out = []
    for name in FULL_SIZE_NAMES:
        path, inputs = FULL_SIZE / f"{name}.onnx", FULL_SIZE / f"{name}.inputs.npz"
        if path.exists() and inputs.exists():
            with np.load(inputs) as data:
                shapes = {k: tuple(data[k].shape) for k in data.files}
            out.append(PeerModel(name, path, shapes, inputs_file=inputs, full_size=True))
    for name, seq in LONG_TEXT.items():
        path, inputs = FULL_SIZE / f"{name}.onnx", FULL_SIZE / f"{name}.inputs.npz"
        if path.exists() and inputs.exists():
            with np.load(inputs) as data:  # the same inputs, each (batch, seq) -> (1, seq)
                shapes = {k: (1, seq) for k in data.files}
            out.append(PeerModel(f"{name}@{seq}", path, shapes, full_size=True))
    return out


def _vocabulary(model_path: Path) -> int:
    """Rows of the largest 2-d initializer feeding a Gather (the token embedding)."""
    import onnx

    model = onnx.load(str(model_path), load_external_data=False)
    tables = {i.name: i.dims[0] for i in model.graph.initializer if len(i.dims) == 2}
    rows = [tables[n.input[0]] for n in model.graph.node
            if n.op_type == "Gather" and n.input[0] in tables]
    return int(max(rows)) if rows else 2


def draw_inputs(model: PeerModel, seed: int = 0) -> Dict[str, np.ndarray]:
    """Inputs by name (see the module docstring), in the model's graph order."""
    if model.inputs_file is not None:
        with np.load(model.inputs_file) as data:
            return {k: data[k] for k in data.files}
    import onnx

    graph = onnx.load(str(model.path), load_external_data=False).graph
    initializers = {i.name for i in graph.initializer}
    rng = np.random.default_rng(seed)
    out = {}
    for value in graph.input:
        name = value.name
        if name in initializers:
            continue
        dtype = onnx.helper.tensor_dtype_to_np_dtype(value.type.tensor_type.elem_type)
        shape = model.shapes.get(name, ())
        if name in model.values:
            out[name] = np.asarray(model.values[name], dtype)
        elif name == "attention_mask":
            out[name] = np.ones(shape, dtype)
        elif name == "token_type_ids":
            out[name] = np.zeros(shape, dtype)
        elif name == "input_ids":
            out[name] = rng.integers(0, _vocabulary(model.path), shape).astype(dtype)
        elif np.issubdtype(dtype, np.integer):
            out[name] = rng.integers(0, 256, shape).astype(dtype)
        else:
            out[name] = rng.random(shape, dtype=np.float32).astype(dtype)
    return out
