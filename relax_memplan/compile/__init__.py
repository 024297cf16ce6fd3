"""The compile layer behind ``relax-memplan compile``: one path from model to report.

- :mod:`.model`: :func:`compile_strategies` / :func:`compile_model` (import, build each
  strategy and TVM's once, run at each shape, report) and :func:`compile_and_measure`;
- :mod:`.build`: :func:`build` (``tvm.compile`` with a clear error), :func:`export_library`;
- :mod:`.measure`: one shape's row (bytes, verification, input sensitivity);
- :mod:`.summary`: the plan's part of the report; :mod:`.shapes`: dims, sampled shapes;
- :mod:`.specs`: ``--dim``/``--bucket`` values from text; :mod:`.dim_suggestions`: checked
  ``--dim`` suggestions;
- :mod:`.options`: :class:`BuildOptions`, :class:`CheckOptions`.

A fixed-shape build is the one-shape case (strategy ``"static"``, dims ``{}``).
"""

from .build import build, export_library
from .measure import max_abs_error, reference_sensitivity
from .model import CompileResult, compile_and_measure, compile_model, compile_strategies
from .options import (STRATEGIES, BuildOptions, CheckOptions, default_planner_passes,
                      library_path_for)
from .shapes import sample_dims
from .specs import parse_dim_spec, parse_values_spec

__all__ = ["BuildOptions", "CheckOptions", "CompileResult", "STRATEGIES", "build",
           "default_planner_passes",
           "compile_and_measure", "compile_model", "compile_strategies", "export_library",
           "library_path_for", "max_abs_error", "parse_dim_spec", "parse_values_spec",
           "reference_sensitivity", "sample_dims"]
