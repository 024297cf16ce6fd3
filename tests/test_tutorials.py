"""Every tutorial notebook runs top to bottom (code cells executed in order, in one namespace)."""

import json
from pathlib import Path

import pytest

TUTORIALS = sorted((Path(__file__).resolve().parents[1] / "tutorials").glob("*.ipynb"))


@pytest.mark.parametrize("notebook", TUTORIALS, ids=lambda p: p.stem)
def test_tutorial_runs(notebook, tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    cells = json.loads(notebook.read_text(encoding="utf-8"))["cells"]
    namespace = {"__name__": "__tutorial__"}
    code_cells = [c for c in cells if c["cell_type"] == "code"]
    assert code_cells, f"{notebook.name} has no code"
    for k, cell in enumerate(code_cells):
        source = "".join(cell["source"])
        exec(compile(source, f"{notebook.name}[cell {k}]", "exec"), namespace)  # noqa: S102
