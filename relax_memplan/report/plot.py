"""Draw an arena plan: each tensor a rectangle over its live range (x, program steps) and its
bytes in the arena (y), the largest ones labelled, and under it the live bytes at each step
against the arena and the lower bound (:func:`plot_plan`, fixed shapes). With symbolic dims,
the per-shape bytes chart (:func:`plot_shapes`): lower bound, our arena per strategy and the
bytes each build allocated, against the sampled shapes.

Needs matplotlib (``pip install relax_memplan[plot]``).
"""

from __future__ import annotations

import os
import textwrap
from pathlib import Path
from typing import Dict, List, Mapping, Optional, Sequence, Tuple

from ..errors import RelaxMemplanError
from ..planner.buffer import union_bytes

__all__ = ["plot_plan", "plot_shapes", "shape_series", "live_bytes_per_step", "arena_live_bytes",
           "byte_unit"]

LABELLED_TENSORS = 8
"""How many of the largest tensors of an arena get a label."""

_CHAR_PX, _LINE_PX = 5.6, 11.0
"""Rough width of a character and height of a line of the 7-point labels at 100 dpi."""
_ARENA_STYLE = dict(color="black", linewidth=4.0, alpha=0.35, solid_capstyle="butt")
_LOWER_BOUND_STYLE = dict(color="red", linewidth=1.4, linestyle=(0, (5, 3)))


def byte_unit(max_bytes: int) -> Tuple[str, int]:
    """The unit for a picture whose largest value is ``max_bytes``: ``("MiB", 2**20)`` from
    4 MiB up, else ``("KiB", 1024)``."""
    return ("MiB", 1 << 20) if max_bytes >= 4 << 20 else ("KiB", 1 << 10)


def live_bytes_per_step(tensors: Sequence, num_steps: int,
                        offsets: Optional[Sequence[int]] = None) -> List[int]:
    """Bytes of ``tensors`` live at each step ``0 .. num_steps - 1`` (half-open live ranges
    ``[start, end)``, sizes ``size_bytes``); with ``offsets`` (one per tensor, one arena), the
    bytes their ranges cover, so tensors placed inside one another (concatenation inputs in
    their output, in-place chains) count once."""
    if offsets is not None:
        return [union_bytes((o, t.size_bytes) for t, o in zip(tensors, offsets)
                            if t.start <= step < t.end) for step in range(num_steps)]
    delta = [0] * (num_steps + 1)
    for t in tensors:
        delta[max(t.start, 0)] += t.size_bytes
        delta[min(t.end, num_steps)] -= t.size_bytes
    live, total = [], 0
    for step in range(num_steps):
        total += delta[step]
        live.append(total)
    return live


def plot_plan(function_plan, path, title: str = "") -> Path:
    """Save a picture of a :class:`~relax_memplan.transform.plan_static_memory.FunctionPlan`.

    Per arena, two panels over the same program steps: the layout (each tensor a rectangle,
    the :data:`LABELLED_TENSORS` largest labelled with name, kernel and size) and the live
    bytes at each step. Both show the arena size (thick grey line) and the lower bound
    (dashed red line, drawn over it, so both stay visible when they are equal). One unit
    (KiB or MiB, :func:`byte_unit`) throughout.

    Parameters
    ----------
    function_plan : FunctionPlan
        From ``PlanStaticMemory.plans[name]`` after the pass ran.
    path : str or Path
        Output image (format from the suffix, e.g. ``.png``, ``.svg``).
    title : str
        Title prefix (e.g. the model name).

    Returns
    -------
    Path
        The written file.

    Raises
    ------
    RelaxMemplanError
        If matplotlib is not installed.
    """
    plt = _pyplot()
    tensors = {t.uid: t for t in function_plan.liveness.tensors}
    arenas = function_plan.arenas
    rows = max(len(arenas), 1)
    fig, axes = plt.subplots(2 * rows, 1, figsize=(12, 6.2 * rows), squeeze=False,
                             gridspec_kw={"height_ratios": [3, 1.2] * rows})
    if not arenas:
        axes[0, 0].text(0.5, 0.5, f"{function_plan.name}: nothing placed in an arena"
                        f" ({function_plan.fallback_reason or 'no planned tensors'})",
                        ha="center", va="center", transform=axes[0, 0].transAxes)
        axes[0, 0].set_axis_off()
        axes[1, 0].set_axis_off()
    for k, arena in enumerate(arenas):
        placed = [(tensors[uid], offset) for uid, offset in arena.offsets.items()]
        steps = max([function_plan.liveness.num_steps] + [t.end for t, _ in placed])
        unit, scale = byte_unit(arena.arena_bytes)
        layout, live = axes[2 * k, 0], axes[2 * k + 1, 0]
        _draw_layout(layout, placed, arena, unit, scale, steps, plt.get_cmap("tab20"))
        layout.set_title(_fit_title(f"{_short_name(title)} {function_plan.name}: device "
                                    f"{arena.device_index}, {len(placed)} tensors in one arena "
                                    f"({arena.algorithm})"))
        _draw_live_bytes(live, function_plan, arena, unit, scale, steps)
    fig.tight_layout()
    for k, arena in enumerate(arenas):  # after the layout: labels are fitted in pixels
        placed = sorted(((tensors[uid], offset) for uid, offset in arena.offsets.items()),
                        key=lambda p: -p[0].size_bytes)
        unit, scale = byte_unit(arena.arena_bytes)
        for t, offset in placed[:LABELLED_TENSORS]:
            _label(axes[2 * k, 0], t, offset, unit, scale)
    return _save(plt, fig, path)


