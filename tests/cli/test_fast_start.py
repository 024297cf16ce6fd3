"""``relax-memplan --help``, ``--version`` and bad arguments are answered without loading TVM,
onnx or numpy (the console entry imports the parser and the commands only; each command
imports what it calls when it runs)."""

import ast
import subprocess
import sys

import pytest

from tests.conftest import REPO_ROOT

HEAVY = ("tvm", "tvm_ffi", "onnx", "onnxruntime", "numpy", "yaml", "matplotlib", "numba")


def loaded_after(argv, before: str = "") -> tuple:
    """(exit status, the heavy modules loaded) of the console entry on ``argv``, in a fresh
    interpreter that first runs ``before``."""
    source = (f"{before}\nimport sys, relax_memplan_launch\n"
              f"try:\n    code = relax_memplan_launch.main({list(argv)!r})\n"
              f"except SystemExit as done:\n    code = done.code\n"
              f"print(code, sorted({{m.split('.')[0] for m in sys.modules}} & {set(HEAVY)!r}))\n")
    proc = subprocess.run([sys.executable, "-c", source], cwd=REPO_ROOT, capture_output=True,
                          text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr
    code, heavy = proc.stdout.strip().splitlines()[-1].split(" ", 1)
    return int(code), ast.literal_eval(heavy)


@pytest.mark.parametrize("argv, status", [
    (["--version"], 0), (["--help"], 0), (["compile", "--help"], 0), (["run", "--help"], 0),
    (["inspect", "--help"], 0), (["bench", "--help"], 0), (["compile", "--no-such-flag"], 2),
    (["no-such-command"], 2), ([], 2)])
def test_the_parser_alone_loads_no_tvm_onnx_or_numpy(argv, status):
    assert loaded_after(argv) == (status, [])


def test_a_heavy_module_loaded_is_seen():
    assert loaded_after(["--version"], before="import numpy") == (0, ["numpy"])
