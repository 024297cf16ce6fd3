"""Concatenation written in place by PlanStaticMemory(concat_inplace=True): which concat calls
are dropped, which are refused and why, numerics against onnxruntime / numpy."""

import warnings
from pathlib import Path

import numpy as np
import onnx
import pytest
import tvm
from onnx import TensorProto, helper, numpy_helper
from tvm import relax
from tvm.script import ir as I
from tvm.script import relax as R

from relax_memplan.frontend import import_onnx, run_onnxruntime
from relax_memplan.pipeline import get_pipeline
from relax_memplan.planner import Buffer, validate
from relax_memplan.transform._concat_plan import plan_concats
from relax_memplan.transform._inplace_plan import merged_buffers
from relax_memplan.transform.plan_static_memory import PlanStaticMemory

MODELS = Path(__file__).resolve().parents[2].parent / "shared" / "models"


def _conv(name, x, out, cin, cout, k, rng):
    w = numpy_helper.from_array(rng.standard_normal((cout, cin, k, k)).astype("float32") * 0.2,
                                f"{name}_w")
    node = helper.make_node("Conv", [x, f"{name}_w"], [out], pads=[k // 2] * 4)
    return node, w


def conv_concat_conv(batch=1, param_input=False) -> onnx.ModelProto:
    """X -> Conv(3x3) -> A, X -> Conv(1x1) -> B, Concat(A, B, axis 1) -> Conv -> Y; with
    ``param_input`` the concat takes X itself instead of B."""
    rng = np.random.default_rng(0)
    n1, w1 = _conv("c1", "X", "A", 8, 16, 3, rng)
    n2, w2 = _conv("c2", "X", "B", 8, 16, 1, rng)
    cat = helper.make_node("Concat", ["A", "X" if param_input else "B"], ["C"], axis=1)
    n3, w3 = _conv("c3", "C", "Y", 24 if param_input else 32, 4, 3, rng)
    nodes = [n1, cat, n3] if param_input else [n1, n2, cat, n3]
    inits = [w1, w3] if param_input else [w1, w2, w3]
    graph = helper.make_graph(nodes, "conv_concat_conv",
                              [helper.make_tensor_value_info("X", TensorProto.FLOAT,
                                                             [batch, 8, 16, 16])],
                              [helper.make_tensor_value_info("Y", TensorProto.FLOAT,
                                                             [batch, 4, 16, 16])], inits)
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    model.ir_version = 8
    onnx.checker.check_model(model)
    return model


def _unfused(mod):
    """Legalized, every kernel marked opaque so that FuseOps keeps each op its own kernel."""
    mod = relax.transform.LegalizeOps()(mod)
    for gv, func in mod.functions_items():
        if isinstance(func, tvm.tirx.PrimFunc):
            mod[gv] = func.with_attr("op_pattern", 8)  # kOpaque
    return mod


def _build(mod, **flags):
    plan = PlanStaticMemory(**flags)
    ex = tvm.compile(mod, "llvm", relax_pipeline=get_pipeline("llvm", plan_pass=plan))
    return plan, relax.VirtualMachine(ex, tvm.cpu())


def _run_onnx(model, concat_inplace=True):
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        mod, _ = import_onnx(model, {})
    x = np.random.default_rng(1).standard_normal(
        [d.dim_value for d in model.graph.input[0].type.tensor_type.shape.dim]).astype("float32")
    plan, vm = _build(mod, concat_inplace=concat_inplace)
    got = vm["main"](tvm.runtime.tensor(x)).numpy()
    np.testing.assert_allclose(got, run_onnxruntime(model, {"X": x})[0], rtol=1e-4, atol=1e-4)
    return plan.plans["main"]


def test_conv_concat_conv_batch1_writes_the_concat_in_place_and_matches_onnxruntime():
    on = _run_onnx(conv_concat_conv())
    off = _run_onnx(conv_concat_conv(), concat_inplace=False)
    assert on.concat_inplace == 1 and on.concat_refusals == {}
    assert off.concat_inplace is None
    # A, B (16 KiB each) and C (32 KiB) were live together; now A and B are C's bytes
    assert off.lower_bound_bytes == 65536
    assert on.lower_bound_bytes == 32768
    assert on.arenas[0].lower_bound_without_concat_bytes == 65536


def test_batch2_is_refused_and_still_matches_onnxruntime():
    on = _run_onnx(conv_concat_conv(batch=2))
    assert on.concat_inplace == 0
    assert on.concat_refusals == {"dims before the axis are not 1": 1}


def test_function_parameter_input_is_refused():
    on = _run_onnx(conv_concat_conv(param_input=True))
    assert on.concat_inplace == 0
    assert on.concat_refusals == {"function parameter": 1}


@I.ir_module
class InplaceTrap:
    """c = concat(a, b); d = a + 1 may be written over a (a dies there), but a's bytes are
    c's, and c is read after d is written: writing the concat in place must be refused."""

    @R.function
    def main(x: R.Tensor((1, 64, 32, 32), "float32"), y: R.Tensor((1, 64, 32, 32), "float32")):
        with R.dataflow():
            a = R.exp(x)
            b = R.exp(y)
            c = R.concat([a, b], axis=1)
            d = R.add(a, R.const(1.0, "float32"))
            e = R.add(R.sum(d), R.sum(c))
            R.output(e)
        return e


def _trap_reference(x, y):
    a = np.exp(x)
    return (a + 1).sum() + np.concatenate([a, np.exp(y)], axis=1).sum()


def test_input_overwritten_in_place_later_is_refused():
    x, y = (np.random.default_rng(k).uniform(-1, 1, (1, 64, 32, 32)).astype("float32")
            for k in (0, 1))
    plan, vm = _build(_unfused(InplaceTrap), inplace=True, concat_inplace=True)
    got = vm["main"](tvm.runtime.tensor(x), tvm.runtime.tensor(y)).numpy()
    np.testing.assert_allclose(got, _trap_reference(x, y), rtol=1e-5)
    fplan = plan.plans["main"]
    assert len(fplan.liveness.inplace) >= 1  # the add is written over a
    assert fplan.concat_refusals == {"overwritten by in-place reuse": 1}
    # without in-place reuse the same concat is written in place, numerics unchanged
    plan, vm = _build(_unfused(InplaceTrap), concat_inplace=True)
    got = vm["main"](tvm.runtime.tensor(x), tvm.runtime.tensor(y)).numpy()
    np.testing.assert_allclose(got, _trap_reference(x, y), rtol=1e-5)
    assert plan.plans["main"].concat_inplace == 1


@I.ir_module
class EarlyInput:
    """a is defined before a big temporary; reserving c's whole range from a's definition
    would raise the peak (a + big < c + big), so the concat is refused."""

    @R.function
    def main(x: R.Tensor((1, 64, 32, 32), "float32"), z: R.Tensor((1, 256, 32, 32), "float32"),
             y: R.Tensor((1, 64, 32, 32), "float32")):
        with R.dataflow():
            a = R.exp(x)
            big = R.exp(z)
            s = R.sum(big)
            b = R.exp(y)
            c = R.concat([a, b], axis=1)
            e = R.add(R.sum(c), s)
            R.output(e)
        return e


def test_concat_that_would_raise_the_live_bytes_is_refused():
    plan, _ = _build(_unfused(EarlyInput), concat_inplace=True)
    fplan = plan.plans["main"]
    assert fplan.concat_refusals == {"does not lower the live bytes": 1}
    assert fplan.lower_bound_bytes == fplan.arenas[0].lower_bound_without_concat_bytes


def test_plan_concats_placements_pass_the_validator_and_a_wrong_delta_fails():
    plan, _ = _build(_unfused(InplaceTrap), concat_inplace=True)
    fplan = plan.plans["main"]
    arena = fplan.arenas[0]
    site = arena.concat_sites[0]
    uids = [fplan.liveness.tensors[i].uid for i in site.inputs]
    out = fplan.liveness.tensors[site.output].uid
    buffers = [Buffer(t.uid, t.start, t.end, t.size_bytes, 64) for t in fplan.liveness.plannable]
    nested = plan_concats(fplan.liveness, buffers, {}, 64).nested
    assert nested == {uids[0]: (out, 0), uids[1]: (out, 262144)}
    assert arena.offsets[uids[1]] == arena.offsets[out] + 262144
    validate(buffers, arena.offsets, nested=nested)
    assert len(merged_buffers(buffers, nested)) == len(buffers) - 2
    wrong = dict(arena.offsets)
    wrong[uids[1]] = arena.offsets[out]
    with pytest.raises(Exception, match="declared inside"):
        validate(buffers, wrong, nested=nested)


@pytest.mark.slow
def test_yolov8n_concats_in_place_match_onnxruntime():
    path = MODELS / "yolov8n-nudenet-320n.onnx"
    if not path.exists():
        pytest.skip(f"{path} not found")
    from relax_memplan.compile.model import compile_model
    from relax_memplan.compile.options import BuildOptions, CheckOptions

    plan = PlanStaticMemory(inplace=True, concat_inplace=True)
    result = compile_model(str(path), {"images": (1, 3, 320, 320)},
                           options=BuildOptions(plan_pass=plan), check=CheckOptions(verify=True))
    assert result.report.main.verified
    fplan = plan.plans["main"]
    assert fplan.concat_inplace == 9
    assert fplan.lower_bound_bytes <= fplan.arenas[0].lower_bound_without_concat_bytes


def test_report_states_concats_in_place_and_refusals():
    from relax_memplan.report.summary import static_functions
    from relax_memplan.report.text import _format_function
    from relax_memplan.transform.record_storage import RecordStorage

    plan = PlanStaticMemory(inplace=True, concat_inplace=True)
    tvm.compile(_unfused(InplaceTrap), "llvm", relax_pipeline=get_pipeline("llvm", plan_pass=plan))
    functions, _ = static_functions(plan, RecordStorage(), RecordStorage())
    f = functions["main"]
    assert f.concat_inplace == 0
    assert f.concat_refusals == {"overwritten by in-place reuse": 1}
    assert f.lower_bound_without_concat_bytes == f.lower_bound_bytes
    text = "\n".join(_format_function(f))
    assert "concat in place: 0 concatenations written in place; refused: 1 overwritten" in text

    plan = PlanStaticMemory(concat_inplace=True)
    tvm.compile(_unfused(InplaceTrap), "llvm", relax_pipeline=get_pipeline("llvm", plan_pass=plan))
    f = static_functions(plan, RecordStorage(), RecordStorage())[0]["main"]
    assert f.concat_inplace == 1 and f.concat_refusals == {}
    assert f.lower_bound_without_concat_bytes > f.lower_bound_bytes
    assert "concat_inplace" in f.to_dict()


@I.ir_module
class SplitConcat:
    """The C2f shape of yolov8n: the two halves of a Split (items of a tuple literal after
    CallTIRRewrite), a tensor computed from the second half, concatenated."""

    @R.function
    def main(x: R.Tensor((1, 128, 32, 32), "float32")):
        with R.dataflow():
            h = R.exp(x)
            parts = R.split(h, 2, axis=1)
            y0 = parts[0]
            y1 = parts[1]
            m = R.add(R.exp(y1), y1)
            c = R.concat([y0, y1, m], axis=1)
            s = R.sum(c, axis=[1])
            R.output(s)
        return s


def test_split_halves_are_tuple_items_written_in_place():
    x = np.random.default_rng(2).uniform(-1, 1, (1, 128, 32, 32)).astype("float32")
    plan, vm = _build(_unfused(SplitConcat), concat_inplace=True)
    h = np.exp(x)
    expected = np.concatenate([h, np.exp(h[:, 64:]) + h[:, 64:]], axis=1).sum(axis=1)
    got = vm["main"](tvm.runtime.tensor(x)).numpy()
    np.testing.assert_allclose(got, expected, rtol=1e-5)
    fplan = plan.plans["main"]
    assert fplan.concat_inplace == 1
    assert fplan.lower_bound_bytes < fplan.arenas[0].lower_bound_without_concat_bytes


@I.ir_module
class ExternViewInput:
    """The first input is the result of an extern call on a: it may be a view of a's storage
    (or anything else), never a planned tensor of its own: refused."""

    @R.function
    def main(x: R.Tensor((1, 64, 32, 32), "float32"), y: R.Tensor((1, 64, 32, 32), "float32")):
        a = R.exp(x)
        v = R.call_pure_packed("vm.builtin.reshape", a, R.shape([1, 64, 32, 32]),
                               ty_args=R.Tensor((1, 64, 32, 32), "float32"))
        b = R.exp(y)
        c = R.concat([v, b], axis=1)
        s = R.sum(c)
        return s


def test_extern_result_input_is_refused_as_a_view():
    x, y = (np.random.default_rng(k).uniform(-1, 1, (1, 64, 32, 32)).astype("float32")
            for k in (3, 4))
    plan, vm = _build(_unfused(ExternViewInput), concat_inplace=True)
    fplan = plan.plans["main"]
    assert fplan.concat_inplace == 0
    assert fplan.concat_refusals == {"view or alias of other storage": 1}
    got = vm["main"](tvm.runtime.tensor(x), tvm.runtime.tensor(y)).numpy()
    np.testing.assert_allclose(got, np.exp(x).sum() + np.exp(y).sum(), rtol=1e-4)


def test_a_concat_is_decided_and_counted_by_its_own_arena_only():
    plan, _ = _build(_unfused(InplaceTrap), concat_inplace=True)
    live = plan.plans["main"].liveness
    # another arena (none of the concat's tensors in it): neither applied nor refused there
    other = plan_concats(live, [Buffer("elsewhere", 0, live.num_steps, 64, 64)], {}, 64,
                         owns_unplaced=False)
    assert other.applied == [] and not other.refusals
    own = plan_concats(live, [Buffer(t.uid, t.start, t.end, t.size_bytes, 64)
                              for t in live.plannable], {}, 64)
    assert len(own.applied) == 1 and not own.refusals
