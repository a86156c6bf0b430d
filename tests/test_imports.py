"""The packages' imports, read from the source (every `import`, at module level, inside a function, or
under `TYPE_CHECKING`): no import circle between any two modules, and every import between packages
points the way docs/architecture.md draws it; that page's table of arrows is `ALLOWED`, package for
package. The checks are shown to fail on a tree (or a page) built to break them.
"""

from __future__ import annotations

import ast
import re
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
PACKAGES = ("kern", "toy", "manifests", "runtime", "pool", "serve", "replay", "oracle", "verdicts", "e2e")
ALLOWED = {
    "kern": set(),  # leaves only (kern.errors: the root exception), so any package may import them
    "toy": set(),
    "manifests": set(),
    "runtime": {"manifests"},
    "pool": set(),
    "verdicts": set(),
    "serve": {"manifests", "runtime", "pool"},
    "replay": {"manifests", "runtime", "serve", "pool"},  # the serving core's admission over the real pool, no device
    "oracle": {"manifests", "runtime", "toy", "verdicts", "serve", "replay"},  # the commands it runs and hosts
    "e2e": {"manifests", "oracle", "verdicts"},  # the server only over HTTP and its log
}
"""Which packages each may import (docs/architecture.md's table). A module that imports nothing of the
project (a leaf: `oracle/version.py`, which `kern serve --version` uses) may be imported from anywhere."""


def graph(root: Path, packages=PACKAGES) -> dict[str, set[str]]:
    """Module -> the project modules it imports (a name imported from a package resolves to its module)."""
    mods = {}
    for pkg in packages:
        for p in (root / pkg).rglob("*.py"):
            name = ".".join(p.relative_to(root).with_suffix("").parts)
            mods[name.removesuffix(".__init__")] = p

    def resolve(name: str) -> str | None:
        while name and name not in mods:
            name = name.rpartition(".")[0]
        return name or None

    edges: dict[str, set[str]] = {m: set() for m in mods}
    for m, p in mods.items():
        pkg = m if p.name == "__init__.py" else m.rpartition(".")[0]
        for node in ast.walk(ast.parse(p.read_text())):
            if isinstance(node, ast.Import):
                targets = [resolve(a.name) for a in node.names]
            elif isinstance(node, ast.ImportFrom):
                base = node.module or ""
                if node.level:
                    parts = pkg.split(".")
                    base = ".".join(parts[: len(parts) - node.level + 1] + ([base] if base else []))
                targets = [resolve(f"{base}.{a.name}") or resolve(base) for a in node.names]
            else:
                continue
            edges[m].update(t for t in targets if t and t != m)
    return edges


