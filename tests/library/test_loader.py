"""load_library: verified, loaded, the embedded constants' file pages handed back, and the
outputs unchanged (also for a second load of the same file after the pages were dropped)."""

import os
import sys

import numpy as np
import pytest
import tvm
from tvm import relax

from relax_memplan.errors import ModelLoadError
from relax_memplan.library import load_library, release_embedded_constants

from .conftest import reference

linux_only = pytest.mark.skipif(not sys.platform.startswith("linux"), reason="madvise, smaps")


def _mapped_resident_bytes(path) -> int:
    """Resident bytes of this process's mappings of ``path`` (``/proc/self/smaps``)."""
    real, total, inside = os.path.realpath(path), 0, False
    with open("/proc/self/smaps") as f:
        for line in f:
            fields = line.split()
            if "-" in fields[0] and len(fields) >= 5:  # a mapping's header line
                inside = len(fields) >= 6 and os.path.realpath(fields[-1]) == real
            elif inside and fields[0] == "Rss:":
                total += int(fields[1]) * 1024
    return total


def _call(vm, x):
    return vm["main"](tvm.runtime.tensor(x)).numpy()


@linux_only
def test_load_library_hands_back_the_embedded_constants_pages(dense_libraries, tmp_path):
    library = tmp_path / "fresh.so"  # a copy: no other test of this process mapped it
    library.write_bytes(dense_libraries[0].read_bytes())
    module = tvm.runtime.load_module(str(library))
    held = _mapped_resident_bytes(library)
    released = release_embedded_constants(library)
    after = _mapped_resident_bytes(library)
    assert released >= 64 * 1024 - 2 * 4096  # the 64 KiB weight, less the partial end pages
    assert after <= held - released
    x = np.random.default_rng(1).standard_normal((4, 64)).astype("float32")
    np.testing.assert_allclose(_call(relax.VirtualMachine(module, tvm.cpu()), x),
                               reference(0, x), rtol=1e-5, atol=1e-5)


def test_outputs_after_release_and_after_a_second_load(dense_libraries):
    loaded = load_library(dense_libraries[0])
    x = np.random.default_rng(2).standard_normal((4, 64)).astype("float32")
    first = _call(loaded.vm, x)
    np.testing.assert_allclose(first, reference(0, x), rtol=1e-5, atol=1e-5)
    again = tvm.runtime.load_module(str(dense_libraries[0]))  # reads the dropped pages anew
    np.testing.assert_array_equal(_call(relax.VirtualMachine(again, tvm.cpu()), x), first)
    assert loaded.manifest is not None and loaded.manifest.inputs[0].name == "x"


def test_release_is_a_no_op_for_a_library_not_loaded_here(dense_libraries, tmp_path):
    other = tmp_path / "never_loaded.so"
    other.write_bytes(dense_libraries[1].read_bytes())
    assert release_embedded_constants(other) == 0
    assert release_embedded_constants(tmp_path / "missing.so") == 0


def test_load_library_of_a_missing_file_is_one_line(tmp_path):
    with pytest.raises(ModelLoadError, match="no such library file"):
        load_library(tmp_path / "nope.so")


def test_load_library_works_with_tvms_runtime_library_alone(dense_libraries, tmp_path):
    """A deployment imports TVM's runtime only (TVM_USE_RUNTIME_LIB=1: no compiler, about
    180 MiB less resident); the loader and the manifest checks need nothing more."""
    import subprocess

    x = np.random.default_rng(4).standard_normal((4, 64)).astype("float32")
    np.save(tmp_path / "x.npy", x)
    code = ("import sys, numpy as np, tvm; from relax_memplan.library import load_library; "
            "assert tvm.base._RUNTIME_ONLY; lib = load_library(sys.argv[1]); "
            "np.save(sys.argv[3], lib.vm['main'](tvm.runtime.tensor(np.load(sys.argv[2]))).numpy())")
    env = dict(os.environ, TVM_USE_RUNTIME_LIB="1")
    proc = subprocess.run([sys.executable, "-c", code, str(dense_libraries[0]),
                           str(tmp_path / "x.npy"), str(tmp_path / "y.npy")],
                          capture_output=True, text=True, env=env)
    assert proc.returncode == 0, proc.stderr
    np.testing.assert_allclose(np.load(tmp_path / "y.npy"), reference(0, x), rtol=1e-5, atol=1e-5)
