"""host_target(): the host CPU, and LLVM's gather-forming auto-vectoriser turned off on x86 (an
unscheduled max-pool compiled with gathers ran 2.5x slower than plain ``llvm``)."""

import pytest
import tvm
from tvm import relax, tirx

from relax_memplan.schedules import NO_GATHER_FEATURES, host_target
from tests.schedules.fallback_checks import _module

X86 = str(tvm.target.codegen.llvm_get_system_triple()).startswith("x86_64")
HAS_AVX2 = X86 and bool(tvm.target.codegen.llvm_cpu_has_features("avx2", host_target()))


def _max_pool_kernel():
    """The legalized 2x2/2 max-pool of mnist (1, 8, 28, 28): no rule schedules it."""
    mod = _module([(1, 8, 28, 28)], lambda x: relax.op.nn.max_pool2d(x, 2, 2))
    (func,) = [f for _, f in relax.transform.LegalizeOps()(mod).functions_items()
               if isinstance(f, tirx.PrimFunc)]
    return func.with_attr("global_symbol", "pool")


def _gathers(target) -> int:
    lib = tvm.tirx.build(tvm.IRModule({"pool": _max_pool_kernel()}), target=target)
    return lib.inspect_source("asm").count("gather")


@pytest.mark.skipif(not X86, reason="x86 tuning feature")
def test_host_target_prefers_no_gather_on_x86():
    assert [str(f) for f in host_target().attrs["mattr"]] == list(NO_GATHER_FEATURES)
    assert "mattr" not in host_target(prefer_no_gather=False).attrs


@pytest.mark.skipif(not HAS_AVX2, reason="needs a host CPU with vector gathers")
def test_unscheduled_pool_compiles_without_gathers():
    assert _gathers(host_target()) == 0
    if _gathers(host_target(prefer_no_gather=False)) == 0:
        # LLVM's cost model for this CPU (znver3) emits no gathers here even when allowed
        pytest.skip("this CPU's LLVM emits no gathers for the pool without the flag either")
    assert _gathers(host_target(prefer_no_gather=False)) > 0  # what the flag removes
