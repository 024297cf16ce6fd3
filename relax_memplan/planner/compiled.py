"""The compiled skyline sweep: when to use it, how to warm it up, and its Python driver.

:func:`compiled_sweep` gives the same plan as
:func:`~relax_memplan.planner.skyline.lowest_first_sweep` (offsets, height and order) with
the loop in numba (:mod:`._sweep_jit`): random 100k buffers, one pass by area with the
problem built, 1.09-1.20 s CPU in Python, 0.20-0.22 s compiled (``benchmarks/planner_bench.py``).
The Python sweep stays: it is the reference of the tests and runs whenever the compiled one
is not ready. Where a pipeline runs it: inside :func:`~relax_memplan.planner.plan` (and
:meth:`Problem.lowest_first <relax_memplan.planner.placement.Problem.lowest_first>`, which
the window repair and the improvement search call) on the large-graph (skyline) path only;
it reads and writes no function attributes (the planner does not import TVM).

The budget is a promise, so the first use is never charged to a ``time_limit_s`` silently.
Importing numba costs about half a second and compiling the sweep a few seconds (cold
cache); loading it from numba's on-disk cache (``__pycache__`` next to this module, or
``NUMBA_CACHE_DIR``) 0.1-0.3 s. :func:`choose_sweep`, called by
:func:`~relax_memplan.planner.plan` before its first skyline pass:

* uses the compiled sweep when it is already loaded in this process (:func:`warm_up`);
* otherwise loads it from the cache, never compiling, only when the time left covers the
  measured import and load (``IMPORT_SECONDS``, ``CACHE_LOAD_SECONDS``, times the wall/CPU
  slowdown) plus a compiled pass, and the saving on one pass pays for it; a cache miss
  costs the import only (the Python sweep then runs in the time left, deadline-aware);
* else runs the Python sweep, and says why in ``Plan.sweep`` / ``Plan.sweep_reason``.

:func:`warm_up` imports numba and loads or compiles the sweep, outside any budget; call it
once before timing (``benchmarks/planner_bench.py`` does). Without numba (ImportError)
everything runs in Python. The cache lookup without compiling uses numba's dispatcher
internals (``_cache.load_overload``); a numba without them counts as a cold cache.
"""

from __future__ import annotations

import importlib
import sys
import time
from typing import Optional, Sequence

import numpy as np

from . import skyline
from .candidates import StartIndex
from .skyline import CLOCK_EVERY, COMPACT_SHARE, _lanes_for_rest, rank_of

__all__ = ["warm_up", "choose_sweep", "compiled_sweep", "sweep_state", "fits_int64",
           "PYTHON", "NUMBA"]

PYTHON, NUMBA = "python", "numba"
#: Heap pops per call into the compiled loop between two looks at the clock (about
#: ``CLOCK_EVERY`` pops of the Python sweep take as long as this many compiled ones).
JIT_STEPS = 16 * CLOCK_EVERY
#: Measured costs of the first use in a fresh process (2-core machine shared, load 3.3-4;
#: two runs, NUMBA_CACHE_DIR a fresh folder): ``import numba`` 0.32-0.49 s wall (0.22-0.23
#: CPU); loading the sweep from a warm cache 0.12-0.28 s wall (0.12-0.14 CPU); compiling
#: it (cold cache) 2.6-4.3 s wall (1.8-2.1 CPU), which :func:`choose_sweep` never does.
IMPORT_SECONDS = 0.5
CACHE_LOAD_SECONDS = 0.3
#: Cost of one compiled pass, seconds per buffer (random 100k buffers by area: 0.11-0.14 s
#: CPU with the sort and the candidates, 0.07 s of it in the compiled loop; with the
#: problem built and the priority keys 0.22 s).
JIT_SECONDS_PER_BUFFER = 1.5e-6
#: Cost of dropping one buffer into the lanes at the end of a compiled pass (measured 0.85-
#: 0.91 us CPU per buffer for all of random 100k, load 3.5; the Python sweep keeps its
#: ``skyline.DROP_SECONDS_PER_BUFFER`` of 2 us, which made a compiled pass with 0.24 s left
#: for 100k buffers drop them all, 1.32 x LB, where it finishes in about 0.15 s: 1.047).
JIT_DROP_SECONDS_PER_BUFFER = 1.2e-6

#: ``kernel``: the loaded numba dispatcher; ``error``: why numba is not usable (None
#: while untried); ``cold``: the cache held no compiled sweep when last looked at.
_STATE = {"kernel": None, "error": None, "cold": False, "module": None}


