"""choose_cuda_compiler: which CUDA compiler TVM's compile callback uses on a GPU host."""

import importlib

import pytest

from relax_memplan.compile.build import choose_cuda_compiler
from relax_memplan.errors import RelaxMemplanError

# the module (relax_memplan.compile.build is the function build, re-exported by the package)
build_module = importlib.import_module("relax_memplan.compile.build")


@pytest.fixture
def no_mode(monkeypatch):
    monkeypatch.delenv("TVM_CUDA_COMPILE_MODE", raising=False)
    monkeypatch.setattr(build_module.importlib.util, "find_spec", lambda name: None)
    return monkeypatch


def test_a_mode_already_set_is_kept(monkeypatch):
    monkeypatch.setenv("TVM_CUDA_COMPILE_MODE", "nvrtc")
    assert choose_cuda_compiler() is None
    assert build_module.os.environ["TVM_CUDA_COMPILE_MODE"] == "nvrtc"


def test_without_cuda_bindings_nvcc_is_chosen_and_said(no_mode):
    no_mode.setattr(build_module.shutil, "which", lambda name: "/usr/local/cuda/bin/nvcc")
    note = choose_cuda_compiler()
    assert "nvcc" in note and build_module.os.environ["TVM_CUDA_COMPILE_MODE"] == "nvcc"


def test_neither_bindings_nor_nvcc_is_one_clear_error(no_mode):
    no_mode.setattr(build_module.shutil, "which", lambda name: None)
    with pytest.raises(RelaxMemplanError, match="neither cuda-bindings .* nor nvcc"):
        choose_cuda_compiler()