def circles(edges: dict[str, set[str]]) -> list[list[str]]:
    """Every strongly connected component of more than one module (Tarjan, iteratively)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on: set[str] = set()
    found: list[list[str]] = []
    counter = 0
    for start in edges:
        if start in index:
            continue
        work = [(start, iter(sorted(edges[start])))]
        index[start] = low[start] = counter
        counter += 1
        stack.append(start)
        on.add(start)
        while work:
            v, it = work[-1]
            w = next(it, None)
            if w is not None:
                if w not in index:
                    index[w] = low[w] = counter
                    counter += 1
                    stack.append(w)
                    on.add(w)
                    work.append((w, iter(sorted(edges[w]))))
                elif w in on:
                    low[v] = min(low[v], index[w])
                continue
            work.pop()
            if work:
                low[work[-1][0]] = min(low[work[-1][0]], low[v])
            if low[v] == index[v]:
                comp = []
                while True:
                    x = stack.pop()
                    on.discard(x)
                    comp.append(x)
                    if x == v:
                        break
                if len(comp) > 1:
                    found.append(sorted(comp))
    return found


def upward(edges: dict[str, set[str]], allowed=ALLOWED) -> list[str]:
    """Imports between packages that the table does not allow (leaf modules excepted)."""
    leaves = {m for m, ts in edges.items() if not ts}
    bad = []
    for m, ts in edges.items():
        for t in ts:
            a, b = m.split(".")[0], t.split(".")[0]
            if a != b and b not in allowed.get(a, set()) and t not in leaves:
                bad.append(f"{m} -> {t}")
    return sorted(bad)


def test_no_import_circle():
    assert circles(graph(ROOT)) == []


def test_imports_point_the_way_the_architecture_draws_them():
    assert upward(graph(ROOT)) == []


def test_the_checks_catch_a_circle_and_an_upward_import(tmp_path):
    for pkg, files in {"low": {"a.py": "from low import b\n", "b.py": "def f():\n    from low.a import x\n"},
                       "high": {"c.py": "from low.a import y\n"}}.items():
        (tmp_path / pkg).mkdir()
        (tmp_path / pkg / "__init__.py").write_text("")
        for name, text in files.items():
            (tmp_path / pkg / name).write_text(text)
    (tmp_path / "low" / "d.py").write_text("from high.c import z\n")
    edges = graph(tmp_path, ("low", "high"))
    assert circles(edges) == [["low.a", "low.b"]]
    assert upward(edges, {"low": set(), "high": {"low"}}) == ["low.d -> high.c"]


ARCHITECTURE = ROOT / "docs" / "architecture.md"
HEADER = "| package | owns | imports |"


def drawn(text: str, packages=PACKAGES) -> dict[str, set[str]]:
    """docs/architecture.md's table of packages: each row's package -> the packages its `imports`
    cell names in backticks (other words there are notes)."""
    lines = text.splitlines()
    if HEADER not in lines:
        raise ValueError(f"no table headed {HEADER!r}")
    rows = {}
    for line in lines[lines.index(HEADER) + 2:]:
        if not line.startswith("|"):
            break
        cells = [c.strip() for c in line.strip().strip("|").split("|")]
        rows[cells[0].strip("`").rstrip("/")] = {w for w in re.findall(r"`([^`]+)`", cells[-1]) if w in packages}
    return rows


def drift(text: str, allowed=ALLOWED, packages=PACKAGES) -> list[str]:
    """Where the page's table and `allowed` differ: a package with no row, a row for no package, an
    arrow drawn and not allowed, or allowed and not drawn."""
    rows = drawn(text, packages)
    out = [f"{p}: no row" for p in packages if p not in rows]
    out += [f"{p}: a row for no package" for p in rows if p not in packages and p != "tests"]
    for p in packages:
        if p in rows:
            out += [f"{p} -> {q}: drawn, not allowed" for q in sorted(rows[p] - allowed.get(p, set()))]
            out += [f"{p} -> {q}: allowed, not drawn" for q in sorted(allowed.get(p, set()) - rows[p])]
    return out


def test_the_architecture_page_draws_the_allowed_imports():
    assert set(ALLOWED) == set(PACKAGES)
    assert drift(ARCHITECTURE.read_text()) == []


def test_the_drawing_check_catches_a_missing_row_and_a_wrong_arrow():
    text = ARCHITECTURE.read_text()
    pool_row = next(line for line in text.splitlines() if line.startswith("| `pool/` |"))
    e2e_row = next(line for line in text.splitlines() if line.startswith("| `e2e/` |"))
    broken = text.replace(pool_row + "\n", "").replace(e2e_row, e2e_row.replace("`oracle`, ", "`serve`, "))
    assert drift(broken) == ["pool: no row", "e2e -> serve: drawn, not allowed", "e2e -> oracle: allowed, not drawn"]
    added = text.replace(pool_row, pool_row + "\n| `extra/` | x | nothing |")
    assert drift(added) == ["extra: a row for no package"]


LONGEST = 80  # lines a function of serve/ or e2e/ may take, its docstring included


def long_functions(root: Path, packages=("serve", "e2e"), most: int = LONGEST) -> list[str]:
    """Every function (or method) of `packages` longer than `most` lines."""
    out = []
    for pkg in packages:
        for p in sorted((root / pkg).rglob("*.py")):
            for node in ast.walk(ast.parse(p.read_text())):
                if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
                    n = node.end_lineno - node.lineno + 1
                    if n > most:
                        out.append(f"{p.relative_to(root)}:{node.lineno} {node.name}: {n} lines")
    return out


def test_no_function_of_the_server_or_the_gate_runs_past_80_lines():
    assert long_functions(ROOT) == []


def test_the_length_check_catches_a_long_function(tmp_path):
    (tmp_path / "serve").mkdir()
    (tmp_path / "serve" / "x.py").write_text("def f():\n" + "    x = 1\n" * 80 + "\n\ndef g():\n    pass\n")
    assert long_functions(tmp_path, ("serve",)) == ["serve/x.py:1 f: 81 lines"]


def test_every_package_is_installed():
    """pyproject's package list names every top-level package (a package left out imports from a
    checkout's root, where the tests run, but not from the console scripts of a fresh install)."""
    import fnmatch
    import tomllib

    include = tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["setuptools"]["packages"]["find"]["include"]
    packages = set(PACKAGES) | {p.parent.name for p in ROOT.glob("*/__init__.py")}
    missing = sorted(p for p in packages if not any(fnmatch.fnmatch(p, pat) for pat in include))
    assert missing == []
