"""schedules/_layout_copy: a packing PrimFunc that is a pure layout copy runs as numpy, with
the same bits as TVM's build of it; anything else is left to TVM."""

import numpy as np
import pytest
import tvm
from tvm.script import tirx as T

from relax_memplan.schedules import _fold_packing, prepack
from relax_memplan.schedules._layout_copy import layout_copy

from ..conftest import shared_model


def _packers(path, shapes):
    """The packing PrimFuncs ``SplitPrepackedWeights`` folds in the ``schedule=True`` build."""
    from relax_memplan.frontend import import_onnx
    from relax_memplan.pipeline import get_pipeline
    from relax_memplan.schedules import host_target

    found = {}
    init = _fold_packing.FoldPacking.__init__

    def _record(self, mod, packers):
        init(self, mod, packers)
        found.update(self.packers)

    mod, _info = import_onnx(path, shapes)
    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(_fold_packing.FoldPacking, "__init__", _record)
        get_pipeline(host_target(), schedule=True)(mod)
    return found


@pytest.fixture(scope="module")
def model_packers(vad_lstm_onnx):
    vad = vad_lstm_onnx
    return {**_packers(vad, {"feats": (1, 40, 256)}),
            **_packers(shared_model("bert-tiny-randw.onnx"),
                       {"input_ids": (1, 16), "attention_mask": (1, 16),
                        "token_type_ids": (1, 16)})}


def _tvm_result(func, weight):
    name = "packer"
    built = tvm.compile(tvm.IRModule({name: func.with_attr("global_symbol", name)}),
                        target={"kind": "llvm", "opt-level": 0})
    dst = func.params[1]
    out = tvm.runtime.empty([int(d) for d in dst.shape], str(dst.dtype))
    built[name](tvm.runtime.tensor(weight), out)
    return out.numpy()


def _weight(func, seed=0):
    src = func.params[0]
    rng = np.random.default_rng(seed)
    return rng.standard_normal([int(d) for d in src.shape]).astype(str(src.dtype))


def test_numpy_packing_is_bit_identical_to_tvm_on_model_packers(model_packers):
    assert len(model_packers) >= 4  # vad-lstm's one, bert-tiny's three
    for name, func in model_packers.items():
        copy = layout_copy(func)
        assert copy is not None, name
        weight = _weight(func)
        ours, ref = copy(weight), _tvm_result(func, weight)
        assert ours.dtype == ref.dtype and ours.shape == ref.shape, name
        assert ours.tobytes() == ref.tobytes(), name
        # not vacuous: the packed layout moves elements (a plain reshape would differ)
        assert ours.tobytes() != weight.tobytes(), name


def test_wrong_weight_shape_names_the_buffer(model_packers):
    func = next(iter(model_packers.values()))
    weight = _weight(func)
    with pytest.raises(ValueError, match=func.params[0].name):
        layout_copy(func)(weight[:-1])


@T.prim_func(s_tir=True)
def _scaled(a: T.Buffer((4, 8), "float32"), b: T.Buffer((2, 4, 4), "float32")):
    for i, j in T.grid(4, 8):
        with T.sblock("pack"):
            vi, vj = T.axis.remap("SS", [i, j])
            b[vj // 4, vi, vj % 4] = a[vi, vj] * T.float32(2)


@T.prim_func(s_tir=True)
def _gap(a: T.Buffer((4, 8), "float32"), b: T.Buffer((3, 4, 4), "float32")):
    for i, j in T.grid(4, 8):
        with T.sblock("pack"):
            vi, vj = T.axis.remap("SS", [i, j])
            b[vj // 4, vi, vj % 4] = a[vi, vj]


@T.prim_func(s_tir=True)
def _twice(a: T.Buffer((4, 8), "float32"), b: T.Buffer((2, 4, 4), "float32")):
    for i, j in T.grid(4, 8):
        with T.sblock("pack"):
            vi, vj = T.axis.remap("SS", [i, j])
            b[vj // 8, vi, vj % 4] = a[vi, vj]


@T.prim_func(s_tir=True)
def _out_of_bounds(a: T.Buffer((4, 8), "float32"), b: T.Buffer((2, 4, 4), "float32")):
    for i, j in T.grid(4, 8):
        with T.sblock("pack"):
            vi, vj = T.axis.remap("SS", [i, j])
            b[vj // 4, vi, vj % 4] = a[vi, vj + 1]


@T.prim_func(s_tir=True)
def _panels(a: T.Buffer((4, 8), "float32"), b: T.Buffer((2, 4, 4), "float32")):
    for i, j in T.grid(4, 8):
        with T.sblock("pack"):
            vi, vj = T.axis.remap("SS", [i, j])
            b[vj // 4, vi, vj % 4] = a[vi, vj]


def test_panel_copy_matches_tvm():
    weight = _weight(_panels, seed=1)
    assert layout_copy(_panels)(weight).tobytes() == _tvm_result(_panels, weight).tobytes()


@pytest.mark.parametrize("func", [_scaled, _gap, _twice, _out_of_bounds],
                         ids=["arithmetic", "element-never-written", "element-written-twice",
                              "read-out-of-bounds"])
def test_what_is_not_a_pure_copy_is_left_to_tvm(func):
    assert layout_copy(func) is None
