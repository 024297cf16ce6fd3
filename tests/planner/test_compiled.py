"""The compiled skyline sweep (numba): the same plans as the Python sweep, and a budget
that never pays for numba's import or compilation without room for it."""

import json
import os
import random
import subprocess
import sys
import time
from pathlib import Path
from unittest.mock import patch

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from relax_memplan.planner import Buffer, compiled, plan, read_csv, skyline, validate
from relax_memplan.planner.algorithms import lowest_first_keys
from relax_memplan.planner.placement import Problem
from relax_memplan.planner.portfolio import first_pass_count
from relax_memplan.planner.skyline import lowest_first_sweep

from .strategies import assert_no_overlap_brute_force, buffer_lists

REPO_ROOT = Path(__file__).resolve().parents[2]
IDEALLOC = REPO_ROOT.parent / "shared" / "bench" / "idealloc"
ORDERS = sorted(lowest_first_keys)


@pytest.fixture(scope="module")
def jit():
    """The compiled sweep, loaded (or compiled once: a cold cache costs 2-4 s here)."""
    pytest.importorskip("numba", exc_type=ImportError)  # absent or broken: skip
    info = compiled.warm_up()
    assert info["sweep"] == "numba", info
    return info


def random_buffers(count, horizon, seed, alignments=(1,)):
    rnd = random.Random(seed)
    out = []
    for i in range(count):
        start = rnd.randrange(horizon)
        out.append(Buffer(f"t{i}", start, start + rnd.randint(1, 100), rnd.randint(64, 1 << 20),
                          rnd.choice(alignments)))
    return out


def _same_pass(p, name, **kwargs):
    keys = lowest_first_keys[name](p)
    return lowest_first_sweep(p, keys, **kwargs), compiled.compiled_sweep(p, keys, **kwargs)


@pytest.mark.parametrize("name", ORDERS)
def test_compiled_sweep_gives_the_python_plan_on_random_instances(jit, name):
    # Same rule and tie-breaks: identical offsets, height, order; sizes of 2-3k buffers
    # reach the long-slice (block) path of the query, the alignments the rounding.
    for seed, (count, horizon) in enumerate(((300, 200), (3000, 1000), (2500, 40))):
        p = Problem(random_buffers(count, horizon, seed, alignments=(1, 1, 64, 256, 4096)))
        python, numba = _same_pass(p, name)
        assert numba == python
        validate(p.buffers, p.offsets_by_id(numba[0]))


@settings(max_examples=60, deadline=None)
@given(buffer_lists(max_buffers=40), st.sampled_from(ORDERS), st.integers(0, 45))
def test_compiled_sweep_matches_on_small_instances_and_counts(jit, buffers, name, count):
    # ``count`` places the first ranks lowest-first and drops the rest into the lanes.
    p = Problem(buffers)
    python, numba = _same_pass(p, name, count=count)
    assert numba == python
    assert_no_overlap_brute_force(buffers, numba[0])


@pytest.mark.parametrize("instance", ["pangu_2.6B", "S_1"])
def test_compiled_sweep_gives_the_python_heights_on_large_graphs(jit, instance):
    path = IDEALLOC / f"{instance}.csv"
    if not path.exists():
        pytest.skip(f"{path} not present")
    p = Problem(read_csv(path))
    python, numba = _same_pass(p, "lowest_first_by_area")
    assert numba[1] == python[1] and numba[0] == python[0]


def test_a_wrong_offset_from_the_compiled_sweep_is_caught(jit):
    # The comparison above can fail: one buffer moved by one byte is seen.
    p = Problem(random_buffers(500, 300, 7))
    python, numba = _same_pass(p, "lowest_first_by_area")
    moved = list(numba[0])
    moved[numba[2][-1]] += 1
    assert moved != python[0]


def test_compiled_pass_past_its_deadline_drops_the_rest_validly(jit):
    p = Problem(random_buffers(3000, 1000, 1))
    keys = lowest_first_keys["lowest_first_by_area"](p)
    with patch.object(compiled, "JIT_STEPS", 64):
        offsets, height, order, finished = compiled.compiled_sweep(
            p, keys, deadline=time.perf_counter() - 1.0)
    assert not finished and sorted(order) == list(range(p.n))
    validate(p.buffers, p.offsets_by_id(offsets))
    assert height == p.height(offsets)


def test_compiled_pass_that_measures_itself_slow_keeps_the_smallest_ranks(jit):
    # The Python driver restricts the candidates (skyline._affordable) as the Python pass.
    p = Problem(random_buffers(3000, 1000, 2))
    keys = lowest_first_keys["lowest_first_by_area"](p)
    calls = []

    def afford(now, started, placed, count, n, deadline, drop_s):
        calls.append(placed)
        return 100 if len(calls) == 1 else None

    with patch.object(compiled, "JIT_STEPS", 256), patch.object(skyline, "_affordable", afford):
        offsets, height, order, finished = compiled.compiled_sweep(
            p, keys, deadline=time.perf_counter() + 60)
    assert not finished and calls and len(order) == p.n
    validate(p.buffers, p.offsets_by_id(offsets))
    # After the check, exactly the 100 smallest ranks left are placed, then the lanes.
    left = sorted(set(range(p.n)) - set(order[:calls[0]]), key=keys.__getitem__)
    assert set(order[calls[0]:calls[0] + 100]) == set(left[:100])


