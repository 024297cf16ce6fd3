"""Small IRModule helper shared by the passes."""

from __future__ import annotations

from typing import Mapping

import tvm

__all__ = ["replace_functions"]


def replace_functions(mod: tvm.IRModule, updates: Mapping) -> tvm.IRModule:
    """A copy of ``mod`` (same attributes) with ``updates`` (GlobalVar -> function) put in;
    ``mod`` itself when there is nothing to update."""
    if not updates:
        return mod
    new_mod = tvm.IRModule(dict(mod.functions_items()), attrs=mod.attrs)
    for gv, func in updates.items():
        new_mod[gv] = func
    return new_mod
