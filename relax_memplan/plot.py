"""Draw an arena plan: each tensor a rectangle over its live range (x, program steps) and bytes (y).

Needs matplotlib (``pip install relax_memplan[plot]``).
"""

from __future__ import annotations

from pathlib import Path

from .errors import RelaxMemplanError

__all__ = ["plot_plan"]


def plot_plan(function_plan, path, title: str = "") -> Path:
    """Save a picture of a :class:`~relax_memplan.transform.plan_static_memory.FunctionPlan`.

    Parameters
    ----------
    function_plan : FunctionPlan
        From ``PlanStaticMemory.plans[name]`` after the pass ran.
    path : str or Path
        Output image (format from the suffix, e.g. ``.png``, ``.svg``).
    title : str
        Title prefix.

    Returns
    -------
    Path
        The written file.

    Raises
    ------
    RelaxMemplanError
        If matplotlib is not installed.
    """
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
        from matplotlib.patches import Rectangle
    except ImportError:
        raise RelaxMemplanError("--plot needs matplotlib: pip install matplotlib") from None

    tensors = {t.uid: t for t in function_plan.liveness.tensors}
    arenas = function_plan.arenas
    fig, axes = plt.subplots(len(arenas) or 1, 1, figsize=(11, 4.5 * max(len(arenas), 1)), squeeze=False)
    cmap = plt.get_cmap("tab20")
    for ax, arena in zip(axes[:, 0], arenas):
        steps = 1
        for k, (uid, offset) in enumerate(sorted(arena.offsets.items(), key=lambda kv: kv[1])):
            t = tensors[uid]
            ax.add_patch(Rectangle((t.start, offset / 1024), t.end - t.start, t.size_bytes / 1024,
                                   facecolor=cmap(k % 20), edgecolor="black", linewidth=0.3))
            steps = max(steps, t.end)
        ax.axhline(arena.lower_bound_bytes / 1024, color="red", linestyle="--",
                   label=f"lower bound {arena.lower_bound_bytes:,} B")
        ax.axhline(arena.arena_bytes / 1024, color="black", linestyle=":",
                   label=f"arena {arena.arena_bytes:,} B")
        ax.set_xlim(0, steps)
        ax.set_ylim(0, max(arena.arena_bytes, 1) / 1024 * 1.05)
        ax.set_xlabel("program step")
        ax.set_ylabel("offset (KiB)")
        ax.set_title(f"{title} {function_plan.name}: device {arena.device_index}, "
                     f"{len(arena.offsets)} tensors, {arena.algorithm}".strip())
        ax.legend(loc="upper right")
    fig.tight_layout()
    out = Path(path)
    out.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(out, dpi=110)
    plt.close(fig)
    return out
