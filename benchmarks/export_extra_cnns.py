"""Export EfficientNet-B0 and ConvNeXt-T (torchvision, random weights) like the full-size set.

Uses ``../shared/models/full_size/export.py`` (its export and check steps, seeds, inputs and
meta files) with two more torchvision builders; EfficientNet's BatchNorm statistics are
re-estimated on random images as for MobileNetV2 (default statistics collapse its outputs).
Run with the export venv (torch, torchvision, onnx, onnxruntime), one model per process:

    FULL_SIZE_OUT=/tmp/full_size_extra /tmp/export-venv/bin/python \
        benchmarks/export_extra_cnns.py efficientnet_b0
"""

import importlib.util
import sys
from pathlib import Path

EXPORT = Path(__file__).resolve().parents[2] / "shared" / "models" / "full_size" / "export.py"


def main(argv=None) -> None:
    names = (argv if argv is not None else sys.argv[1:]) or ["efficientnet_b0", "convnext_tiny"]
    spec = importlib.util.spec_from_file_location("full_size_export", EXPORT)
    export = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(export)
    export.MODELS.update({
        "efficientnet_b0": export.tv_builder("efficientnet_b0", "torchvision efficientnet_b0",
                                             fix="bn_calib"),
        "convnext_tiny": export.tv_builder("convnext_tiny", "torchvision convnext_tiny"),
    })
    for name in names:
        export.export_one(name)
        export.check_one(name)


if __name__ == "__main__":
    main()
