"""RowReduction: dlight's CPU Reduction kept for multi-row softmax / layer norm, rejected where
its parallel loop would run over the columns of a single row (a quadratic kernel)."""

import numpy as np
import pytest
import tvm
from tvm import relax, tirx

from relax_memplan.pipeline import get_pipeline
from relax_memplan.schedules import RowReduction, host_target


def _module(shape, kind):
    x = relax.Var("x", relax.TensorType(list(shape), "float32"))
    bb = relax.BlockBuilder()
    with bb.function("main", [x]):
        with bb.dataflow():
            if kind == "softmax":
                y = relax.op.nn.softmax(x, axis=-1)
            else:
                width = int(shape[-1])
                y = relax.op.nn.layer_norm(x, relax.const(np.ones(width, "float32")),
                                           relax.const(np.zeros(width, "float32")), axes=[-1])
            out = bb.emit_output(bb.emit(y))
        bb.emit_func_output(out)
    return bb.get()


def _kernel(shape, kind):
    mod = relax.transform.LegalizeOps()(_module(shape, kind))
    (func,) = [f for _, f in mod.functions_items() if isinstance(f, tirx.PrimFunc)]
    return func


@pytest.mark.parametrize("kind", ["softmax", "layer_norm"])
@pytest.mark.parametrize("shape,applies", [((1, 1000), False), ((1, 1, 128), False),
                                           ((8, 128), True), ((2, 4, 16, 16), True),
                                           ((tirx.Var("n", "int64"), 128), True)])
def test_row_reduction_only_parallel_over_rows(kind, shape, applies):
    with host_target() as target:
        assert (RowReduction().apply(_kernel(shape, kind), target, False) is not None) == applies


def test_one_row_softmax_matches_unscheduled_build():
    mod = _module((1, 1000), "softmax")
    x = np.random.default_rng(0).standard_normal((1, 1000), dtype="float32") * 30
    outs = []
    for schedule in (False, True):
        target = host_target()
        ex = tvm.compile(mod, target, relax_pipeline=get_pipeline(target, schedule=schedule))
        outs.append(relax.VirtualMachine(ex, tvm.cpu())["main"](tvm.runtime.tensor(x)).numpy())
    np.testing.assert_allclose(outs[1], outs[0], rtol=1e-5, atol=1e-7)
