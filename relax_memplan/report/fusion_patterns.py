"""The fusion report per pattern: candidates, fused, and each refusal with its reason.

Built from the :class:`~relax_memplan.transform.fusion_record.PatternRecord` every fusion pass
keeps (:func:`pattern_dicts`, the report's JSON ``fusion.patterns``), printed one line per
pattern (:func:`pattern_lines`: ``attention: 12 of 12 fused``, ``add+layer norm: 0 of 12 fused:
12 x left to FuseOps: ...``), and, with ``--explain-fusion``, one line per refused candidate
naming its Relax bindings and ONNX nodes (:func:`explain_lines`).
"""

from __future__ import annotations

from typing import Dict, List, Mapping

from ..transform.fusion_record import PatternRecord, Refusal, pattern_records

__all__ = ["PATTERN_LABELS", "pattern_dicts", "pattern_lines", "explain_lines"]

#: Pattern name -> its name in the text report.
PATTERN_LABELS = {"attention": "attention", "layer_norm": "layer norm (element-wise steps)",
                  "rms_norm": "RMS norm (element-wise steps)", "add_layer_norm": "add+layer norm",
                  "add_rms_norm": "add+RMS norm",
                  "feed_forward": "feed-forward", "conv_chain": "conv chains",
                  "dropout": "dropout", "matmul_reshape": "matmul reshapes"}


def pattern_dicts(passes) -> Dict[str, Dict]:
    """Pattern name -> ``{verb, candidates, fused, refused: [{reason, bindings, function,
    onnx_nodes}]}`` of a build's fusion passes (their last run), in pass order."""
    return {name: {"verb": r.verb, **r.to_dict()} for name, r in pattern_records(passes).items()}


def _record(name: str, entry: Mapping) -> PatternRecord:
    record = PatternRecord(name, entry.get("verb", "fused"), int(entry["candidates"]),
                           int(entry["fused"]))
    record.refused = [Refusal(r["reason"], tuple(r.get("bindings", ())), r.get("function", ""),
                              tuple(r.get("onnx_nodes", ()))) for r in entry.get("refused", [])]
    return record


def pattern_lines(patterns: Mapping[str, Mapping], off=(), indent: str = "    ") -> List[str]:
    """One line per pattern: ``attention: 12 of 12 fused``, ``attention: 0 of 12 fused: 12 x
    <reason>``, ``dropout: none found``; ``off``: patterns turned off (``conv chains: off``)."""
    lines = [f"{indent}{PATTERN_LABELS.get(n, n)}: {_record(n, e).summary()}"
             for n, e in patterns.items()]
    return lines + [f"{indent}{PATTERN_LABELS.get(n, n)}: off" for n in off]


def explain_lines(patterns: Mapping[str, Mapping], indent: str = "  ") -> List[str]:
    """Each refused candidate: pattern, reason, function, bindings and ONNX nodes."""
    lines = []
    for name, entry in patterns.items():
        for r in _record(name, entry).refused:
            where = f" in {r.function}" if r.function else ""
            bindings = ", ".join(r.bindings) or "-"
            nodes = f"; ONNX {', '.join(r.onnx_nodes)}" if r.onnx_nodes else ""
            lines.append(f"{indent}{PATTERN_LABELS.get(name, name)} refused{where}: {r.reason} "
                         f"(bindings {bindings}{nodes})")
    if not lines:
        lines.append(f"{indent}no candidate was refused")
    return lines
