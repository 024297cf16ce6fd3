"""relax_memplan: memory planning passes, an ONNX compile path and reports for TVM Relax.

``import relax_memplan`` loads no TVM, so that ``relax-memplan --help`` answers at once: the
names below are imported on first use (PEP 562). The first use of any of them imports
:mod:`relax_memplan.pipeline`, which registers the ``"relax_memplan"`` pipeline with TVM, so
``tvm.relax.get_pipeline("relax_memplan", target="llvm")`` works after, e.g.,
``from relax_memplan import get_pipeline`` (or ``import relax_memplan.pipeline``).

Examples
--------
>>> from relax_memplan import get_pipeline, PlanStaticMemory, import_onnx
"""

from ._version import __version__

__all__ = ["__version__", "get_pipeline", "PlanStaticMemory", "PlanDynamicMemory", "import_onnx"]


def __getattr__(name):
    if name not in __all__:
        raise AttributeError(f"module 'relax_memplan' has no attribute {name!r}")
    from .pipeline import get_pipeline  # registers the "relax_memplan" pipeline with TVM

    if name == "get_pipeline":
        return get_pipeline
    if name == "import_onnx":
        from .frontend import import_onnx

        return import_onnx
    from . import transform

    return getattr(transform, name)


def __dir__():
    return sorted(set(globals()) | set(__all__))
