"""schedules/_rule_gates: the schedule pass skips the rules whose necessary condition fails,
and gets the same kernel as trying every rule in turn."""

import pytest
import tvm
from tvm import te, tirx
from tvm.script import tirx as T

from relax_memplan.schedules import (
    _apply_first,
    _is_scheduled,
    _unwrap,
    cpu_schedule_pass,
    cpu_schedule_rules,
    host_target,
    rule_name,
)
from relax_memplan.schedules import _rule_gates
from relax_memplan.schedules._rule_gates import kernel_blocks, may_apply

from ..conftest import shared_model
from .test_schedule_pass import _matmul

TARGET = tvm.target.Target("llvm")


def _unscheduled_kernels(path, shapes):
    """The PrimFuncs that ``CPUSchedule`` receives in the ``schedule=True`` build."""
    from relax_memplan.frontend import import_onnx
    from relax_memplan.pipeline import get_pipeline

    captured = {}

    @tvm.instrument.pass_instrument
    class _Capture:
        def run_before_pass(self, mod, info):
            if info.name == "CPUSchedule":  # a copy: the pass updates its module in place
                captured.update((gv.name_hint, f) for gv, f in mod.functions_items()
                                if isinstance(f, tirx.PrimFunc) and not _is_scheduled(f))

    mod, _info = import_onnx(path, shapes)
    with tvm.transform.PassContext(instruments=[_Capture()]):
        get_pipeline(host_target(), schedule=True)(mod)
    return captured


@pytest.fixture(scope="module")
def model_kernels(vad_lstm_onnx):
    vad = vad_lstm_onnx
    models = {"magika": (shared_model("magika-1.0.3.onnx"), {"bytes": (1, 2048)}),
              "mnist-8": (shared_model("mnist-8/model.onnx"), None),
              "vad-lstm": (vad, {"feats": (1, 40, 256)})}
    return {label: _unscheduled_kernels(path, shapes) for label, (path, shapes) in models.items()}


def _differences(kernels, target):
    """Names of the kernels the schedule pass schedules otherwise than trying every rule."""
    out = cpu_schedule_pass(target)(tvm.IRModule(dict(kernels)))
    bad = []
    with target:
        for name, func in kernels.items():
            every_rule = _apply_first(cpu_schedule_rules(), func, target)
            try:
                tvm.ir.assert_structural_equal(out[name], func if every_rule is None
                                               else every_rule)
            except ValueError:
                bad.append(name)
    return bad


@pytest.mark.parametrize("label", ["magika", "mnist-8", "vad-lstm"])
def test_gated_pass_schedules_every_kernel_as_every_rule_would(model_kernels, label):
    kernels = model_kernels[label]
    assert len(kernels) >= 8
    assert _differences(kernels, host_target()) == []


def test_gates_skip_rules_on_magika(model_kernels):
    """Not vacuous: on magika most (kernel, reduction rule) pairs are skipped."""
    rules = [(rule_name(r), _unwrap(r)) for r in cpu_schedule_rules()]
    pairs = [(name, may_apply(name, inner, kernel_blocks(f)))
             for f in model_kernels["magika"].values() for name, inner in rules
             if name in _rule_gates.REDUCTION_RULES]
    skipped = sum(1 for _n, ok in pairs if not ok)
    assert skipped > len(pairs) // 2


def test_comparison_catches_a_wrong_gate(model_kernels, monkeypatch):
    """A gate that wrongly rules out the matmul rules changes mnist-8's matmul kernel: the
    comparison above must see it."""
    monkeypatch.setitem(_rule_gates._GATES, "StaticMatmul", lambda kb, rule: False)
    monkeypatch.setitem(_rule_gates._GATES, "GenericMatmul", lambda kb, rule: False)
    assert _differences(model_kernels["mnist-8"], host_target()) != []


def _row_max(n):
    a = te.placeholder((n, n), name="a")
    k = te.reduce_axis((0, n), name="k")
    return te.create_prim_func([a, te.compute((n,), lambda i: te.max(a[i, k], axis=k))])


def _gate(name, func):
    rule = next(_unwrap(r) for r in cpu_schedule_rules() if rule_name(r) == name)
    return may_apply(name, rule, kernel_blocks(func))


def test_matmul_gate_passes_a_matmul_and_stops_a_max():
    assert _gate("StaticMatmul", _matmul(64)) and _gate("GenericMatmul", _matmul(64))
    assert not _gate("StaticMatmul", _row_max(64))
    assert not _gate("DirectConv", _matmul(64))  # two spatial iter vars: no convolution
    assert not _gate("VectorRowReduction", _row_max(64))  # a max, not a sum
    assert _gate("SpatialFallback", _row_max(64))  # no gate: always tried


def test_unit_reduction_counts_as_maybe_element_wise():
    """normalize_prim_func may drop a reduction iter var of extent 1: a second reduction block
    over one element does not rule out the matmul rule."""
    kb = kernel_blocks(_two_reductions_one_unit)
    assert len(kb.reductions) == 2
    assert _gate("StaticMatmul", _two_reductions_one_unit)


@T.prim_func(s_tir=True)
def _two_reductions_one_unit(a: T.Buffer((16, 16), "float32"), b: T.Buffer((16, 16), "float32"),
                             c: T.Buffer((16, 16), "float32"), d: T.Buffer((16,), "float32")):
    for i, j, k in T.grid(16, 16, 16):
        with T.sblock("mm"):
            vi, vj, vk = T.axis.remap("SSR", [i, j, k])
            with T.init():
                c[vi, vj] = T.float32(0)
            c[vi, vj] = c[vi, vj] + a[vi, vk] * b[vk, vj]
    for i, k in T.grid(16, 1):
        with T.sblock("unit_sum"):
            vi, vk = T.axis.remap("SR", [i, k])
            with T.init():
                d[vi] = T.float32(0)
            d[vi] = d[vi] + c[vi, vk]


@T.prim_func(s_tir=True)
def _nested(a: T.Buffer((16,), "float32"), b: T.Buffer((16,), "float32")):
    with T.sblock("root"):
        with T.sblock("outer"):
            for i in range(16):
                with T.sblock("inner"):
                    vi = T.axis.spatial(16, i)
                    b[vi] = a[vi] * T.float32(2)


def test_nested_blocks_try_every_rule():
    kb = kernel_blocks(_nested)
    assert kb.children is None and not kb.has_reduction
