"""Meta-tests pinning `verdicts`: a sorted, complete `__all__`; stdlib-only, I/O-free source."""

from __future__ import annotations

import ast
import importlib
import sys
from pathlib import Path

import pytest

import verdicts

PACKAGE = Path(verdicts.__file__).parent
MODULES = sorted(p.stem for p in PACKAGE.glob("*.py") if p.stem != "__init__")

# stdlib, but I/O, clocks or randomness: a verdict takes values and returns values
IMPURE_MODULES = {
    "asyncio", "glob", "http", "io", "logging", "multiprocessing", "os", "pathlib", "random", "shutil",
    "socket", "subprocess", "sys", "tempfile", "threading", "time", "urllib",
}
IMPURE_CALLS = {"__import__", "breakpoint", "eval", "exec", "input", "open", "print"}


def foreign_imports(source: str) -> list[str]:
    """Imports that are not the stdlib's pure modules or the package's own siblings."""
    bad: list[str] = []
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.Import):
            names = [alias.name for alias in node.names]
        elif isinstance(node, ast.ImportFrom):
            if node.level == 1:  # from .sibling import x
                continue
            names = ["." * node.level + (node.module or "")]
        else:
            continue
        for name in names:
            top = name.split(".")[0]
            if top == "kern":  # the root exception, the token ids: leaves (tests/test_imports.py), no I/O
                continue
            if name.startswith(".") or top not in sys.stdlib_module_names or top in IMPURE_MODULES:
                bad.append(name)
    return bad


def impure_calls(source: str) -> list[str]:
    """Calls of the builtins that do I/O or run code."""
    return [
        node.func.id
        for node in ast.walk(ast.parse(source))
        if isinstance(node, ast.Call) and isinstance(node.func, ast.Name) and node.func.id in IMPURE_CALLS
    ]


def public_definitions(source: str) -> set[str]:
    """Public names a module defines at top level (functions, classes, constants), not imports."""
    names: set[str] = set()
    for node in ast.parse(source).body:
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
            names.add(node.name)
        elif isinstance(node, ast.Assign):
            names.update(t.id for t in node.targets if isinstance(t, ast.Name))
        elif isinstance(node, ast.AnnAssign) and isinstance(node.target, ast.Name):
            names.add(node.target.id)
    return {n for n in names if not n.startswith("_")}


@pytest.mark.parametrize(
    "source, bad",
    [
        pytest.param("import math\nfrom collections.abc import Sequence", [], id="stdlib-pure"),
        pytest.param("from . import same\nfrom .ulp import ulp_of", [], id="siblings"),
        pytest.param("import pool.pages", ["pool.pages"], id="project-package"),
        pytest.param("from e2e.driver import run", ["e2e.driver"], id="project-from"),
        pytest.param("from .. import pool", [".."], id="parent-relative"),
        pytest.param("import numpy as np", ["numpy"], id="third-party"),
        pytest.param("import os, math", ["os"], id="io-module"),
        pytest.param("def f():\n    import subprocess", ["subprocess"], id="nested-import"),
    ],
)
def test_foreign_imports_detects(source: str, bad: list[str]) -> None:
    assert foreign_imports(source) == bad


@pytest.mark.parametrize(
    "source, bad",
    [
        pytest.param("x = len([1])", [], id="pure"),
        pytest.param("def f(p):\n    return open(p).read()", ["open"], id="open"),
        pytest.param("print('x')", ["print"], id="print"),
    ],
)
def test_impure_calls_detects(source: str, bad: list[str]) -> None:
    assert impure_calls(source) == bad


@pytest.mark.parametrize("module", ["__init__", *MODULES])
def test_imports_nothing_of_the_project(module: str) -> None:
    source = (PACKAGE / f"{module}.py").read_text()
    assert foreign_imports(source) == []
    assert impure_calls(source) == []


def test_all_sorted() -> None:
    assert verdicts.__all__ == sorted(verdicts.__all__)


def test_all_complete() -> None:
    owner: dict[str, str] = {}
    for module in MODULES:
        mod = importlib.import_module(f"verdicts.{module}")
        source = (PACKAGE / f"{module}.py").read_text()
        assert sorted(mod.__all__) == sorted(public_definitions(source)), module
        for name in mod.__all__:
            assert name not in owner, f"{name} exported by {owner[name]} and {module}"
            owner[name] = module
    assert sorted(verdicts.__all__) == sorted(owner)
    assert len(set(verdicts.__all__)) == len(verdicts.__all__)
    for name, module in owner.items():
        assert getattr(verdicts, name) is getattr(importlib.import_module(f"verdicts.{module}"), name), name


@pytest.mark.parametrize(
    "source, names",
    [
        pytest.param("import math\nX = 1\n_y = 2\nZ: int = 3\ndef f(): pass\nclass C: pass",
                     {"X", "Z", "f", "C"}, id="defs-not-imports-or-private"),
    ],
)
def test_public_definitions(source: str, names: set[str]) -> None:
    assert public_definitions(source) == names
