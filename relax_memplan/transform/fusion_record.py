"""What a fusion pass found, fused and refused: the record every fusion pass keeps.

A fusion pass looks at *candidates* (every place its pattern could apply: each softmax that
feeds a matmul for attention, each ``layer_norm(add(..))``, each strided conv...), fuses some
and refuses the others, each refusal with its reason in words and the Relax bindings it was
about. The passes keep one :class:`PatternRecord` per pattern (attribute ``records``), filled
by the last run; :func:`pattern_records` collects those of a build's passes, and the report
prints them (``attention: 12 of 12 fused``; ``attention: 0 of 12 fused: 12 x mask (1, 12, 1,
128) widens the scores (1, 1, 128, 128)``) and lists each refusal with ``--explain-fusion``.

``onnx_nodes``: the ONNX nodes of a refusal's bindings, where the function carries the
importer's record (``relax_memplan.onnx_nodes``, :mod:`relax_memplan.analysis.onnx_nodes`).
"""

from __future__ import annotations

from collections import Counter
from dataclasses import asdict, dataclass, field
from typing import Dict, Iterable, List, Optional, Sequence, Tuple

from tvm import relax

from ..analysis.onnx_nodes import ONNX_NODES_ATTR, describe_node

__all__ = ["Refusal", "PatternRecord", "RefusalLog", "pattern_records", "onnx_nodes_of"]


@dataclass(frozen=True)
class Refusal:
    """One candidate not fused: why (``reason``, words), where (``bindings``: Relax var names
    of ``function``; ``onnx_nodes``: their ONNX nodes where known)."""

    reason: str
    bindings: Tuple[str, ...] = ()
    function: str = ""
    onnx_nodes: Tuple[str, ...] = ()

    def to_dict(self) -> Dict:
        return {k: list(v) if isinstance(v, tuple) else v for k, v in asdict(self).items()}


@dataclass
class PatternRecord:
    """Candidates, fused and refused of one pattern in one run of a pass.

    Attributes
    ----------
    name : str
        The pattern (``attention``, ``add_layer_norm``, ``conv_chain``...).
    verb : str
        What fusing it is called in words (``fused``, ``removed``, ``chunked``).
    candidates : int
        Places the pattern was looked for and found in a form the pass recognizes.
    fused : int
        Candidates rewritten.
    refused : list of Refusal
        The others; ``candidates == fused + len(refused)``.
    """

    name: str
    verb: str = "fused"
    candidates: int = 0
    fused: int = 0
    refused: List[Refusal] = field(default_factory=list)

    def accept(self, n: int = 1) -> None:
        """``n`` candidates fused."""
        self.candidates += n
        self.fused += n

    def refuse(self, reason: str, bindings: Iterable[str] = (), func=None,
               function: str = "") -> None:
        """One candidate refused for ``reason``; ``func`` (the Relax function the bindings
        are in) gives their ONNX nodes."""
        names = tuple(str(b) for b in bindings)
        self.candidates += 1
        self.refused.append(Refusal(reason, names, function,
                                    onnx_nodes_of(func, names) if func is not None else ()))

    def reasons(self) -> Dict[str, int]:
        """Refusal reason -> count, most frequent first."""
        return dict(Counter(r.reason for r in self.refused).most_common())

    def summary(self) -> str:
        """``12 of 12 fused``; ``0 of 12 fused: 12 x <reason>``; ``none found``."""
        if not self.candidates:
            return "none found"
        why = "; ".join(f"{n} x {reason}" for reason, n in self.reasons().items())
        return f"{self.fused} of {self.candidates} {self.verb}" + (f": {why}" if why else "")

    def to_dict(self) -> Dict:
        return {"candidates": self.candidates, "fused": self.fused,
                "refused": [r.to_dict() for r in self.refused]}


class RefusalLog:
    """The refusals of a pass that counts them by reason code (``skipped["peak"]``): each
    with its bindings, turned into a :class:`PatternRecord` by :meth:`record`."""

    def __init__(self):
        self.entries: List[tuple] = []

    def refuse(self, code: str, bindings: Iterable[str] = (), n: int = 1, func=None,
               function: str = "") -> None:
        """``n`` candidates refused for ``code`` (all with these bindings)."""
        names = tuple(str(b) for b in bindings)
        nodes = onnx_nodes_of(func, names) if func is not None else ()
        self.entries += [(code, names, function, nodes)] * n

    def record(self, name: str, fused: int, words: Dict[str, str],
               verb: str = "fused") -> PatternRecord:
        """The record of ``fused`` rewrites and these refusals, reasons in ``words``."""
        out = PatternRecord(name, verb)
        out.accept(fused)
        for code, names, function, nodes in self.entries:
            out.candidates += 1
            out.refused.append(Refusal(words.get(code, code), names, function, nodes))
        return out


def onnx_nodes_of(func, names: Sequence[str]) -> Tuple[str, ...]:
    """The ONNX nodes (``Softmax node 'bert/Softmax'``) ``func``'s import recorded for the
    bindings named ``names``, in that order, each once; empty when it recorded none."""
    table = func.attrs.get(ONNX_NODES_ATTR) if isinstance(func, relax.Function) and \
        func.attrs is not None else None
    if table is None:
        return ()
    out = []
    for name in names:
        entry = table.get(name) if name in table else None
        if entry is None:
            continue
        label = describe_node(str(entry["onnx_op"]), str(entry["name"]), str(entry["output"]))
        if label not in out:
            out.append(label)
    return tuple(out)


def pattern_records(passes: Optional[Iterable]) -> Dict[str, PatternRecord]:
    """Pattern name -> record of the last run of each pass in ``passes`` that keeps
    ``records`` (a pass that did not run keeps empty ones), in pass order."""
    out: Dict[str, PatternRecord] = {}
    for p in passes or []:
        for record in getattr(p, "records", ()) or ():
            out[record.name] = record
    return out
