"""No function over ~80 lines in the CLI and the compile layer: a longer one is two
functions. Lines are counted from ``def`` to the last line, docstring
included."""

import ast

from tests.conftest import REPO_ROOT

MAX_LINES = 80
CHECKED = sorted((REPO_ROOT / "relax_memplan" / "cli").glob("*.py")) + sorted(
    (REPO_ROOT / "relax_memplan" / "compile").glob("*.py"))


def long_functions(source: str, max_lines: int = MAX_LINES):
    """``[(name, lines)]`` of the functions (methods and nested ones too) longer than
    ``max_lines``."""
    return [(node.name, node.end_lineno - node.lineno + 1) for node in ast.walk(ast.parse(source))
            if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef))
            and node.end_lineno - node.lineno + 1 > max_lines]


def test_no_function_in_the_cli_or_compile_layer_is_over_80_lines():
    assert len(CHECKED) >= 9  # the cli and compile packages
    over = {path.name: found for path in CHECKED
            if (found := long_functions(path.read_text(encoding="utf-8")))}
    assert not over, f"functions over {MAX_LINES} lines (split them): {over}"


def test_a_long_function_is_found():
    body = "\n".join(f"        x{k} = {k}" for k in range(MAX_LINES))
    source = f"def short():\n    pass\n\nclass C:\n    def long(self):\n{body}\n"
    assert long_functions(source) == [("long", MAX_LINES + 1)]
    assert long_functions(source, max_lines=MAX_LINES + 1) == []
