"""The ordered list of preparation steps and :func:`prepare`, which runs them.

Two kinds of step, both named and switchable off:

* **graph steps** rewrite the ONNX model (``ModelProto -> (ModelProto, note)``) before
  TVM sees it; they run in :data:`GRAPH_STEPS` order.
* **converter steps** replace one of TVM 0.27's ONNX op converters while
  :func:`~relax_memplan.frontend.prepare.converters.corrected_converters` is active (only
  during an import); they are listed in
  :data:`~relax_memplan.frontend.prepare.converters.CONVERTER_STEPS`.

This module does not import TVM.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from dataclasses import dataclass

import onnx

from ...errors import PrepareStepError
from .fold_constants import FoldConstants
from .inline_constant_if import InlineConstantIf
from .shape_casts import Int64ShapeArithmetic

__all__ = ["GRAPH_STEPS", "CONVERTER_STEP_NAMES", "STEP_NAMES", "PreparedModel", "prepare"]

GraphStep = Callable[[onnx.ModelProto], tuple[onnx.ModelProto, str]]

GRAPH_STEPS: dict[str, Callable[[], GraphStep]] = {
    FoldConstants.name: FoldConstants,
    InlineConstantIf.name: InlineConstantIf,
    Int64ShapeArithmetic.name: Int64ShapeArithmetic,
}
"""Graph step name to a factory of the step with its default arguments, in run order."""

CONVERTER_STEP_NAMES: tuple[str, ...] = (
    "symbolic_range",
    "shape_value_reshape",
    "exact_resize",
    "assume_equal_dims",
    "symbolic_expand",
    "symbolic_auto_pad",
    "onnx_attention",
    "recurrent",
    "unroll_loops",
)
"""Names of the corrected TVM converters (defined in ``converters``), in install order."""

STEP_NAMES: tuple[str, ...] = tuple(GRAPH_STEPS) + CONVERTER_STEP_NAMES


@dataclass(frozen=True)
class PreparedModel:
    """What :func:`prepare` produced.

    Attributes
    ----------
    model : onnx.ModelProto
        The rewritten model (a copy; the input model is never modified).
    notes : tuple of str
        ``"<step>: <what changed>"`` for each graph step that changed something.
    converter_steps : tuple of str
        The converter steps to install while importing ``model``.
    """

    model: onnx.ModelProto
    notes: tuple[str, ...]
    converter_steps: tuple[str, ...]


def select_steps(steps: Iterable[str] | None = None, disable: Iterable[str] = ()) -> list[str]:
    """The step names to run: ``steps`` (default: all, in order) minus ``disable``.

    Raises
    ------
    PrepareStepError
        When a name in ``steps`` or ``disable`` is not a known step; the message lists them.
    """
    chosen = list(STEP_NAMES if steps is None else steps)
    disabled = list(disable)
    unknown = [name for name in chosen + disabled if name not in STEP_NAMES]
    if unknown:
        raise PrepareStepError(
            f"unknown ONNX preparation step(s) {', '.join(map(repr, unknown))}; "
            f"known steps: {', '.join(STEP_NAMES)}"
        )
    return [name for name in STEP_NAMES if name in chosen and name not in disabled]


def prepare(
    model: onnx.ModelProto, steps: Iterable[str] | None = None, disable: Iterable[str] = ()
) -> PreparedModel:
    """Run the selected graph steps on ``model`` and choose the converter steps.

    Parameters
    ----------
    model : onnx.ModelProto
        The model; not modified.
    steps : iterable of str, optional
        Names of the steps to run (graph and converter steps, see :data:`STEP_NAMES`);
        default all.  They always run in the order of :data:`STEP_NAMES`.
    disable : iterable of str
        Names of steps not to run.

    Returns
    -------
    PreparedModel

    Raises
    ------
    PrepareStepError
        For an unknown step name.
    """
    selected = select_steps(steps, disable)
    notes = []
    for name in selected:
        if name in GRAPH_STEPS:
            model, note = GRAPH_STEPS[name]()(model)
            if note:
                notes.append(f"{name}: {note}")
    converters = tuple(name for name in selected if name in CONVERTER_STEP_NAMES)
    return PreparedModel(model=model, notes=tuple(notes), converter_steps=converters)
