"""Each refusal of FuseNormalization and of FuseAddLayerNorm's add + rms_norm, forced: the
candidate counted with its reason and the module left as it was."""

import numpy as np
import pytest
import tvm
from tvm import relax
from tvm.script import ir as I, relax as R

from relax_memplan.frontend import import_onnx, run_onnxruntime
from relax_memplan.pipeline import get_pipeline
from relax_memplan.transform._norm_match import REASONS
from relax_memplan.transform.fuse_add_layer_norm import REASONS as ADD_REASONS
from relax_memplan.transform.fuse_add_layer_norm import FuseAddLayerNorm
from relax_memplan.transform.fuse_normalization import FuseNormalization
from tests.transform.attention_models import Graph

H = 16


def _module(case):
    """A function holding one norm candidate that ``case`` keeps from being fused."""
    if case == "dtype":
        @I.ir_module
        class Float64:
            @R.function
            def main(x: R.Tensor((4, H), "float64")):
                with R.dataflow():
                    sq = R.multiply(x, x)
                    ms = R.mean(sq, axis=[-1], keepdims=True)
                    ve = R.add(ms, R.const(1e-6, "float64"))
                    y = R.divide(x, R.sqrt(ve))
                    R.output(y)
                return y
        return Float64
    if case == "axes":
        @I.ir_module
        class FirstAxis:
            @R.function
            def main(x: R.Tensor((4, H), "float32")):
                with R.dataflow():
                    sq = R.multiply(x, x)
                    ms = R.mean(sq, axis=[0], keepdims=True)
                    ve = R.add(ms, R.const(1e-6, "float32"))
                    y = R.divide(x, R.sqrt(ve))
                    R.output(y)
                return y
        return FirstAxis
    if case == "eps":
        @I.ir_module
        class InputEps:
            @R.function
            def main(x: R.Tensor((4, H), "float32"), e: R.Tensor((4, 1), "float32")):
                with R.dataflow():
                    sq = R.multiply(x, x)
                    ms = R.mean(sq, axis=[-1], keepdims=True)
                    ve = R.add(ms, e)
                    y = R.divide(x, R.sqrt(ve))
                    R.output(y)
                return y
        return InputEps
    if case == "read":
        @I.ir_module
        class MeanRead:
            @R.function
            def main(x: R.Tensor((4, H), "float32")):
                with R.dataflow():
                    m = R.mean(x, axis=[-1], keepdims=True)
                    d = R.subtract(x, m)
                    v = R.mean(R.power(d, R.const(2.0, "float32")), axis=[-1], keepdims=True)
                    y = R.divide(d, R.sqrt(R.add(v, R.const(1e-5, "float32"))))
                    out = (y, m)  # the mean is also an output
                    R.output(out)
                return out
        return MeanRead
    assert case == "form"

    @I.ir_module
    class NoEps:
        @R.function
        def main(x: R.Tensor((4, H), "float32")):
            with R.dataflow():
                sq = R.multiply(x, x)
                ms = R.mean(sq, axis=[-1], keepdims=True)
                y = R.divide(x, R.sqrt(ms))  # no epsilon: not the norm
                R.output(y)
            return y
    return NoEps


@pytest.mark.parametrize("case, kind", [("dtype", "rms_norm"), ("axes", "rms_norm"),
                                        ("eps", "rms_norm"), ("read", "layer_norm"),
                                        ("form", "rms_norm")])
def test_each_refusal_is_counted_with_its_reason_and_leaves_the_module(case, kind):
    before = _module(case)
    pass_ = FuseNormalization()
    after = pass_(before)
    assert after.same_as(before)
    records = {r.name: r for r in pass_.records}
    record = records[kind]
    assert (record.candidates, record.fused) == (1, 0)
    assert [r.reason for r in record.refused] == [REASONS[case]]
    assert record.refused[0].bindings and record.refused[0].function == "main"
    other = records["layer_norm" if kind == "rms_norm" else "rms_norm"]
    assert other.candidates == 0


def test_a_refused_norm_gives_onnxruntimes_values():
    # eps is an input, not a constant: the steps stay as they were imported
    g = Graph()
    x, e = g.input("x", (2, 3, H)), g.input("e", (1,))
    ms = g.op("ReduceMean", g.op("Mul", x, x), axes=[-1], keepdims=1)
    y = g.op("Div", x, g.op("Sqrt", g.op("Add", ms, e)))
    model = g.model([g.op("Identity", y)], opset=13)
    feeds = {"x": np.random.default_rng(0).standard_normal((2, 3, H)).astype("float32"),
             "e": np.array([1e-5], "float32")}
    mod, _ = import_onnx(model, {n: v.shape for n, v in feeds.items()})
    passes = [FuseNormalization()]
    ex = tvm.compile(mod, "llvm", relax_pipeline=get_pipeline(
        "llvm", planner="tvm", fusion_pass_list=passes))
    assert passes[0].records[1].summary() == f"0 of 1 fused: 1 x {REASONS['eps']}"
    got = relax.VirtualMachine(ex, tvm.cpu())["main"](
        *[tvm.runtime.tensor(v) for v in feeds.values()]).numpy()
    np.testing.assert_allclose(got, run_onnxruntime(model, feeds)[0], rtol=1e-5, atol=1e-6)


def _add_rms(producer):
    @I.ir_module
    class AddRms:
        @R.function
        def main(p: R.Tensor((8, H), "float32"), w: R.Tensor((H, H), "float32"),
                 r: R.Tensor((8, H), "float32"), g: R.Tensor((H,), "float32")):
            with R.dataflow():
                x = R.matmul(p, w) if producer == "matmul" else R.nn.softmax(p, axis=-1)
                s = R.add(x, r)
                y = R.nn.rms_norm(s, g, axes=[-1], epsilon=1e-6)
                out = (y, s)
                R.output(out)
            return out
    return AddRms


@pytest.mark.parametrize("producer, kernel, code", [("matmul", "cpu", "epilogue"),
                                                    ("softmax", "compute", "sum_output")])
def test_add_rms_norm_refusals(producer, kernel, code):
    before = _add_rms(producer)
    pass_ = FuseAddLayerNorm(kernel=kernel, memory_check=False)
    assert pass_(before).same_as(before)
    record = {r.name: r for r in pass_.records}["add_rms_norm"]
    assert (record.candidates, record.fused) == (1, 0)
    assert [r.reason for r in record.refused] == [ADD_REASONS[code]]


def test_add_rms_norm_writes_the_sum_read_later():
    pass_ = FuseAddLayerNorm(memory_check=False)
    after = pass_(_add_rms("softmax"))
    assert pass_.fused_by_pattern == {"add_layer_norm": 0, "add_rms_norm": 1}
    assert "R.nn.rms_norm" not in after["main"].script()
