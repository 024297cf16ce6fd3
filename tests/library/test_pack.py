"""Libraries packed with ``.incbin`` (relax_memplan.library.pack) hold TVM's own serialized
executable under TVM's symbol, and load and run as a library TVM packs."""

import ctypes
import os

import numpy as np
import pytest
import tvm
from tvm.runtime import _ffi_api

from relax_memplan import get_pipeline, import_onnx
from relax_memplan.library.elf import check_elf_complete
from relax_memplan.library.loader import EMBEDDED_SYMBOL
from relax_memplan.library.pack import pack_imports, pack_imports_hook

from .conftest import dense_model



def _embedded_bytes(path) -> bytes:
    """The library's ``__tvm_ffi__library_bin`` (its u64 length, then the bytes), read
    through the dynamic loader as TVM's loader finds it."""
    handle = ctypes.CDLL(str(path), mode=os.RTLD_LOCAL | os.RTLD_NOW)
    head = ctypes.c_uint64.in_dll(handle, EMBEDDED_SYMBOL)
    return ctypes.string_at(ctypes.addressof(head), 8 + head.value)


@pytest.fixture(scope="module")
def executable():
    mod, _ = import_onnx(dense_model(0), {"x": (4, 64)})
    return tvm.compile(mod, "llvm", relax_pipeline=get_pipeline("llvm"))


def test_packed_library_holds_tvms_bytes_and_runs_as_tvms(executable, tmp_path):
    ours, theirs = tmp_path / "ours.so", tmp_path / "theirs.so"
    executable.export_library(str(ours), fpack_imports=pack_imports)
    executable.export_library(str(theirs))
    check_elf_complete(ours)
    expected = _ffi_api.ModulePackImportsToTensor(executable.mod).numpy().tobytes()
    assert _embedded_bytes(ours) == expected
    assert _embedded_bytes(theirs) == expected  # the same array as TVM's packing
    x = tvm.runtime.tensor(np.random.default_rng(0).standard_normal((4, 64)).astype("float32"))
    outputs = [tvm.relax.VirtualMachine(tvm.runtime.load_module(str(p)), tvm.cpu())["main"](x)
               .numpy() for p in (ours, theirs)]
    np.testing.assert_array_equal(outputs[0], outputs[1])


def test_the_hook_is_tvms_packing_for_another_os_and_a_system_library_is_refused():
    assert pack_imports_hook(tvm.target.Target("llvm")) is pack_imports
    assert pack_imports_hook(None) is pack_imports
    assert pack_imports_hook(tvm.target.Target({"kind": "llvm",
                                                "mtriple": "aarch64-apple-darwin"})) is None
    with pytest.raises(ValueError, match="system library"):
        pack_imports(None, True, "", "/tmp")
