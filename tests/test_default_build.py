"""The default build is the fast one: our CPU schedules for this machine's CPU, with no flag, in
the CLI, the config, BuildOptions and get_pipeline; a named CPU or a portable build on request,
shown on the report's target line."""

import json

import numpy as np
import pytest
import tvm
from tvm import relax
from tvm.script import relax as R

from relax_memplan import targets
from relax_memplan.cli import EXIT_ERROR, main
from relax_memplan.compile import BuildOptions
from relax_memplan.config import Config, load_config
from relax_memplan.errors import ConfigError, TargetError
from relax_memplan.pipeline import backend_phases, get_pipeline
from relax_memplan.schedules import IS_SCHEDULED_ATTR, host_target


@tvm.script.ir_module
class Dense:
    @R.function
    def main(x: R.Tensor((8, 64), "float32"), w: R.Tensor((64, 32), "float32")):
        with R.dataflow():
            y = R.nn.relu(R.matmul(x, w))
            R.output(y)
        return y


def _legalize_names(**kwargs):
    return [p.info.name for p in dict(backend_phases(tvm.target.Target("llvm"),
                                                     **kwargs))["legalize"]]


def test_defaults_schedule_for_the_host_cpu():
    assert Config().schedule is True and Config().cpu == "host"
    assert BuildOptions().schedule is True
    used = BuildOptions().cpu_used
    assert used.source in ("host", "portable") and used.mcpu
    assert str(BuildOptions().tvm_target) == str(host_target())
    assert "FastBoundedMath" in _legalize_names() and "FastBoundedMath" not in _legalize_names(
        schedule=False)


def test_portable_and_named_cpus():
    portable = targets.resolve_cpu("portable")
    assert (portable.mcpu, portable.source) == ("generic", "portable")
    assert str(portable.target()) == str(tvm.target.Target("llvm"))
    named = targets.resolve_cpu("skylake-avx512")
    assert named.source == "given" and named.target().attrs["mcpu"] == "skylake-avx512"
    assert "--portable" in targets.resolve_cpu("host").describe() or \
        targets.resolve_cpu("host").source == "portable"


@pytest.mark.parametrize("cpu, match", [("no-such-cpu", "LLVM does not know this CPU"),
                                        ("two words", "is not a CPU"), ("", "is not a CPU"),
                                        (3, "is not a CPU")])
def test_a_bad_cpu_is_refused_with_the_choices(cpu, match):
    with pytest.raises(TargetError, match=match):
        targets.resolve_cpu(cpu)


def test_config_cpu_key_is_checked(tmp_path):
    path = tmp_path / "c.yaml"
    path.write_text("cpu: portable\nschedule: false\n")
    config = load_config(path)
    assert (config.cpu, config.schedule) == ("portable", False)
    path.write_text("cpu: [znver3]\n")
    with pytest.raises(ConfigError, match="cpu"):
        load_config(path)


def test_relax_pipeline_by_name_schedules_for_the_target_tvm_compile_enters():
    """``tvm.compile(mod, target, relax_pipeline="relax_memplan")``: the pipeline is made
    before tvm.compile enters the target, and schedules the kernels for that target."""
    target = host_target()
    with tvm.transform.PassContext():
        ex = tvm.compile(Dense, target, relax_pipeline="relax_memplan")
    rng = np.random.default_rng(0)
    x, w = (rng.standard_normal(s).astype("float32") for s in ((8, 64), (64, 32)))
    got = relax.VirtualMachine(ex, tvm.cpu())["main"](tvm.runtime.tensor(x),
                                                      tvm.runtime.tensor(w)).numpy()
    np.testing.assert_allclose(got, np.maximum(x @ w, 0), rtol=1e-5, atol=1e-5)
    with target:
        mod = get_pipeline()(Dense)
    kernels = [f for _, f in mod.functions_items() if isinstance(f, tvm.tirx.PrimFunc)
               and "matmul" in str(f.attrs.get("global_symbol", ""))]
    assert kernels and all(bool(f.attrs.get(IS_SCHEDULED_ATTR, False)) for f in kernels)


def test_cli_report_names_the_cpu_and_flags_override_it(tmp_path, capsys):
    assert main(["compile", "-q", "--no-compare", "--no-measure", "--portable",
                 "--report", str(tmp_path / "r.json")]) == 0
    out = capsys.readouterr().out
    assert "target llvm portable (any CPU of this architecture" in out
    report = json.loads((tmp_path / "r.json").read_text())
    assert (report["cpu"], report["cpu_source"]) == ("generic", "portable")
    assert main(["compile", "-q", "--no-compare", "--no-measure", "--no-schedule"]) == 0
    assert "this machine's CPU" in capsys.readouterr().out or host_target().attrs.get(
        "mcpu") is None


@pytest.mark.parametrize("argv, message", [
    (["--cpu", "no-such-cpu"], "LLVM does not know this CPU"),
    (["--target", "cuda", "--cpu", "znver3"], "--cpu znver3: only for --target llvm"),
    (["--target", "cuda", "--portable"], "--portable: only for --target llvm")])
def test_cli_refuses_a_bad_cpu_before_any_work(argv, message, capsys):
    assert main(["compile", *argv]) == EXIT_ERROR
    err = capsys.readouterr().err
    assert message in err and "importing" not in err


def test_a_bad_cpu_in_the_config_names_the_file_and_key_not_a_flag(tmp_path, capsys):
    config = tmp_path / "c.yaml"
    config.write_text("cpu: no-such-cpu\n")
    for command in ("compile", "bench"):
        assert main([command, "--config", str(config), "--no-onnxruntime"][:4 if command ==
                    "bench" else 3]) == EXIT_ERROR
        err = capsys.readouterr().err
        assert f"{config}: cpu 'no-such-cpu': LLVM does not know this CPU" in err, err
        assert "--cpu" not in err.split("LLVM")[0] and "importing" not in err
