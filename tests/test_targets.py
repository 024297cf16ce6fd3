"""The CUDA arch of a cuda build: given (checked), else the installed GPU's, else sm_80."""

import pytest
import tvm

from relax_memplan import targets
from relax_memplan.cli import EXIT_ERROR, main
from relax_memplan.compile import BuildOptions
from relax_memplan.config import load_config
from relax_memplan.errors import ConfigError, TargetError


@pytest.mark.parametrize("arch", ["sm_80", "sm_90a", "sm_100", "sm_75"])
def test_cuda_arch_names_are_accepted(arch):
    assert targets.check_cuda_arch(arch) == arch


@pytest.mark.parametrize("arch", ["banana", "sm_8", "90", "sm_090", "SM_80", "sm_80 ", None, 80])
def test_a_bad_cuda_arch_names_the_option_and_value(arch):
    with pytest.raises(TargetError, match=r"--cuda-arch .* is not a CUDA architecture"):
        targets.check_cuda_arch(arch)


def test_installed_gpu_arch_reaches_the_build_target(monkeypatch):
    monkeypatch.setattr(targets, "installed_cuda_arch", lambda: "sm_90")
    used = targets.resolve_cuda_arch()
    assert (used.arch, used.source) == ("sm_90", "installed GPU")
    options = BuildOptions(target="cuda")
    assert options.tvm_target.kind.name == "cuda"
    assert str(options.tvm_target.attrs["arch"]) == "sm_90"
    assert options.cuda_arch_used.describe() == "sm_90 (the installed GPU's)"


def test_without_a_gpu_the_documented_default_is_used(monkeypatch):
    monkeypatch.setattr(targets, "installed_cuda_arch", lambda: None)
    options = BuildOptions(target="cuda")
    assert str(options.tvm_target.attrs["arch"]) == targets.DEFAULT_CUDA_ARCH == "sm_80"
    assert "the default: no CUDA GPU here" in options.cuda_arch_used.describe()


def test_a_given_arch_wins_over_the_installed_gpu(monkeypatch):
    monkeypatch.setattr(targets, "installed_cuda_arch", lambda: "sm_90")
    options = BuildOptions(target="cuda", cuda_arch="sm_86")
    assert str(options.tvm_target.attrs["arch"]) == "sm_86"
    assert BuildOptions(target="llvm", cuda_arch="sm_86").cuda_arch_used is None
    with pytest.raises(TargetError, match="'sm86'"):
        BuildOptions(target="cuda", cuda_arch="sm86").tvm_target


@pytest.mark.skipif(not tvm.cuda(0).exist, reason="needs a CUDA GPU")
def test_the_real_installed_gpu_arch_is_found():
    expected = "sm_" + tvm.cuda(0).compute_version.replace(".", "")
    assert targets.installed_cuda_arch() == expected
    assert str(BuildOptions(target="cuda").tvm_target.attrs["arch"]) == expected


def test_config_cuda_arch_is_checked(tmp_path):
    path = tmp_path / "c.yaml"
    path.write_text("target: cuda\ncuda_arch: sm_90\n")
    assert load_config(path).cuda_arch == "sm_90"
    path.write_text("cuda_arch: banana\n")
    with pytest.raises(ConfigError, match=r"c.yaml: cuda_arch 'banana' is not a CUDA architecture"):
        load_config(path)


@pytest.mark.parametrize("argv, words", [
    (["--target", "cuda", "--cuda-arch", "banana"], "--cuda-arch 'banana' is not a CUDA architecture"),
    (["--cuda-arch", "sm_90"], "--cuda-arch sm_90: only for --target cuda"),
])
def test_bad_cuda_arch_on_the_command_line_is_one_line(capsys, argv, words):
    assert main(["compile", "-q"] + argv) == EXIT_ERROR
    err = capsys.readouterr().err
    assert words in err and len(err.strip().splitlines()) == 1
