"""FoldConstantsFirst: constants folded once on the high-level graph; an ill-formed fold of
TVM 0.27 is dropped, never returned."""

import pytest
import tvm
from tvm import relax
from tvm.script import ir as I, relax as R

from relax_memplan.frontend import import_onnx
from relax_memplan.transform.clamp_empty_slices import ClampEmptySlices
from relax_memplan.transform.fold_constants_first import FoldConstantsFirst
from tests.transform.test_clamp_empty_slices import _slice_model


@I.ir_module
class _Constant:
    @R.function
    def main(x: R.Tensor((2, 8), "float32")):
        with R.dataflow():
            c = R.add(R.const(1.0, "float32"), R.const(2.0, "float32"))
            y = R.add(x, c)
            R.output(y)
        return y


def test_a_constant_subgraph_becomes_a_constant():
    pass_ = FoldConstantsFirst()
    out = pass_(_Constant)
    assert pass_.kept is True
    (binding,) = out["main"].body.blocks[0].bindings
    assert isinstance(binding.value.args[1], tvm.ir.GenericConst)
    assert float(binding.value.args[1].value.numpy()) == 3.0


def test_nothing_to_fold_runs_nothing():
    @I.ir_module
    class NoConstant:
        @R.function
        def main(x: R.Tensor((2, 8), "float32")):
            with R.dataflow():
                y = R.add(x, x)
                R.output(y)
            return y

    pass_ = FoldConstantsFirst()
    assert pass_(NoConstant).same_as(NoConstant) and pass_.kept is None


def test_an_ill_formed_fold_is_dropped():
    # TVM 0.27's FoldConstant legalizes the run-time dynamic_strided_slice and leaves its
    # shape function's call behind without the PrimFunc (the module would not compile)
    mod = ClampEmptySlices()(import_onnx(_slice_model())[0])
    folded = relax.transform.FoldConstant()(mod)
    with pytest.raises(ValueError, match="shape_func"):  # what the pass guards against
        relax.analysis.well_formed(folded)
    pass_ = FoldConstantsFirst()
    assert pass_(mod).same_as(mod) and pass_.kept is False
