"""The import surface: version, top-level names, the pipeline registered with TVM."""

import ast
import re
import subprocess
import sys
import warnings

import pytest

from tests.conftest import REPO_ROOT, lower_to_alloc_form, shared_model


def test_version_is_written_once_and_setup_reads_it():
    import relax_memplan

    assert re.fullmatch(r"\d+\.\d+\.\d+.*", relax_memplan.__version__)
    setup_py = (REPO_ROOT / "setup.py").read_text()
    assert "version=VERSION" in setup_py and relax_memplan.__version__ not in setup_py


def test_cli_version_prints_the_package_version(capsys):
    import relax_memplan
    from relax_memplan.cli import main

    with pytest.raises(SystemExit) as exit_info:
        main(["--version"])
    assert exit_info.value.code == 0
    assert capsys.readouterr().out.strip() == f"relax-memplan {relax_memplan.__version__}"


def test_top_level_names_and_transform_passes_import():
    from relax_memplan import PlanDynamicMemory, PlanStaticMemory, get_pipeline, import_onnx
    from relax_memplan import transform
    from relax_memplan.frontend import import_onnx as frontend_import_onnx
    from relax_memplan.transform import SpecializeKernels  # noqa: F401

    assert import_onnx is frontend_import_onnx
    assert PlanStaticMemory is transform.PlanStaticMemory
    assert PlanDynamicMemory is transform.PlanDynamicMemory
    assert callable(get_pipeline)
    assert "SpecializeKernels" in transform.__all__
    assert PlanStaticMemory().info.name == "PlanStaticMemory"


def registered_passes(source: str):
    """``[(class name, registered name)]`` of the classes decorated with TVM's
    ``module_pass``/``function_pass`` in ``source`` (read with ``ast``, nothing imported)."""
    found = []
    for node in ast.walk(ast.parse(source)):
        if not isinstance(node, ast.ClassDef):
            continue
        for deco in node.decorator_list:
            func = deco.func if isinstance(deco, ast.Call) else deco
            if getattr(func, "attr", getattr(func, "id", "")) in ("module_pass", "function_pass"):
                names = [k.value.value for k in getattr(deco, "keywords", ()) if k.arg == "name"]
                found.append((node.name, names[0] if names else None))
    return found


def test_every_registered_pass_is_exported_from_transform_under_its_class_name():
    from relax_memplan import transform

    found = [p for path in sorted((REPO_ROOT / "relax_memplan" / "transform").glob("*.py"))
             for p in registered_passes(path.read_text(encoding="utf-8"))]
    assert len(found) >= 21
    assert [c for c, registered in found if registered != c] == []
    assert sorted(c for c, _ in found) == sorted(transform.__all__)
    for name, _ in found:
        assert getattr(transform, name).__name__ == name


def test_registered_passes_reads_the_registered_name_and_skips_plain_classes():
    source = ("@tvm.transform.module_pass(opt_level=0, name='Other')\nclass Mine:\n    pass\n"
              "class Plain:\n    pass\n")
    assert registered_passes(source) == [("Mine", "Other")]


@pytest.mark.parametrize("first", ["import relax_memplan", "import relax_memplan.pipeline",
                                   "from relax_memplan import PlanStaticMemory"])
def test_importing_the_package_registers_the_pipeline(first):
    """In a fresh interpreter: ``import relax_memplan`` (or any of its modules or names) makes
    the pipeline's name known to TVM."""
    src = (f"{first}\nimport tvm\n"
           "print(tvm.relax.get_pipeline('relax_memplan', target='llvm').info.name)\n")
    proc = subprocess.run([sys.executable, "-c", src], cwd=REPO_ROOT, capture_output=True,
                          text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.strip() == "RelaxMemplanPipeline_relax_memplan"


def test_plan_static_memory_before_call_tir_rewrite_warns_and_plans_nothing():
    import tvm
    from tvm import relax

    from relax_memplan import PlanStaticMemory
    from tests.analysis.test_liveness import BranchesAndViews

    legalized = relax.transform.LegalizeOps()(BranchesAndViews)  # call_tir, no alloc_tensor yet
    plan = PlanStaticMemory()
    with pytest.warns(UserWarning, match="after CallTIRRewrite"):
        out = plan(legalized)
    tvm.ir.assert_structural_equal(out, legalized)
    assert plan.plans == {}
    with warnings.catch_warnings():  # after CallTIRRewrite: plans, no warning
        warnings.simplefilter("error")
        PlanStaticMemory()(lower_to_alloc_form(BranchesAndViews))


def test_import_onnx_runs_the_preparation_steps_by_default_with_fixed_shapes():
    """magika imports from Python with fixed shapes as it does from the CLI; () opts out."""
    from relax_memplan import import_onnx
    from relax_memplan.errors import ModelLoadError

    path = shared_model("magika-1.0.3.onnx")
    mod, info = import_onnx(path)
    assert "main" in [gv.name_hint for gv in mod.get_global_vars()]
    assert not info.dynamic_dims_kept
    with pytest.raises(ModelLoadError):
        import_onnx(path, prepare_steps=())


def test_ctrl_c_while_the_cli_imports_is_one_line_and_exit_130(monkeypatch, capsys):
    # a Ctrl-C in the first second (TVM loading) printed a KeyboardInterrupt traceback
    import importlib

    import relax_memplan_launch

    def interrupted(name):
        raise KeyboardInterrupt

    monkeypatch.setattr(importlib, "import_module", interrupted)
    assert relax_memplan_launch.main(["--version"]) == 130
    assert capsys.readouterr().err == "relax-memplan: interrupted\n"


def test_console_entry_runs_the_cli(capsys):
    import relax_memplan_launch
    from relax_memplan import __version__

    with pytest.raises(SystemExit) as done:  # argparse's --version exits
        relax_memplan_launch.main(["--version"])
    assert done.value.code == 0
    assert __version__ in capsys.readouterr().out
