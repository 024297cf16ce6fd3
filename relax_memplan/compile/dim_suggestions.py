"""The ``--dim`` ranges the tool suggests, checked as compile checks a declared range.

One source for every suggestion (``inspect``, the "not declared" warning, the "missing --dim"
error, :func:`missing_dims_advice`):
:func:`~relax_memplan.frontend.suggested_ranges.suggest_dim_ranges` proposes ranges from the ONNX
graph (names, the image grid); :func:`checked_dim_ranges` then imports the model with
symbolic dims and runs the checks compile runs on declared ranges before building
(:func:`~relax_memplan.compile.shape_casts.check_shape_casts`, then
:class:`~relax_memplan.transform.CheckIndexBounds` on the module annotated by
:class:`~relax_memplan.transform.AnnotateDimRanges`). A range refused there is moved up its
grid to the smallest lower end that passes (silero's ``sequence=1..128`` is refused: its
frame count ``(sequence - 192) // 512 + 1`` needs ``sequence >= 192``).
"""

from __future__ import annotations

from typing import Dict, Mapping, Optional, Sequence

from ..analysis.dims import DimRange
from ..errors import RelaxMemplanError
from ..frontend.flags import dim_flag, tvm_dim_name
from ..frontend.suggested_ranges import dim_locations, suggest_dim_range, suggest_dim_ranges
from .specs import parse_dim_spec

__all__ = ["check_dim_ranges", "checked_dim_ranges", "missing_dims_advice", "range_text"]

_PROBE_LIMIT = 1 << 20
"""Largest lower end tried when moving a refused range up (elements)."""


def range_text(dim_range: DimRange) -> str:
    """``1..128``, ``32..320:32`` (the ``--dim`` value of a range)."""
    step = f":{dim_range.step}" if dim_range.step > 1 else ""
    return f"{dim_range.lower}..{'' if dim_range.upper is None else dim_range.upper}{step}"


def check_dim_ranges(mod, ranges: Mapping[str, tuple]) -> None:
    """Compile's checks of declared dim ranges on the imported module, without building.

    Parameters
    ----------
    mod : tvm.IRModule
        The model as imported with symbolic dims (module dim names).
    ranges : mapping of str to (int, int or None[, int])
        Range per module dim name, in elements.

    Raises
    ------
    ShapeSpecError
        A value the model's shape casts reject.
    IndexBoundsError
        An index that certainly leaves its tensor at a value of the ranges.
    """
    from ..transform import AnnotateDimRanges, CheckIndexBounds
    from .shape_casts import check_shape_casts

    check_shape_casts(mod, ranges)
    check = CheckIndexBounds(runtime_checks=False)
    try:
        check(AnnotateDimRanges(ranges)(mod))
    except Exception:  # noqa: BLE001 - TVM's pass machinery wraps the error; we keep ours
        if check.refused is None:
            raise
        raise check.refused from None


def _extents_positive(mod, dims: Mapping[str, int]) -> bool:
    """Every tensor bound in the module has extents >= 1 at ``dims`` (module dim names).

    A conv over fewer samples than its kernel has an output extent <= 0 at such a value
    (openwakeword's melspectrogram below 512 samples): the range checks do not see it, the
    run fails (onnxruntime: "Invalid input shape"), so a suggestion must not start there.
    An extent that does not evaluate (a data-dependent dim) counts as positive.
    """
    from tvm import relax

    from ..analysis.dims import evaluate_int

    extents = []

    def visit(expr):
        ty = getattr(expr, "ty", None)
        if isinstance(ty, relax.TensorType) and isinstance(ty.shape, relax.ShapeExpr):
            extents.extend(ty.shape.values)

    for function in mod.functions.values():
        if isinstance(function, relax.Function):
            relax.analysis.post_order_visit(function, visit)
    for extent in extents:
        try:
            if evaluate_int(extent, dims) < 1:
                return False
        except (ValueError, TypeError, ZeroDivisionError):
            continue
    return True


def _passes(mod, ranges: Mapping[str, DimRange]) -> bool:
    """The checks pass on the ranges and with every dim at its lower end (CheckIndexBounds
    tries the upper ends: an index valid only for large dims, silero's frame count, is
    refused at the lower ends only), and no tensor is empty or negative there."""
    lower_ends = {n: (r.lower, r.lower) for n, r in ranges.items()}
    try:
        check_dim_ranges(mod, {n: (r.lower, r.upper, r.step) for n, r in ranges.items()})
        check_dim_ranges(mod, lower_ends)
    except RelaxMemplanError:
        return False
    return _extents_positive(mod, {n: r.lower for n, r in ranges.items()})


