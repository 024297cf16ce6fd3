"""The ONNX frontend: from an ONNX file to a Relax module, and the reference run to check it.

- :mod:`.importer`: :func:`load_onnx` (read and check a file) and :func:`import_onnx` (TVM's
  ONNX importer with our preparation steps and converters, a one-line error naming the node
  it fails on);
- :mod:`.input_shapes`: each input's dims and the shapes chosen for the import (no TVM);
- :mod:`.prepare`: the preparation steps (graph rewrites before TVM's importer, corrected
  converters while it runs);
- :mod:`.reference`: random inputs and onnxruntime's outputs on them;
- :mod:`.suggested_ranges`: placeholder ``--dim`` ranges read from the graph;
- :mod:`.flags`: ``--dim``/``--shape`` flags as messages suggest them;
- :mod:`.examples`, :mod:`.recurrent_example`: built-in models made with ``onnx.helper``.
"""

from .importer import (UPGRADE_TARGET_OPSET, ImportInfo, import_onnx, load_onnx,
                       step_converted_ops, unsupported_ops)
from .input_shapes import parse_shape_spec
from .reference import SAMPLE_RATE_DEFAULT_HZ, make_random_inputs, run_onnxruntime

__all__ = ["ImportInfo", "parse_shape_spec", "load_onnx", "import_onnx", "make_random_inputs",
           "run_onnxruntime", "unsupported_ops", "step_converted_ops", "UPGRADE_TARGET_OPSET",
           "SAMPLE_RATE_DEFAULT_HZ"]
