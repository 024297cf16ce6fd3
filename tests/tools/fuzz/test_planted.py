"""The runner classifies a planted fault: a wrong value of ours only is ``wrong``, of both
builds ``tvm_bug``, a crash of ours ``crash_ours``."""

import numpy as np
from onnx import TensorProto, helper

from relax_memplan.tools.fuzz import runner


def _model():
    x = helper.make_tensor_value_info("x", TensorProto.FLOAT, [2, 3])
    y = helper.make_tensor_value_info("y", TensorProto.FLOAT, [2, 3])
    graph = helper.make_graph([helper.make_node("Relu", ["x"], ["y"])], "g", [x], [y])
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])


def _planted(monkeypatch, fault_from_call):
    """Builds from the ``fault_from_call``-th on (0: TVM's, 1: ours) give outputs + 1."""
    real, calls = runner._run_all, []

    def run_all(executable, runs):
        calls.append(1)
        out = real(executable, runs)
        if len(calls) > fault_from_call:
            out = {n: [np.asarray(o) + 1 for o in v] for n, v in out.items()}
        return out

    monkeypatch.setattr(runner, "_run_all", run_all)
    return runner.run_graph(_model(), 0, False, 2, ["default"])


def test_a_wrong_value_of_ours_only_is_wrong(monkeypatch):
    result = _planted(monkeypatch, 1)
    assert (result.outcome, result.variant) == ("wrong", "default")
    assert "max abs error 1" in result.detail


def test_a_wrong_value_of_both_builds_is_a_tvm_bug(monkeypatch):
    assert _planted(monkeypatch, 0).outcome == "tvm_bug"


def test_a_crash_of_ours_only_is_crash_ours(monkeypatch):
    real = runner._build

    def build(mod, symbolic, ours, settings):
        if ours:
            raise RuntimeError("planted")
        return real(mod, symbolic, ours, settings)

    monkeypatch.setattr(runner, "_build", build)
    result = runner.run_graph(_model(), 0, False, 2, ["default"])
    assert result.outcome == "crash_ours" and "planted" in result.detail
