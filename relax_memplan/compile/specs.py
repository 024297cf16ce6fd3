"""``--dim``, ``--bucket`` and ``--dispatch`` values: a dim's range or its values, from text.

Pure text, no TVM: the CLI parses its flags with these, the dim suggestions their ranges.
"""

from __future__ import annotations

from typing import Tuple

from ..errors import ShapeSpecError

__all__ = ["parse_dim_spec", "parse_values_spec"]


MAX_DIM = 2**31 - 1
"""Largest bound a dim spec may give: TVM indexes tensor elements with 32-bit integers unless
told otherwise, and no tensor of a model has a dim near it."""


def parse_dim_spec(text: str) -> Tuple[str, Tuple[int, ...]]:
    """``"seq=1..128"`` -> ``("seq", (1, 128))``; ``"seq=4.."`` -> ``("seq", (4, None))``; ``"seq=..8"`` -> ``("seq", (1, 8))``;
    ``"height=160..640:32"`` -> ``("height", (160, 640, 32))`` (only 160, 192, ..., 640).

    Raises
    ------
    ShapeSpecError
        Malformed text, bounds not integers, lower < 1, lower > upper, a bound above
        :data:`MAX_DIM` or step < 1.
    """
    name, sep, rng = text.rpartition("=")  # a dim may be named a=b
    rng, colon, step_text = rng.partition(":")
    lo, dots, hi = rng.partition("..")
    if not sep or not name.strip() or not dots or (colon and not step_text.strip()):
        raise ShapeSpecError(f"bad dim spec {text!r}: expected NAME=LO..HI or NAME=LO..HI:STEP, "
                             f"e.g. seq=1..128")
    try:
        lower = int(lo) if lo.strip() else 1
        upper = int(hi) if hi.strip() else None
        step = int(step_text) if colon else 1
    except ValueError:
        raise ShapeSpecError(f"bad dim spec {text!r}: bounds and step must be integers") from None
    if lower < 1 or (upper is not None and upper < lower):
        # a dim of 0 (zero-size tensors) is refused like --shape 0: the planner would skip
        # it, and most models (and onnxruntime) cannot run it
        raise ShapeSpecError(f"bad dim spec {text!r}: need 1 <= LO <= HI")
    if max(lower, upper or 0) > MAX_DIM:
        raise ShapeSpecError(f"bad dim spec {text!r}: bounds must be at most {MAX_DIM:,} "
                             f"(2**31 - 1: a dim is an index into a tensor)")
    if step < 1 or (step > 1 and upper is None):
        raise ShapeSpecError(f"bad dim spec {text!r}: a step must be >= 1 and needs HI")
    if (upper - lower) % step if step > 1 else False:
        below = lower + (upper - lower) // step * step
        # the values around HI that are on the grid: for 1..64:100 not "1..1:100" (one value)
        near = [f"{lower}..{v}:{step}" for v in (below, below + step) if v > lower]
        raise ShapeSpecError(f"bad dim spec {text!r}: HI must be LO + k * STEP (e.g. "
                             f"{' or '.join(near)})")
    return name.strip(), ((lower, upper, step) if step > 1 else (lower, upper))

def parse_values_spec(text: str, option: str = "--bucket") -> Tuple[str, Tuple[int, ...]]:
    """``"seq=64,128"`` -> ``("seq", (64, 128))`` (values of a dim: ``--bucket``, ``--dispatch``).

    Raises
    ------
    ShapeSpecError
        Malformed text, or a value below 1; the message names ``option`` and what is wrong
        (``--dispatch seq=0`` names ``--dispatch``, not ``--bucket``).
    """
    name, sep, rest = text.rpartition("=")
    try:
        values = tuple(sorted({int(v) for v in rest.split(",")}))
    except ValueError:
        values = ()
    if not sep or not name.strip() or not values:
        raise ShapeSpecError(f"{option} {text!r}: expected NAME=V1,V2,... with integers >= 1, "
                             f"e.g. seq=64,128")
    if min(values) < 1:
        raise ShapeSpecError(f"{option} {text!r}: values of {name.strip()} must be >= 1 "
                             f"(got {min(values)})")
    return name.strip(), values
