"""Layer norm / RMS norm built with our CPU schedules (VectorRowReduction) and compared with
numpy, run in a subprocess by test_cpu_reduction.py so that an out-of-bounds store fails a
test instead of killing pytest."""

import numpy as np
import tvm
from tvm import relax, tirx

from relax_memplan.pipeline import get_pipeline
from relax_memplan.schedules import host_target


def norm_module(shape, kind):
    """Relax ``layer_norm`` / ``rms_norm`` over the last axis of ``x: shape`` (dims may be
    ``tirx.Var``), gamma and beta as parameters."""
    width = int(shape[-1])
    x = relax.Var("x", relax.TensorType(list(shape), "float32"))
    g = relax.Var("g", relax.TensorType([width], "float32"))
    b = relax.Var("b", relax.TensorType([width], "float32"))
    bb = relax.BlockBuilder()
    with bb.function("main", [x, g, b]):
        with bb.dataflow():
            if kind == "layer_norm":
                y = relax.op.nn.layer_norm(x, g, b, axes=[-1], epsilon=1e-5)
            else:
                y = relax.op.add(relax.op.nn.rms_norm(x, g, axes=[-1], epsilon=1e-5), b)
            out = bb.emit_output(bb.emit(y))
        bb.emit_func_output(out)
    return bb.get()


def reference(x, g, b, kind):
    x64 = x.astype("float64")
    if kind == "layer_norm":
        mean = x64.mean(-1, keepdims=True)
        var = ((x64 - mean) ** 2).mean(-1, keepdims=True)
        return (x64 - mean) / np.sqrt(var + 1e-5) * g + b
    return x64 / np.sqrt((x64 ** 2).mean(-1, keepdims=True) + 1e-5) * g + b


def _check(shape, kind, run_shapes):
    target = host_target()
    ex = tvm.compile(norm_module(shape, kind), target,
                     relax_pipeline=get_pipeline(target, schedule=True))
    vm = relax.VirtualMachine(ex, tvm.cpu())
    rng = np.random.default_rng(0)
    for _ in range(2):  # repeated: heap damage often shows on a later allocation
        for run in run_shapes:
            x = (rng.standard_normal(run) * 3 + 1).astype("float32")
            g = rng.standard_normal(run[-1]).astype("float32")
            b = rng.standard_normal(run[-1]).astype("float32")
            out = vm["main"](*[tvm.runtime.tensor(v) for v in (x, g, b)]).numpy()
            np.testing.assert_allclose(out, reference(x, g, b, kind), rtol=1e-4, atol=1e-4,
                                       err_msg=f"{kind} {run}")


def check_norms():
    rows = tirx.Var("rows", "int64")
    for kind in ("layer_norm", "rms_norm"):
        _check((7, 100), kind, [(7, 100)])            # 4 lanes of partial sums, serial rows
        _check((3, 37), kind, [(3, 37)])              # no lane count divides 37: serial sums
        _check((2, 200, 768), kind, [(2, 200, 768)])  # parallel rows (above the threshold)
        _check((rows, 768), kind, [(1, 768), (5, 768), (300, 768)])  # symbolic rows
    print("NORMS OK")
