"""RecordStorage: an analysis-only pass that records what each function allocates per call.

Runs right after ``StaticPlanBlockMemory`` (ours or TVM's alone) and before
``LowerAllocTensor``; returns the module unchanged. Reads and writes no
function attributes. The recorded :class:`~relax_memplan.analysis.storage.StorageSummary`
per function is what the memory report compares across pipelines.
"""

from __future__ import annotations

from typing import Dict

import tvm
from tvm import relax

from ..analysis.storage import StorageSummary, summarize_storage

__all__ = ["RecordStorage"]


@tvm.transform.module_pass(opt_level=0, name="RecordStorage")
class RecordStorage:
    """Record a :class:`StorageSummary` for every Relax function; the module is unchanged.

    Attributes
    ----------
    summaries : dict of str to StorageSummary
        Filled when the pass runs, keyed by function name.
    """

    def __init__(self):
        self.summaries: Dict[str, StorageSummary] = {}

    def transform_module(self, mod: tvm.IRModule, _ctx) -> tvm.IRModule:
        for gv, func in mod.functions_items():
            if isinstance(func, relax.Function):
                self.summaries[gv.name_hint] = summarize_storage(func)
        return mod
