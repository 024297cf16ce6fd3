"""RefuseSelfDefiningCasts: a match_cast that defines a dim from itself is one CompileError,
not the segfault TVM 0.27's FuseTIR dies of."""

import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
import tvm
from tvm import relax, tirx

from relax_memplan.errors import CompileError
from relax_memplan.pipeline import get_pipeline
from relax_memplan.transform import RefuseSelfDefiningCasts
from relax_memplan.transform.refuse_self_defining_casts import self_defining_casts


def _module(self_defining: bool) -> tvm.IRModule:
    """x[n] + repeat(x[::4], 4): the second has (n + 3) // 4 * 4 elements, equal to n only
    for a multiple of 4; the two are matched by a run-time cast one way or the other."""
    n = tirx.Var("n", "int64")
    bb = relax.BlockBuilder()
    x = relax.Var("x", relax.TensorType([n], "float32"))
    with bb.function("main", [x]):
        with bb.dataflow():
            y = bb.emit(relax.op.strided_slice(x, axes=[0], begin=[0], end=[n], strides=[4]))
            z = bb.emit(relax.op.repeat(y, 4, axis=0))
            if self_defining:
                w = bb.match_cast(z, relax.TensorType([n], "float32"))
                out = bb.emit_output(relax.op.add(x, w))
            else:
                xc = bb.match_cast(x, relax.TensorType(list(z.ty.shape.values), "float32"))
                out = bb.emit_output(relax.op.add(xc, z))
        bb.emit_func_output(out)
    return bb.get()


MESSAGE = (r"main: match_cast of lv2 defines symbolic var n from an expression of itself "
           r"\(\(n \+ 3\) // 4 \* 4\); TVM 0.27 crashes on such a cast")


def test_a_self_defining_cast_is_refused_before_tvm_crashes():
    # through tvm.compile, TVM's FFI hands the pass's error on as a RuntimeError
    with pytest.raises(Exception, match=MESSAGE):
        tvm.compile(_module(True), "llvm", relax_pipeline=get_pipeline("llvm"))


def test_our_build_gives_one_line_naming_the_cast():
    from relax_memplan.compile.build import build
    from relax_memplan.pipeline import PipelineOptions, PipelinePasses

    with pytest.raises(CompileError, match=MESSAGE) as info:
        build(_module(True), tvm.target.Target("llvm"), PipelineOptions(), PipelinePasses())
    assert "\n" not in str(info.value)


def test_our_build_refuses_the_cast_before_building_not_after_a_retry(monkeypatch):
    import importlib

    from relax_memplan.pipeline import PipelineOptions, PipelinePasses

    build_module = importlib.import_module("relax_memplan.compile.build")  # not the function
    calls = []
    monkeypatch.setattr(build_module, "compile_module", lambda *a, **k: calls.append(a))
    with pytest.raises(CompileError, match=MESSAGE):
        build_module.build(_module(True), tvm.target.Target("llvm"), PipelineOptions(),
                           PipelinePasses())
    assert calls == []  # neither our build nor the TVM-planner retry ran


@pytest.mark.parametrize("planner", ["relax_memplan", "tvm"])
def test_the_cast_the_other_way_builds_and_runs(planner):
    mod = _module(False)
    assert self_defining_casts(mod["main"]) == []
    assert RefuseSelfDefiningCasts()(mod).same_as(mod)
    ex = tvm.compile(mod, "llvm", relax_pipeline=get_pipeline("llvm", planner=planner))
    x = np.arange(8, dtype="float32")
    out = relax.VirtualMachine(ex, tvm.cpu())["main"](tvm.runtime.tensor(x)).numpy()
    np.testing.assert_array_equal(out, x + np.repeat(x[::4], 4))


def test_only_the_self_defining_cast_is_found():
    found = self_defining_casts(_module(True)["main"])
    assert [(b.var.name, str(v)) for b, v, _ in found] == [("lv2", "n")]


def test_tvm_still_dies_on_a_cast_that_defines_a_dim_from_itself():
    """Why the pass exists and the ONNX converters never write such a cast: TVM 0.27's own
    pipeline dies on it (CanonicalizeBindings recurses without end), so it runs in a child
    process. When this starts to fail, TVM is fixed and the pass can go."""
    script = ("import tvm\n"
              "from tests.transform.test_refuse_self_defining_casts import _module\n"
              "tvm.compile(_module(True), 'llvm')\n"
              "print('built')\n")
    done = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True,
                          timeout=300, cwd=Path(__file__).resolve().parents[2])
    assert done.returncode != 0 and "built" not in done.stdout
    assert "No module named" not in done.stderr  # the child really built the module
