#!/usr/bin/env python3
"""Export small models with paddle2onnx and with tf2onnx, with their dynamic dims, to check
what those converters write as they write it today (the models pip packages ship were
converted by older versions).

Usage, each in an environment with that framework::

    python benchmarks/export_paddle_tf_models.py paddle OUT_DIR   # paddlepaddle, paddle2onnx
    python benchmarks/export_paddle_tf_models.py tf OUT_DIR       # tensorflow, tf2onnx

``paddle`` writes ``OUT_DIR/paddle-mobilenetv3.onnx``: paddle's MobileNetV3-small (random
weights), input ``[None, 3, None, None]`` through ``paddle.onnx.export`` (paddle2onnx).
``tf`` writes ``OUT_DIR/tf-cnn.onnx`` (a Keras CNN, input ``(None, None, None, 3)``) and
``OUT_DIR/tf-text.onnx`` (embedding, 1-D conv, pooling over a ``(None, None)`` int32 input)
through ``tf2onnx.convert.from_keras``. Weights are random with a fixed seed; nothing is
downloaded.
"""

from __future__ import annotations

import os
import sys


def paddle_models(out_dir):
    import paddle

    paddle.seed(0)
    net = paddle.vision.models.mobilenet_v3_small(num_classes=10)
    net.eval()
    spec = [paddle.static.InputSpec(shape=[None, 3, None, None], dtype="float32", name="x")]
    base = os.path.join(out_dir, "paddle-mobilenetv3")
    paddle.onnx.export(net, base, input_spec=spec, opset_version=13)
    print(f"{base}.onnx")


def tf_models(out_dir):
    import tensorflow as tf
    import tf2onnx

    tf.keras.utils.set_random_seed(0)
    layers = tf.keras.layers
    image = tf.keras.Input((None, None, 3), name="image")
    x = layers.Conv2D(16, 3, strides=2, padding="same", activation="relu")(image)
    x = layers.BatchNormalization()(x)
    x = layers.DepthwiseConv2D(3, padding="same", activation="relu")(x)
    x = layers.Conv2D(32, 1, activation="relu")(x)
    x = layers.GlobalAveragePooling2D()(x)
    cnn = tf.keras.Model(image, layers.Dense(5, activation="softmax")(x))
    tokens = tf.keras.Input((None,), dtype="int32", name="tokens")
    t = layers.Embedding(1000, 32)(tokens)
    t = layers.Conv1D(32, 3, padding="same", activation="relu")(t)
    t = layers.GlobalMaxPooling1D()(t)
    text = tf.keras.Model(tokens, layers.Dense(3)(t))
    for name, model, spec in (
            ("tf-cnn", cnn, tf.TensorSpec((None, None, None, 3), tf.float32, name="image")),
            ("tf-text", text, tf.TensorSpec((None, None), tf.int32, name="tokens"))):
        path = os.path.join(out_dir, f"{name}.onnx")
        tf2onnx.convert.from_keras(model, input_signature=[spec], opset=15, output_path=path)
        print(path)


def main(argv):
    if len(argv) != 2 or argv[0] not in ("paddle", "tf"):
        print(__doc__)
        return 2
    os.makedirs(argv[1], exist_ok=True)
    (paddle_models if argv[0] == "paddle" else tf_models)(argv[1])
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
