"""The peak rows, JSON rows and plot of a plan with placement groups (a concatenation written
in place whose second input ends an in-place chain) agree with the lower bound.

Regression (yolov8n with in-place and concat in place): the text listed a
group's member at the peak step outside its live range and sizes adding to more than the
header; the JSON had two rows overlapping in time and address with nothing saying one lives
inside the other; the plot's live bytes peaked below the lower bound on the same chart."""

import warnings

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper, numpy_helper

from relax_memplan import PlanStaticMemory, get_pipeline, import_onnx
from relax_memplan.report.summary import planned_tensors
from relax_memplan.report.text import _peak_lines


def _conv(name, x, out, cin, cout, rng):
    w = numpy_helper.from_array(rng.standard_normal((cout, cin, 3, 3)).astype("float32") * 0.2,
                                f"{name}_w")
    return helper.make_node("Conv", [x, f"{name}_w"], [out], pads=[1] * 4), w


def concat_of_inplace_chain() -> onnx.ModelProto:
    """A = Conv(X), R = Conv(X), B = Conv(A) + R (in place over R), C = Concat(A, B) -> Conv -> Y:
    A and the chain R -> B are placed inside C (every size a multiple of 64 B)."""
    rng = np.random.default_rng(0)
    nodes, inits = [], []
    for args in (("c1", "X", "A", 8, 16), ("c2", "X", "R", 8, 16), ("c3", "A", "P", 16, 16)):
        node, w = _conv(*args, rng)
        nodes.append(node)
        inits.append(w)
    nodes += [helper.make_node("Add", ["P", "R"], ["B"]),
              helper.make_node("Concat", ["A", "B"], ["C"], axis=1)]
    node, w = _conv("c4", "C", "Y", 32, 4, rng)
    graph = helper.make_graph(
        nodes + [node], "concat_of_inplace_chain",
        [helper.make_tensor_value_info("X", TensorProto.FLOAT, [1, 8, 16, 16])],
        [helper.make_tensor_value_info("Y", TensorProto.FLOAT, [1, 4, 16, 16])], inits + [w])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    model.ir_version = 8
    onnx.checker.check_model(model)
    return model


@pytest.fixture(scope="module")
def plan():
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        mod, _ = import_onnx(concat_of_inplace_chain())
    plan_pass = PlanStaticMemory(time_limit_s=0.2, inplace=True, concat_inplace=True)
    get_pipeline("llvm", plan_pass=plan_pass)(mod)  # the Relax phases make the plan
    fplan = plan_pass.plans["main"]
    (arena,) = fplan.arenas
    # the case under test: a concat input and an in-place chain inside the concat's output
    kinds = sorted(k for k in arena.nested if k not in arena.nested_without_concat)
    assert len(kinds) == 2 and len(arena.nested_without_concat) == 1
    return fplan


def test_peak_rows_add_up_to_the_lower_bound(plan):
    (arena,) = plan.arenas
    rows, peak, live = planned_tensors(plan)
    by_name = {r["name"]: r for r in rows}
    # only storage holders are listed, each live (group span) at the peak step
    assert all("inside" not in by_name[n] for n in live)
    spans = [by_name[n].get("group_live_range", by_name[n]["live_range"]) for n in live]
    assert all(s <= peak < e for s, e in spans)
    listed = sum(by_name[n].get("group_size_bytes", by_name[n]["size_bytes"]) for n in live)
    assert listed == arena.lower_bound_bytes == arena.unaligned_lower_bound_bytes == 32768
    lines = _peak_lines(rows, peak, live)
    header_bytes = int(lines[0].split("tensors, ")[1].split(" B")[0].replace(",", ""))
    table = [line.split() for line in lines[2:] if not line.startswith("      ")]
    assert header_bytes == sum(int(r[-4].replace(",", "")) for r in table) == listed
    holds = [line for line in lines if "holds" in line]
    assert len(holds) == 1 and "concat input, offset +0," in holds[0] \
        and "in place, offset +16,384," in holds[0]


def test_json_rows_say_who_lives_inside_whom(plan):
    rows, _, _ = planned_tensors(plan)
    members = [r for r in rows if "inside" in r]
    (root,) = [r for r in rows if "group_live_range" in r]
    assert root["producer"] == "concatenate" and len(members) == 3
    by_name = {r["name"]: r for r in rows}
    for m in members:
        parent = by_name[m["inside"]["tensor"]]
        assert m["group"] == root["name"]
        assert m["offset_bytes"] == parent["offset_bytes"] + m["inside"]["delta_bytes"]
        start, end = root["group_live_range"]
        assert start <= m["live_range"][0] and m["live_range"][1] <= end


def test_plot_live_bytes_peak_is_the_lower_bound(plan):
    from relax_memplan.report.plot import arena_live_bytes, live_bytes_per_step

    (arena,) = plan.arenas
    steps = plan.liveness.num_steps
    live = arena_live_bytes(plan, arena, steps)
    assert max(live) == arena.lower_bound_bytes
    # the old rule (each tensor over its own range, overlaps once) drew step 0, where only A
    # is written, at A's bytes; the concat output's storage is reserved there (lower bound)
    tensors = {t.uid: t for t in plan.liveness.tensors}
    placed = [(tensors[u], o) for u, o in arena.offsets.items()]
    old = live_bytes_per_step([t for t, _ in placed], steps, [o for _, o in placed])
    assert old[0] == 16384 and live[0] == 32768 and all(a >= b for a, b in zip(live, old))


def test_peak_table_columns_widen_to_huge_numbers():
    """Regression (--dim batch=1..10000000 on mobilenetv2): 'float328,847,360,000,000',
    the shape ran into the bytes and the bytes into the offset."""
    rows = [{"name": "alloc4", "shape": ["batch", 96, 48, 48], "dtype": "float32",
             "producer": "conv", "size_bytes": 8_847_360_000_000, "offset_bytes": 0,
             "live_range": [12, 17]},
            {"name": "alloc5", "shape": ["batch", 96, 24, 24], "dtype": "float32",
             "producer": "conv", "size_bytes": 2_211_840_000_000,
             "offset_bytes": 8_847_360_000_000, "live_range": [15, 20]}]
    lines = _peak_lines(rows, 15, ["alloc4", "alloc5"])
    assert lines[2].split() == ["alloc4", "conv", "batchx96x48x48", "float32",
                                "8,847,360,000,000", "0", "[12,", "17)"]
    assert lines[3].split()[4:6] == ["2,211,840,000,000", "8,847,360,000,000"]
    end = lines[1].index("bytes") + len("bytes")  # right-aligned under the header
    assert lines[2].index("8,847,360,000,000") + 17 == end == lines[3].index("2,211") + 17