def _import():
    """The :mod:`._sweep_jit` module (imports numba), or None with ``_STATE["error"]`` set."""
    if _STATE["module"] is None and _STATE["error"] is None:
        try:
            _sweep_jit = importlib.import_module(f"{__package__}._sweep_jit")
        except ImportError as err:  # numba absent or broken: the Python sweep runs
            _STATE["error"] = f"numba not importable ({err})"
            return None
        _STATE["module"] = _sweep_jit
    return _STATE["module"]


def warm_up() -> dict:
    """Import numba and load the compiled sweep from numba's cache, compiling it on a miss.

    Call once before timing (a server at start-up, a benchmark, the CLI before planning):
    afterwards :func:`~relax_memplan.planner.plan` uses the compiled sweep on large graphs
    at no cost to its ``time_limit_s``. Compiling (cold cache) takes a few seconds of CPU
    and writes the cache (``__pycache__`` beside :mod:`._sweep_jit`, or
    ``NUMBA_CACHE_DIR``), so later processes only load it.

    Returns
    -------
    dict
        ``sweep`` (``"numba"``, or ``"python"`` when numba is not importable), ``reason``
        (why not numba, else ``""``), ``seconds`` (wall time of this call) and
        ``compiled`` (True if it compiled rather than loaded from the cache).
    """
    t0 = time.perf_counter()
    compiled = False
    module = _import()
    if module is not None and _STATE["kernel"] is None:
        kernel = module.sweep_steps
        kernel.compile(module.SIGNATURE)  # loads from the cache, else compiles
        compiled = sum(kernel.stats.cache_misses.values()) > 0
        _STATE["kernel"], _STATE["cold"] = kernel, False
    return {"sweep": NUMBA if _STATE["kernel"] is not None else PYTHON,
            "reason": _STATE["error"] or "", "seconds": time.perf_counter() - t0,
            "compiled": compiled}


def _load_cached() -> bool:
    """Load the compiled sweep from numba's cache without compiling; True if loaded."""
    module = _import()
    if module is None:
        return False
    kernel = module.sweep_steps
    try:  # numba's own cache lookup, without its fallback to compiling
        cres = kernel._cache.load_overload(module.SIGNATURE, kernel.targetctx)
    except (AttributeError, TypeError):  # a numba without this internal: treat as cold
        cres = None
    if cres is None:
        _STATE["cold"] = True
        return False
    kernel.add_overload(cres)
    _STATE["kernel"] = kernel
    return True


def sweep_state() -> str:
    """``"numba"`` if the compiled sweep is loaded in this process, else why not (or
    ``"python"`` when it was not tried yet)."""
    if _STATE["kernel"] is not None:
        return NUMBA
    return _STATE["error"] or ("numba cache cold" if _STATE["cold"] else PYTHON)


def fits_int64(p) -> bool:
    """Whether every offset and height of ``p`` fits in int64 (sizes plus alignments below
    2**62 bytes); beyond that only the Python sweep (Python ints) runs."""
    return p._size_np is not None and sum(p.size) + sum(p.align) < 1 << 62


def choose_sweep(p, left_s: float, slowdown: float = 1.0,
                 python_pass_s: float = 0.0) -> tuple[str, str]:
    """``(sweep, reason)``: ``"numba"`` or ``"python"`` for the skyline passes of ``p``.

    Parameters
    ----------
    p : Problem
        The compiled buffers.
    left_s : float
        Seconds left in the caller's budget before its first pass.
    slowdown : float
        Wall/CPU ratio measured so far (a busy machine stretches the first-use costs).
    python_pass_s : float
        Estimated seconds of one Python pass (idle machine): loading pays only if a
        compiled pass saves more than the load costs.

    Returns
    -------
    (str, str)
        The sweep to run and, for ``"python"``, why (``""`` for ``"numba"``). Loads the
        compiled sweep from the cache (never compiles) when the budget covers it; see
        the module docstring.
    """
    if not fits_int64(p):
        return PYTHON, "sizes beyond int64"
    if _STATE["kernel"] is not None:
        return NUMBA, ""
    if _STATE["error"] is not None:
        return PYTHON, _STATE["error"]
    if _STATE["cold"]:
        return PYTHON, sweep_state() + "; call relax_memplan.planner.warm_up()"
    first_use = (0.0 if "numba" in sys.modules else IMPORT_SECONDS) + CACHE_LOAD_SECONDS
    saving = python_pass_s - p.n * JIT_SECONDS_PER_BUFFER
    if (first_use + p.n * JIT_SECONDS_PER_BUFFER) * slowdown > left_s or saving < first_use:
        return PYTHON, ("compiled sweep not loaded: loading it does not fit the time left or "
                        "pay for itself here; call relax_memplan.planner.warm_up()")
    if _load_cached():
        return NUMBA, ""
    return PYTHON, sweep_state() + "; call relax_memplan.planner.warm_up()"


