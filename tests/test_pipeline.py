"""The pipeline's phase lists: what runs before our fusion passes (compile time)."""

import tvm
from relax_memplan.pipeline import backend_phases, fusion_passes
from tests.transform.test_fold_constants_first import _Constant

LLVM = tvm.target.Target("llvm")


def _legalize_names(**kwargs):
    return [p.info.name for p in dict(backend_phases(LLVM, **kwargs))["legalize"]]


def test_constants_are_folded_once_before_the_fusion_passes():
    # the fusion passes' peak checks lower trial modules; a constant subgraph left unfolded was
    # evaluated again by FoldConstant in every one of them (gpt2-tiny: 1.9 CPU s each)
    names = _legalize_names(fusion=True)
    assert names[:2] == ["ClampEmptySlices", "FoldConstantsFirst"]
    fusion = [p.info.name for p in fusion_passes(LLVM)]
    assert names[2:2 + len(fusion)] == fusion
    # TVM's own FoldConstant still runs after LegalizeOps (what becomes foldable there)
    assert names.index("FoldConstant") > names.index("LegalizeOps")


def test_without_fusion_the_legalize_phase_keeps_tvms_order():
    names = _legalize_names(fusion=False)
    assert names.count("FoldConstant") == 1
    assert names.index("FoldConstant") > names.index("LegalizeOps")
    assert names[0] == "ClampEmptySlices"


def test_the_fusion_passes_see_a_constant_subgraph_folded():
    seen = []

    @tvm.transform.module_pass(opt_level=0, name="Spy")
    def spy(mod, _ctx):
        seen.append(mod)
        return mod

    phases = backend_phases(LLVM, fusion=True, fusion_pass_list=[spy])
    with LLVM:
        tvm.transform.Sequential(dict(phases)["legalize"][:3])(_Constant)
    (body,) = seen[0]["main"].body.blocks[0].bindings
    assert isinstance(body.value.args[1], tvm.ir.GenericConst)