def _moved_up(mod, ranges: Dict[str, DimRange], name: str) -> Optional[DimRange]:
    """``ranges[name]`` moved up its grid (same width) to the smallest lower end that passes,
    found by doubling the number of steps then bisection; None if none up to the limit."""
    r = ranges[name]
    width = (r.upper - r.lower) if r.upper is not None else None

    def at(k: int) -> DimRange:
        lower = r.lower + k * r.step
        return DimRange(lower, None if width is None else lower + width, r.step)

    def ok(k: int) -> bool:
        return _passes(mod, {**ranges, name: at(k)})

    good = 1
    while not ok(good):
        if r.lower + good * r.step > _PROBE_LIMIT:
            return None
        good *= 2
    bad = good // 2
    while good - bad > 1:
        mid = (good + bad) // 2
        good, bad = (mid, bad) if ok(mid) else (good, mid)
    return at(good)


def checked_dim_ranges(onnx_model, input_dims: Mapping[str, Optional[Sequence]],
                       names: Optional[Sequence[str]] = None) -> Dict[str, str]:
    """The suggested ``--dim`` range text per symbolic dim (ONNX names), each passing
    compile's up-front checks.

    Parameters
    ----------
    onnx_model : onnx.ModelProto
    input_dims : mapping of str to sequence of (int or str), or None
        Each input's dims (a name per symbolic dim), by input name.
    names : sequence of str, optional
        The dims to suggest ranges for; default every symbolic dim.

    Returns
    -------
    dict of str to str
        ``{"sequence": "192..319"}``. When the model does not import with symbolic dims,
        the graph's suggestions unchecked (compile then says why it cannot import).
    """
    from .. import frontend
    from ..frontend.prepare import STEP_NAMES

    graph_ranges = suggest_dim_ranges(input_dims, onnx_model.graph)
    wanted = list(names) if names is not None else list(graph_ranges)
    texts = {n: graph_ranges.get(n) or suggest_dim_range(n) for n in wanted}
    try:
        mod, _ = frontend.import_onnx(onnx_model, {}, keep_dynamic=True, prepare_steps=STEP_NAMES)
    except Exception:  # noqa: BLE001 - any import failure: compile reports it itself
        return texts
    ranges = {tvm_dim_name(n): DimRange(*parse_dim_spec(f"x={t}")[1])
              for n, t in {**graph_ranges, **texts}.items()}
    for name in texts:
        key = tvm_dim_name(name)
        if not _passes(mod, ranges):
            moved = _moved_up(mod, ranges, key)
            if moved is not None:
                ranges[key] = moved
                texts[name] = range_text(moved)
    return texts


def missing_dims_advice(missing: Sequence[str], input_dims: Mapping[str, Optional[Sequence]],
                        graph=None, model=None) -> str:
    """What to type for symbolic dims given no ``--dim`` range: ``"missing --dim for s27 (axis 1
    of input_ids); add --dim s27=1..64 (placeholder range: ...), or --dim s27=1..1 to keep it
    fixed"``. Ranges as ``inspect`` suggests them with the ONNX ``model``
    (:func:`checked_dim_ranges`), else from :func:`suggest_dim_ranges` (the model's grid) with
    ``graph``, else by name; the fixed value is the range's lower end (an image side on a
    stride-32 grid: 32)."""
    where = dim_locations(input_dims)
    if model is not None:
        ranges = checked_dim_ranges(model, input_dims, missing)
    else:
        ranges = suggest_dim_ranges(input_dims, graph) if graph is not None else {}
    ranges = {n: ranges.get(n) or suggest_dim_range(n) for n in missing}
    them = "it" if len(missing) == 1 else "them"
    keep = " ".join(dim_flag(n, f"{r.split('..')[0]}..{r.split('..')[0]}") for n, r in ranges.items())
    return ("missing --dim for "
            + ", ".join(f"{n} ({where[n]})" if n in where else n for n in missing)
            + f"; add {' '.join(dim_flag(n, r) for n, r in ranges.items())} (placeholder "
            f"range{'s' if len(missing) > 1 else ''}: set {them} to the values you will run), "
            f"or {keep} to keep {them} fixed")
