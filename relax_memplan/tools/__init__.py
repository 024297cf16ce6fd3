"""The tools a deploying user reaches for, behind ``relax-memplan run``, ``inspect`` and ``bench``.

- :mod:`.run` -- run a compiled library with the Relax VM on inputs from ``.npy`` files;
- :mod:`.inspect` -- what an ONNX model needs before compiling (inputs, symbolic dims,
  ops TVM cannot import, suggested ``--dim`` flags);
- :mod:`.bench` -- latency of our build, TVM's default build and onnxruntime, interleaved;
- :mod:`.fuzz` -- differential fuzzing: random ONNX graphs run by onnxruntime, TVM's default
  pipeline and ours, compared (``docs/fuzzing.md``).
"""