def test_plan_says_which_sweep_ran_and_numba_absent_gives_the_same_plan(jit, monkeypatch):
    # 8,000 buffers on 1,000 steps: over 2M overlapping pairs, so the skyline path runs.
    buffers = random_buffers(8000, 1000, 4)
    kwargs = dict(algorithms=["lowest_first_by_area", "lowest_first_by_peak"],
                  time_limit_s=30.0, search=False)
    with_numba = plan(buffers, **kwargs)
    assert with_numba.sweep == "numba" and with_numba.sweep_reason == ""
    # numba not importable: a fresh state and the module import failing.
    monkeypatch.setattr(compiled, "_STATE", {"kernel": None, "error": None, "cold": False,
                                             "module": None})
    monkeypatch.setitem(sys.modules, "relax_memplan.planner._sweep_jit", None)
    # Too short a pass to pay for loading numba: not even tried.
    assert plan(buffers, **kwargs).sweep_reason.startswith("compiled sweep not loaded")
    warm = compiled.warm_up()
    assert warm["sweep"] == "python" and "numba not importable" in warm["reason"]
    without = plan(buffers, **kwargs)
    assert without.sweep == "python" and "numba not importable" in without.sweep_reason
    assert without.offsets == with_numba.offsets


def test_choose_sweep_loads_only_with_room_for_it(jit, monkeypatch):
    p = Problem(random_buffers(2000, 500, 5))
    monkeypatch.setattr(compiled, "_STATE", {"kernel": None, "error": None, "cold": False,
                                             "module": None})
    # No room for the import and the load: Python, and nothing imported.
    assert compiled.choose_sweep(p, left_s=0.2, python_pass_s=10.0)[0] == "python"
    # Room, but one pass saves less than the load costs: Python.
    assert compiled.choose_sweep(p, left_s=100.0, python_pass_s=0.01)[0] == "python"
    assert compiled._STATE["module"] is None
    # Room and a saving: loaded from the cache the fixture wrote, without compiling.
    assert compiled.choose_sweep(p, left_s=100.0, python_pass_s=10.0) == ("numba", "")
    assert compiled.sweep_state() == "numba"


def test_sizes_beyond_int64_keep_the_python_sweep(jit):
    huge = [Buffer("a", 0, 2, 1 << 62), Buffer("b", 1, 3, 1 << 62)]
    assert compiled.choose_sweep(Problem(huge), left_s=100.0, python_pass_s=10.0) == (
        "python", "sizes beyond int64")


_COLD_SCRIPT = """
import json, random, sys
from relax_memplan.planner import Buffer, plan, validate
from tests.planner.clocks import work_clock
rnd = random.Random(0)
buffers = []
for i in range(20000):
    s = rnd.randrange(10000)
    buffers.append(Buffer(f"t{i}", s, s + rnd.randint(1, 100), rnd.randint(64, 1 << 20)))
with work_clock() as clock:
    started = clock()
    result = plan(buffers, time_limit_s=0.2)
    elapsed = clock() - started
validate(buffers, result.offsets)
print(json.dumps({"elapsed": elapsed, "sweep": result.sweep, "numba": "numba" in sys.modules,
                  "ratio": result.ratio}))
"""


def test_cold_numba_cache_is_not_charged_to_a_short_budget(tmp_path):
    # A fresh process with an empty numba cache: 0.2 s on 20k buffers stays in Python
    # (numba is not even imported, nothing is compiled). Whether the budget is kept is
    # measured by benchmarks/planner_budget_bench.py, not asserted in a test.
    env = dict(os.environ, NUMBA_CACHE_DIR=str(tmp_path), PYTHONPATH=str(REPO_ROOT))
    out = subprocess.run([sys.executable, "-c", _COLD_SCRIPT], env=env, cwd=REPO_ROOT,
                         capture_output=True, text=True, timeout=120, check=True)
    found = json.loads(out.stdout.strip().splitlines()[-1])
    assert found["sweep"] == "python" and not found["numba"]
    assert not list(tmp_path.rglob("*.nbi"))  # nothing compiled or cached


def test_compiled_pass_judges_its_drop_at_the_measured_lanes_cost():
    # 100k buffers, 0.15 s left: at 2 us per buffer (the Python sweep's estimate) only the
    # drop fits; at the compiled driver's 1.2 us (lanes measured at 0.85-0.91 us) it does not
    # have to drop yet. A 0.24 s budget made the compiled pass drop all: 1.32 x LB, not 1.05.
    assert skyline._must_drop(0.0, 0.0, 0, 100_000, deadline=0.15)
    assert not skyline._must_drop(0.0, 0.0, 0, 100_000, 0.15, compiled.JIT_DROP_SECONDS_PER_BUFFER)
    costs = (compiled.JIT_SECONDS_PER_BUFFER, compiled.JIT_DROP_SECONDS_PER_BUFFER)
    assert first_pass_count(100_000, 0.2, 1.0, *costs) is None  # a full compiled pass fits
    assert first_pass_count(100_000, 0.1, 1.0, *costs) == 0  # not even the drop: lanes
    assert first_pass_count(100_000, 0.2) == 0  # the Python pass would not fit