def _short_name(title: str) -> str:
    """A model path as its file name (a long folder cut the title off the figure)."""
    return os.path.basename(title) if os.sep in title else title


def _fit_title(text: str, width: int = 70) -> str:
    """``text`` stripped and wrapped to lines of at most ``width`` characters."""
    return textwrap.fill(text.strip(), width)


def _save(plt, fig, path) -> Path:
    """Write ``fig`` to ``path`` (parent folders created, 100 dpi) and close it."""
    out = Path(path)
    out.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(out, dpi=100)
    plt.close(fig)
    return out


def _pyplot():
    """matplotlib.pyplot on the Agg backend (files only)."""
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        raise RelaxMemplanError("--plot needs matplotlib: pip install matplotlib") from None
    return plt


def shape_series(reports: Mapping[str, object]) -> Tuple[List[Dict[str, int]], Dict[str, List]]:
    """The per-shape bytes chart's data: the sampled shapes in increasing order of their dims,
    and each series over them, in bytes (``None`` where not measured).

    Parameters
    ----------
    reports : mapping of str to CompileReport
        One per strategy, with rows at the same shapes (``compile_strategies``).

    Returns
    -------
    (list of dict, dict of str to list)
        The dims of each shape, and ``"lower bound"``, ``"arena (<strategy>)"``, ``"our
        build, run (<strategy>)"`` and ``"TVM default build, run"``; the run series only
        where some shape ran, no arena series for a strategy whose plan placed nothing
        (``not_planned_reason``), no lower bound when none placed anything.
    """
    first = next(iter(reports.values()))
    order = sorted(range(len(first.shapes)), key=lambda k: tuple(first.shapes[k].dims.values()))
    planned = {n: r for n, r in reports.items() if r.not_planned_reason is None}
    series: Dict[str, List] = {}
    if planned:
        lower = next(iter(planned.values()))
        series["lower bound"] = [lower.shapes[k].lower_bound_bytes for k in order]
    for name, report in planned.items():
        series[f"arena ({name})"] = [report.shapes[k].arena_bytes for k in order]
    for name, report in reports.items():
        run = [report.shapes[k].runtime_alloc_bytes for k in order]
        if any(v is not None for v in run):
            series[f"our build, run ({name})"] = run
    tvm_run = [first.shapes[k].tvm_default_runtime_alloc_bytes for k in order]
    if any(v is not None for v in tvm_run):
        series["TVM default build, run"] = tvm_run
    return [dict(first.shapes[k].dims) for k in order], series


_SERIES_STYLE = {"lower bound": dict(color="red", linestyle=(0, (5, 3)), marker="_"),
                 "TVM default build, run": dict(color="black", marker="s")}


def plot_shapes(reports: Mapping[str, object], path, title: str = "") -> Path:
    """Save the per-shape bytes chart of a build with symbolic dims: at each sampled shape
    (x, in increasing order), the lower bound, our arena (one line per strategy), and, where
    the builds ran, the bytes our build and TVM's default build allocated per call (naive VM
    allocator, outputs included). One unit (KiB or MiB) throughout.

    Parameters
    ----------
    reports : mapping of str to CompileReport
        By strategy (``{"exact": report}`` for one), rows at the same shapes.
    path : str or Path
        Output image (format from the suffix).
    title : str
        Title prefix (e.g. the model name).

    Returns
    -------
    Path
        The image written.

    Raises
    ------
    RelaxMemplanError
        matplotlib is missing (``pip install relax_memplan[plot]``).
    """
    plt = _pyplot()
    dims, series = shape_series(reports)
    peak = max((v for values in series.values() for v in values if v is not None), default=0)
    unit, scale = byte_unit(peak)
    fig, ax = plt.subplots(figsize=(max(6.0, 1.1 * len(dims) + 4), 4.8))
    xs = list(range(len(dims)))
    for label, values in series.items():
        points = [(x, v / scale) for x, v in zip(xs, values) if v is not None]
        style = _SERIES_STYLE.get(label, dict(marker="o" if label.startswith("arena") else "^"))
        ax.plot([p[0] for p in points], [p[1] for p in points], label=label, linewidth=1.4,
                **style)
    ax.set_xticks(xs, ["\n".join(f"{n}={v}" for n, v in d.items()) for d in dims], fontsize=8)
    ax.set_xlabel("sampled shape")
    ax.set_ylabel(f"bytes per call ({unit})")
    ax.set_ylim(0, max(peak, 1) / scale * 1.1)
    ran = any(label.startswith("our build, run") for label in series)
    ax.set_title(_fit_title(f"{_short_name(title)} memory per shape"
                            f"{'' if ran else ' (not run: the plan only)'}"),
                 fontsize=10)
    ax.legend(loc="upper left", bbox_to_anchor=(1.005, 1.0), fontsize=8, frameon=False)
    fig.tight_layout()
    return _save(plt, fig, path)


