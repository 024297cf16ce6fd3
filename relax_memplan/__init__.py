"""relax_memplan: memory planning passes, an ONNX compile path and reports for TVM Relax.

Importing the package registers the ``"relax_memplan"`` pipeline with TVM, so
``tvm.relax.get_pipeline("relax_memplan", target="llvm")`` works after ``import relax_memplan``
(this imports TVM). The ONNX frontend (:func:`import_onnx`) is imported on first use.

Examples
--------
>>> import relax_memplan
>>> from relax_memplan import get_pipeline, PlanStaticMemory, import_onnx
"""

from ._version import __version__
from .pipeline import get_pipeline  # registers the "relax_memplan" pipeline with TVM
from .transform import PlanDynamicMemory, PlanStaticMemory

__all__ = ["__version__", "get_pipeline", "PlanStaticMemory", "PlanDynamicMemory", "import_onnx"]


def __getattr__(name):
    # onnx and the frontend load only when asked for (PEP 562)
    if name == "import_onnx":
        from .frontend import import_onnx

        return import_onnx
    raise AttributeError(f"module 'relax_memplan' has no attribute {name!r}")
