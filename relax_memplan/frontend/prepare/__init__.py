"""ONNX preparation for importing models with symbolic (dynamic) dims into Relax.

:func:`prepare` runs the named graph steps (each ``ModelProto -> ModelProto``) in order and
chooses the corrected TVM converters that :func:`corrected_converters` installs while
TVM's importer runs.  Every step can be switched off by name; see :data:`STEP_NAMES`.
"""

from .pipeline import (
    CONVERTER_STEP_NAMES,
    GRAPH_STEPS,
    STEP_NAMES,
    PreparedModel,
    prepare,
    select_steps,
)

__all__ = [
    "CONVERTER_STEP_NAMES",
    "GRAPH_STEPS",
    "STEP_NAMES",
    "PreparedModel",
    "prepare",
    "select_steps",
]
