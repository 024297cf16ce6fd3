"""relax_memplan: memory planning passes, an ONNX compile path and reports for TVM Relax.

``import relax_memplan`` registers the ``"relax_memplan"`` pipeline with TVM, so
``tvm.relax.get_pipeline("relax_memplan", target=...)`` and
``tvm.compile(mod, target, relax_pipeline="relax_memplan")`` work after it. The one exception
is the ``relax-memplan`` console entry (:mod:`relax_memplan_launch`): there the package loads no
TVM, so that ``--help``, ``--version`` and argument errors answer at once; each command imports
what it runs. The public names below are imported on first use (PEP 562).

Examples
--------
>>> from relax_memplan import get_pipeline, PlanStaticMemory, import_onnx
"""

import sys as _sys

from ._version import __version__

if "relax_memplan_launch" not in _sys.modules:
    from . import pipeline as _pipeline  # noqa: F401  (registers the pipeline with TVM)

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
