"""relax_memplan: memory planning passes, an ONNX compile path and reports for TVM Relax.

Importing the package registers the ``"relax_memplan"`` pipeline with TVM, so
``tvm.relax.get_pipeline("relax_memplan", target="llvm")`` works after ``import relax_memplan``
(this imports TVM). The ONNX frontend (:func:`import_onnx`) is imported on first use. With
TVM's runtime library alone (``TVM_USE_RUNTIME_LIB=1``, a deployment) only the loader,
:mod:`relax_memplan.library`, is usable.

Examples
--------
>>> import relax_memplan
>>> from relax_memplan import get_pipeline, PlanStaticMemory, import_onnx
"""

from tvm import base as _tvm_base

from ._version import __version__

if not _tvm_base._RUNTIME_ONLY:  # a runtime-only TVM (deployment) gets relax_memplan.library
    from .pipeline import get_pipeline  # registers the "relax_memplan" pipeline with TVM
    from .transform import PlanDynamicMemory, PlanStaticMemory

__all__ = ["__version__", "get_pipeline", "PlanStaticMemory", "PlanDynamicMemory", "import_onnx"]


def __getattr__(name):
    # onnx and the frontend load only when asked for (PEP 562)
    if name == "import_onnx":
        from .frontend import import_onnx

        return import_onnx
    raise AttributeError(f"module 'relax_memplan' has no attribute {name!r}")