def _bound_lines(ax, arena, unit: str, scale: int):
    """The arena and lower-bound lines with their values in the legend."""
    same = " (= lower bound)" if arena.arena_bytes == arena.lower_bound_bytes else ""
    ax.axhline(arena.arena_bytes / scale, label=f"arena {arena.arena_bytes / scale:,.1f} {unit}{same}",
               **_ARENA_STYLE)
    ax.axhline(arena.lower_bound_bytes / scale,
               label=f"lower bound {arena.lower_bound_bytes / scale:,.1f} {unit}", **_LOWER_BOUND_STYLE)


def _draw_layout(ax, placed, arena, unit: str, scale: int, steps: int, cmap) -> None:
    from matplotlib.patches import Rectangle

    largest = {t.uid for t, _ in sorted(placed, key=lambda p: -p[0].size_bytes)[:LABELLED_TENSORS]}
    # the largest drawn opaque; their labels are added by _label once the figure is laid out
    for k, (t, offset) in enumerate(sorted(placed, key=lambda p: (p[0].start, p[1]))):
        ax.add_patch(Rectangle((t.start, offset / scale), t.end - t.start, t.size_bytes / scale,
                               facecolor=cmap(k % 20), edgecolor="black", linewidth=0.4,
                               alpha=0.9 if t.uid in largest else 0.45))
    ax.set_xlim(0, steps)
    ax.set_ylim(0, max(arena.arena_bytes, 1) / scale * 1.08)
    _bound_lines(ax, arena, unit, scale)
    ax.set_ylabel(f"offset in the arena ({unit})")
    ax.legend(loc="upper left", bbox_to_anchor=(1.005, 1.0), fontsize=8, frameon=False)


def _label(ax, t, offset: int, unit: str, scale: int) -> None:
    """Name, size and kernel of a tensor inside its rectangle: across it when it is wide
    enough, along it when it is tall enough, the kernel dropped when neither fits."""
    (x0, y0), (x1, y1) = ax.transData.transform([(t.start, offset / scale),
                                                 (t.end, (offset + t.size_bytes) / scale)])
    width_px, height_px = abs(x1 - x0), abs(y1 - y0)
    kernel = (t.producer or "").removeprefix("fused_")
    size = f"{t.size_bytes / scale:,.0f} {unit}"
    head = f"{t.name} {size}"
    for lines in ([head, kernel] if kernel else [head], [head], [t.name, size], [t.name]):
        text_px = max(len(line) for line in lines) * _CHAR_PX + 6
        tall_px = len(lines) * _LINE_PX
        rotation = (0 if text_px <= width_px and tall_px <= height_px else
                    90 if text_px <= height_px and tall_px <= width_px else None)
        if rotation is not None:
            ax.text((t.start + t.end) / 2, (offset + t.size_bytes / 2) / scale, "\n".join(lines),
                    ha="center", va="center", fontsize=7, rotation=rotation, clip_on=True)
            return


def arena_live_bytes(function_plan, arena, num_steps: int) -> List[int]:
    """Bytes of ``arena`` holding storage at each step ``0 .. num_steps - 1``, by the lower
    bound's rule: a placement group's root (a concatenation's output holding its inputs, an
    in-place chain) holds the group's bytes over the group's span
    (:func:`~relax_memplan.report.summary.storage_buffers`), so the peak is
    ``arena.unaligned_lower_bound_bytes`` (exact sizes, the line the report's peak rows add
    up to).

    A concat output counted only over its own live range would put yolov8n's curve's peak at
    1,900 KiB, below its 2,000 KiB lower bound."""
    from .summary import storage_buffers

    return live_bytes_per_step(storage_buffers(function_plan, arena), num_steps)


def _draw_live_bytes(ax, function_plan, arena, unit: str, scale: int, steps: int) -> None:
    live = arena_live_bytes(function_plan, arena, steps)
    xs = list(range(steps + 1))
    ys = [b / scale for b in live] + [live[-1] / scale if live else 0]
    ax.fill_between(xs, ys, step="post", color="#1f77b4", alpha=0.25)
    ax.step(xs, ys, where="post", color="#1f77b4", linewidth=1.2,
            label=f"live bytes (peak {max(live, default=0) / scale:,.1f} {unit}, unaligned)")
    _bound_lines(ax, arena, unit, scale)
    ax.set_xlim(0, steps)
    ax.set_ylim(0, max(arena.arena_bytes, 1) / scale * 1.12)
    ax.set_xlabel("program step")
    ax.set_ylabel(f"live ({unit})")
    ax.legend(loc="upper left", bbox_to_anchor=(1.005, 1.0), fontsize=8, frameon=False)
