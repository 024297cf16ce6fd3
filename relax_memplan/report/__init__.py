"""The compile report: what a build's plan and runs say about memory, as data, text and plot.

- :mod:`.records`: :class:`CompileReport` (one per build), :class:`FunctionMemoryReport` (the
  static plan of a function), :class:`ShapeMeasurement` (one row per measured shape), JSON;
- :mod:`.text`: the report as text (:func:`format_report`, :func:`format_side_by_side`), with
  :mod:`.dispatch` (kernel-dispatch lines) and :mod:`.tensor_rows` (storage rows, peaks);
- :mod:`.summary`: the plan's part of the report, written from the planning passes;
- :mod:`.fusion_summary`, :mod:`.not_applied`: what fusion did, which memory features a build
  did not apply and why;
- :mod:`.plot`: the arena plan and the bytes per sampled shape drawn with matplotlib.
"""

from .records import CompileReport, FunctionMemoryReport, ShapeMeasurement
from .text import format_report, format_side_by_side

__all__ = ["CompileReport", "FunctionMemoryReport", "ShapeMeasurement", "format_report",
           "format_side_by_side"]
