"""The house's size limits hold: no module of storelib, datasources or jobs over 600 lines, no function
over 100 (a longer one is split at its separable steps; tests/test_layers.py holds the folders to 16
modules)."""

from __future__ import annotations

import ast
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
PACKAGES = ("storelib", "datasources", "jobs")
MAX_MODULE_LINES = 600
MAX_FUNCTION_LINES = 100


def _modules() -> list[Path]:
    return sorted(p for top in PACKAGES for p in (REPO / top).rglob("*.py") if "__pycache__" not in p.parts)


def long_functions(source: str) -> list[tuple[str, int]]:
    """(name, lines) of every function or method longer than the limit, decorators and docstring included."""
    out = []
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
            first = min([node.lineno, *(d.lineno for d in node.decorator_list)])
            n = node.end_lineno - first + 1
            if n > MAX_FUNCTION_LINES:
                out.append((node.name, n))
    return out


def test_no_module_is_over_600_lines():
    long = [f"{p.relative_to(REPO)}: {n}" for p in _modules() if (n := len(p.read_text().splitlines())) > MAX_MODULE_LINES]
    assert not long, "\n".join(long)


def test_no_function_is_over_100_lines():
    long = [f"{p.relative_to(REPO)}: {name} {n} lines" for p in _modules() for name, n in long_functions(p.read_text())]
    assert not long, "\n".join(long)


def test_the_function_limit_counts_what_it_should():
    body = "\n".join(f"    x{i} = {i}" for i in range(98))
    assert long_functions(f"def f():\n{body}\n    return 0\n") == []  # 100 lines
    assert long_functions(f"@dec\ndef f():\n{body}\n    return 0\n") == [("f", 101)]
    assert long_functions(f"class C:\n    def m(self):\n{body.replace('    ', '        ')}\n        y = 1\n"
                          "        return 0\n") == [("m", 101)]