def compiled_sweep(
    p, priority: Sequence, deadline: Optional[float] = None, count: Optional[int] = None
) -> tuple[list[int], int, list[int], bool]:
    """:func:`~relax_memplan.planner.skyline.lowest_first_sweep` on the compiled loop.

    Same parameters, returns and plans (offsets in bytes per buffer index, height in
    bytes, placement order, whether no buffer was dropped into the lanes). Needs
    :func:`warm_up` or :func:`choose_sweep` to have loaded the compiled sweep, and
    :func:`fits_int64`.
    """
    n = p.n
    if n == 0:
        return [], 0, [], True
    kernel, mod = _STATE["kernel"], _STATE["module"]
    lo_np, hi_np, num_steps = p.step_arrays
    count = n if count is None else max(0, min(count, n))
    cands = StartIndex(lo_np, hi_np, rank_of(priority), num_steps, count, lists=False)
    st = mod.empty_state()
    st[[mod.COUNT, mod.N, mod.NUM_STEPS, mod.GONE, mod.HEAP_LEN, mod.SHIFT]] = (
        count, n, num_steps, cands.gone, 1, (n + 1).bit_length())
    segments = _segments(num_steps)
    # At most 3 pushes per buffer placed and 1 per segment raised (2n + 1 segments).
    heap_h = np.zeros(5 * n + 2 * num_steps + 16, np.int64)
    heap_a = np.zeros_like(heap_h)
    offsets, order = np.full(n, -1, np.int64), np.zeros(n, np.int64)
    fixed = (p._size_np, np.asarray(p.align, dtype=np.int64), *segments, heap_h, heap_a,
             offsets, order)
    started = time.perf_counter()
    st[mod.MAX_STEPS] = JIT_STEPS if deadline is not None else 1 << 62
    blocks = _blocks(st, cands, mod)
    while True:
        kernel(st, cands.index_np, cands.lo_np, cands.hi_np, blocks[0], cands.first_at_np,
               *blocks[1:], *fixed)
        placed = int(st[mod.PLACED])
        if placed >= st[mod.COUNT] or st[mod.HEAP_LEN] == 0:
            break
        if st[mod.CAND_PLACED] > st[mod.COMPACT_AT]:
            cands.compact()
            blocks = _blocks(st, cands, mod)
        if deadline is None:
            continue
        now = time.perf_counter()
        if skyline._must_drop(now, started, placed, n, deadline, JIT_DROP_SECONDS_PER_BUFFER):
            break
        keep = skyline._affordable(now, started, placed, int(st[mod.COUNT]), n, deadline,
                                   JIT_DROP_SECONDS_PER_BUFFER)
        if keep is not None:  # too slow to place them all: keep the smallest ranks
            keep = min(keep, int(st[mod.COUNT]) - placed)
            cands.restrict(keep)
            blocks = _blocks(st, cands, mod)
            st[mod.COUNT] = placed + keep
    return _finish(p, offsets, order, int(st[mod.PLACED]), int(st[mod.HEIGHT]))


def _segments(num_steps: int) -> tuple[np.ndarray, ...]:
    """``(seg_end, seg_h, seg_prev, alive)`` by first step: one segment ``[0, num_steps)``
    at height 0."""
    width = num_steps + 1
    seg_end, seg_h = np.zeros(width, np.int64), np.zeros(width, np.int64)
    seg_prev, alive = np.full(width, -1, np.int64), np.zeros(width, np.int64)
    seg_end[0], alive[0] = num_steps, 1
    return seg_end, seg_h, seg_prev, alive


def _blocks(st, cands: StartIndex, mod) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """The packed keys and block minima of the candidates
    (:func:`._sweep_jit.packed_candidates`), after they were built, compacted or
    restricted; resets the compaction count of ``st``."""
    st[mod.CAND_PLACED] = 0
    st[mod.COMPACT_AT] = int(COMPACT_SHARE * len(cands.rank_np)) + 64
    return mod.packed_candidates(cands.hi_np, cands.rank_np, int(st[mod.SHIFT]))


def _finish(p, offsets: np.ndarray, order: np.ndarray, placed: int, height: int):
    """``(offsets, height, order, finished)`` lists, the unplaced buffers in the lanes."""
    offsets_list, order_list = offsets.tolist(), order[:placed].tolist()
    if placed < p.n:
        height = _lanes_for_rest(p, offsets_list, order_list, height)
        return offsets_list, height, order_list, False
    return offsets_list, height, order_list, True
