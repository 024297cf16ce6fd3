"""The report's lines on kernel specialization (``compile --dim ... --dispatch NAME=V1,V2``):
which kernels have specialized versions, which version ran at each sampled shape, and, in
plain words, each specialized version that no sampled shape ran (so not verified)."""

from __future__ import annotations

import itertools
from typing import List

from ..analysis.dims import DimRange

__all__ = ["dispatch_lines", "FULL_GRID_LIMIT"]

FULL_GRID_LIMIT = 512
"""Up to this many shapes in the declared ranges, the report suggests ``--sample-shapes`` with
the count of them (every shape in range is then run); above it, running every shape is too
slow to suggest."""


def dispatch_lines(report) -> List[str]:
    """Lines of a dynamic :class:`~relax_memplan.report.CompileReport` on its specialized
    kernels (:attr:`specialized`: kernel -> dim -> values), none without them."""
    if not report.specialized:
        return []
    names = sorted(report.specialized)
    lines = [f"  kernels specialized: {len(names)} (" + ", ".join(names[:6])
             + (", ..." if len(names) > 6 else "") + ")"]
    lines += [f"    at {_dims_text(s.dims)}: {' + '.join(s.kernel_paths or ['generic'])} kernels"
              for s in report.shapes]
    return lines + _unexercised_lines(report)


def _dims_text(dims) -> str:
    return ", ".join(f"{k}={v}" for k, v in dims.items())


def _versions(report) -> List[str]:
    """Every specialized version, spelled as the rows' ``kernel_paths`` are (``"seq=64"``,
    ``"b=2,seq=64"``), in first-seen order."""
    versions = {}
    for per_dim in report.specialized.values():
        for values in itertools.product(*per_dim.values()):
            versions[",".join(f"{d}={v}" for d, v in zip(per_dim, values))] = None
    return list(versions)


def _unexercised_lines(report) -> List[str]:
    """One line naming the specialized versions no sampled shape ran: not verified
    (``--verify``) or not run, what was sampled, and what to type to run every shape when the
    ranges are small (review: a version no sample hit went unmentioned)."""
    ran = [s for s in report.shapes if s.runtime_alloc_bytes is not None]
    if not ran:  # nothing ran (--no-measure, a cuda build): the notes say so
        return []
    verified = any(s.verified is not None for s in ran)
    seen = {path for s in ran for path in s.kernel_paths or ()}
    missing = [v for v in _versions(report) if v not in seen]
    if not missing:
        return []
    total = 1
    for r in report.dims.values():
        total *= len(DimRange(*r).values()) if r[1] is not None else FULL_GRID_LIMIT + 1
    sampled = "; ".join(_dims_text(s.dims) for s in ran)
    how = (f"--sample-shapes {total} runs every shape in range" if total <= FULL_GRID_LIMIT
           else "no option picks the shapes to run; a --dim range ending at a value runs it "
                "(the ends always run)")
    them = "it" if len(missing) == 1 else "them"
    return [f"  specialized {', '.join(missing)}: {'not verified' if verified else 'not run'}, "
            f"no sampled shape falls on {them} (sampled: {sampled}); {how}"]
