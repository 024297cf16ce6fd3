"""Every tutorial notebook runs top to bottom in a Jupyter kernel (nbclient), and is committed
with the outputs of such a run, so that a reader on GitHub sees numbers and plots.

Refresh the outputs after editing a notebook:
``PYTHONPATH=$PWD jupyter execute --inplace tutorials/NN_name.ipynb`` (from the repository root;
the kernel runs in ``tutorials/`` and must import this checkout's package).
"""

import os
from pathlib import Path

import pytest

nbformat = pytest.importorskip("nbformat", reason="pip install -e .[test] (nbformat, nbclient, ipykernel)")
nbclient = pytest.importorskip("nbclient", reason="pip install -e .[test] (nbformat, nbclient, ipykernel)")

ROOT = Path(__file__).resolve().parents[1]
TUTORIALS = sorted((ROOT / "tutorials").glob("*.ipynb"))
CELL_TIMEOUT_S = 300
SLOW_TUTORIALS = {"04_specialization", "05_serving", "06_cuda", "07_import_failures"}
"""Run under ``-m slow`` only (15-20 s each): what they show has its own tests
(tests/transform/test_specialize_kernels.py, tests/tools/test_run.py, tests/test_cuda_build.py,
tests/frontend/); the default suite runs the other notebooks and checks every one's outputs."""


def _code_cells(notebook):
    return [c for c in notebook.cells if c.cell_type == "code"]


def test_tutorials_found():
    assert len(TUTORIALS) >= 7, [p.name for p in TUTORIALS]  # 01-07: a lost notebook fails here


@pytest.mark.parametrize("path", [
    pytest.param(p, marks=pytest.mark.slow) if p.stem in SLOW_TUTORIALS else p
    for p in TUTORIALS], ids=lambda p: p.stem)
def test_tutorial_runs(path, tmp_path, monkeypatch):
    # the kernel is another process, started in tmp_path: it imports this checkout's package
    monkeypatch.setenv("PYTHONPATH", os.pathsep.join(filter(None, [str(ROOT), os.environ.get("PYTHONPATH")])))
    notebook = nbformat.read(path, as_version=4)
    assert _code_cells(notebook), f"{path.name} has no code"
    client = nbclient.NotebookClient(notebook, timeout=CELL_TIMEOUT_S, kernel_name="python3",
                                     resources={"metadata": {"path": str(tmp_path)}})
    client.execute()  # raises CellExecutionError naming the failing cell


@pytest.mark.parametrize("path", TUTORIALS, ids=lambda p: p.stem)
def test_tutorial_committed_with_outputs(path):
    cells = _code_cells(nbformat.read(path, as_version=4))
    assert all(c.execution_count is not None for c in cells), \
        f"{path.name} has cells never run: jupyter execute --inplace {path.name}"
    outputs = [o for c in cells for o in c.outputs]
    assert outputs, f"{path.name} has no outputs: jupyter execute --inplace {path.name}"
    errors = [o for o in outputs if o.output_type == "error"]
    assert not errors, f"{path.name} was committed with an error: {errors[0].ename}"
