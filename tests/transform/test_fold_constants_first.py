"""FoldConstantsFirst: constants folded once on the high-level graph; an ill-formed fold of
TVM 0.27 is dropped, never returned."""

import numpy as np
import pytest
import tvm
from tvm import relax
from tvm.script import ir as I, relax as R, tirx as T

from relax_memplan.frontend import import_onnx
from relax_memplan.transform.clamp_empty_slices import ClampEmptySlices
from relax_memplan.transform.fold_constants_first import FoldConstantsFirst
from tests.conftest import shared_model
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


def test_an_ill_formed_fold_is_dropped(monkeypatch):
    # TVM 0.27's FoldConstant legalizes the run-time dynamic_strided_slice and leaves its
    # shape function's call behind without the PrimFunc (the module would not compile)
    mod = ClampEmptySlices()(import_onnx(_slice_model())[0])
    ill_formed = relax.transform.FoldConstant()(mod)
    with pytest.raises(ValueError, match="shape_func"):  # what the pass guards against
        relax.analysis.well_formed(ill_formed)
    # the pass gives FoldConstant only the constant bindings: the run-time slice is not
    # touched and the fold is kept
    pass_ = FoldConstantsFirst()
    out = pass_(mod)
    assert pass_.kept is True and relax.analysis.well_formed(out) is not False
    # a fold that comes back ill-formed is dropped: the input is returned
    monkeypatch.setattr(relax.transform, "FoldConstant", lambda: (lambda _m: ill_formed))
    pass_ = FoldConstantsFirst()
    assert pass_(mod).same_as(mod) and pass_.kept is False


def test_same_result_as_tvm_fold_on_the_whole_module():
    """bert-tiny after the index checks: shape_of of static shapes, call_tir of the check
    kernels on constants, the attention mask's chain; folding only the constant bindings
    gives what TVM's FoldConstant gives on the whole module."""
    from relax_memplan.transform.check_index_bounds import CheckIndexBounds

    shapes = {"input_ids": (1, 128), "attention_mask": (1, 128), "token_type_ids": (1, 128)}
    mod, _ = import_onnx(shared_model("bert-tiny-randw.onnx"), shapes)
    mod = ClampEmptySlices()(CheckIndexBounds()(mod))
    with tvm.target.Target("llvm"):
        expected = relax.transform.FoldConstant()(mod)
        pass_ = FoldConstantsFirst()
        out = pass_(mod)
    assert pass_.kept is True
    tvm.ir.assert_structural_equal(out["main"], expected["main"])
    assert len(out["main"].body.blocks[0].bindings) < len(mod["main"].body.blocks[0].bindings)


def test_non_dataflow_bindings_are_not_folded():
    @I.ir_module
    class Outside:
        @R.function
        def main(x: R.Tensor((2, 8), "float32")):
            c = R.add(R.const(1.0, "float32"), R.const(2.0, "float32"))
            y = R.add(x, c)
            return y

    pass_ = FoldConstantsFirst()
    out = pass_(Outside)
    tvm.ir.assert_structural_equal(out, relax.transform.FoldConstant()(Outside))
    assert pass_.kept is None and out.same_as(Outside)


def test_call_tir_on_constants_is_folded():
    """A call_tir of a module PrimFunc on constants (our index checks on constant indices):
    folded as TVM's FoldConstant does."""
    @I.ir_module
    class CallTir:
        @T.prim_func(private=True, s_tir=True)
        def double(a: T.Buffer((4,), "float32"), b: T.Buffer((4,), "float32")):
            for i in range(4):
                with T.sblock("b"):
                    vi = T.axis.spatial(4, i)
                    b[vi] = a[vi] * T.float32(2)

        @R.function
        def main(x: R.Tensor((4,), "float32")):
            cls = CallTir
            with R.dataflow():
                c = R.call_tir(cls.double, (R.const(np.arange(4, dtype="float32")),),
                               out_ty=R.Tensor((4,), "float32"))
                d = R.add(R.const(1.0, "float32"), R.const(2.0, "float32"))
                y = R.add(x, R.add(c, d))
                R.output(y)
            return y

    pass_ = FoldConstantsFirst()
    out = pass_(CallTir)
    assert pass_.kept is True
    tvm.ir.assert_structural_equal(out["main"], relax.transform.FoldConstant()(CallTir)["main"])
    (binding,) = out["main"].body.blocks[0].bindings
    np.testing.assert_array_equal(binding.value.args[1].value.numpy(), [3.0, 5.0, 7.0, 9.0])
