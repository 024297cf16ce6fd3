"""Which kernels are plain concatenations (structural match with TVM's legalized R.concat),
and which parameters a kernel writes."""

import tvm
from tvm import relax, s_tir
from tvm.script import ir as I
from tvm.script import relax as R

from relax_memplan.analysis.concat import concat_axis, concat_table, written_params


@I.ir_module
class Ops:
    @R.function
    def main(a: R.Tensor((1, 4, 8), "float32"), b: R.Tensor((1, 2, 8), "float32"),
             c: R.Tensor((3, 8), "float32")):
        with R.dataflow():
            x = R.concat([a, b], axis=1)
            y = R.concat([c, c], axis=0)
            z = R.split(x, 2, axis=1)
            w = R.add(a, a)
            t = R.permute_dims(c)
            R.output(x, y, z, w, t)
        return (x, y, z, w, t)


def _legalized():
    return relax.transform.LegalizeOps()(Ops)


def _kernel(mod, prefix):
    return next(f for gv, f in mod.functions_items()
                if isinstance(f, tvm.tirx.PrimFunc) and gv.name_hint.startswith(prefix))


def test_legalized_concats_are_found_with_their_axis_and_nothing_else():
    mod = _legalized()
    table = concat_table(mod)
    axes = sorted(table.values())
    assert axes == [0, 1], table
    assert all(name.startswith("concatenate") for name in table)


def test_a_scheduled_concat_is_not_a_concat():
    func = _kernel(_legalized(), "concatenate")
    assert concat_axis(func) is not None
    sch = s_tir.Schedule(func)
    loops = sch.get_loops(sch.get_sblock("T_concat"))
    sch.reorder(loops[-1], loops[-2])
    assert concat_axis(sch.mod["main"]) is None


def test_split_add_and_transpose_are_not_concats():
    mod = _legalized()
    for prefix in ("split", "add", "transpose"):
        assert concat_axis(_kernel(mod, prefix)) is None, prefix


def test_written_params_are_the_outputs():
    mod = _legalized()
    assert written_params(_kernel(mod, "concatenate")) == {2}
    assert written_params(_kernel(mod, "split")) == {1, 2}
    assert written_params(_kernel(mod, "add")) == {2}
