"""The packages' imports, read from the source (every `import`, at module level, inside a function, or
under `TYPE_CHECKING`): no import circle between any two modules, every import between packages
points the way docs/architecture.md draws it (that page's table of arrows is `ALLOWED`, package for
package, with the `kern` command's face, `kern.cli`, a row of its own), and inside serve/ every import
between its rooms too (`ROOMS`, the page's table of rooms). The checks are shown to fail on a tree (or
a page) built to break them.
"""

from __future__ import annotations

import ast
import re
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
PACKAGES = ("kern", "toy", "manifests", "runtime", "pool", "serve", "replay", "oracle", "verdicts", "e2e")
FACE = "kern.cli"  # the `kern` command: a row of its own, above every package, imported by none
UNITS = (*PACKAGES, FACE)
ALLOWED = {
    FACE: set(PACKAGES),  # parses each verb's flags and calls the package that does its work
    "kern": set(),  # leaves only (kern.errors: the root exception), so any package may import them
    "toy": set(),
    "manifests": set(),
    "runtime": {"manifests"},
    "pool": set(),
    "verdicts": set(),
    "serve": {"manifests", "runtime", "pool"},
    "replay": {"manifests", "runtime", "serve", "pool"},  # the serving core's admission over the real pool, no device
    "oracle": {"manifests", "runtime", "verdicts", "serve"},  # serve: what its zygote and host warm and host
    "e2e": {"manifests", "oracle", "verdicts"},  # the server only over HTTP and its log
}
"""Which packages each may import (docs/architecture.md's table; `FACE` is a row beside the packages'). A
module that imports nothing of the project (a leaf: `oracle/version.py`, which `kern serve --version`
uses) may be imported from anywhere; `kern.cli` is no leaf, and no row allows it."""


ROOMS = {
    "common": set(),  # leaves every room may import: logs, hosted, exits, startup, api_error
    "core": {"common"},  # the policy and its thread; beyond serve/ only runtime, pool, manifests
    "pipeline": {"core", "common"},  # the head drives the core's Device; the stages build its engine
    "client": {"core", "common"},  # the seam and the core in another process
    "api": {"client", "common"},  # HTTP only: the core through the seam, never directly
    "serve": {"api", "client", "core", "pipeline", "common"},  # serve/*.py: the entry points, which wire
}  # the rooms together (cli, server, flags, __main__); no room imports them
"""Inside serve/, which rooms (subpackages) each may import: api -> client -> core, pipeline -> core,
every room -> common; `serve` is the package's top-level modules. No leaf is excepted here: an import
that points up between rooms fails whatever it imports."""


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


def unit(module: str) -> str:
    """The row of `allowed` a module answers to: `kern.cli` its own (`FACE`), any other its package's."""
    return FACE if module == FACE or module.startswith(FACE + ".") else module.split(".")[0]


def upward(edges: dict[str, set[str]], allowed=ALLOWED) -> list[str]:
    """Imports between packages that the table does not allow (leaf modules excepted)."""
    leaves = {m for m, ts in edges.items() if not ts}
    bad = []
    for m, ts in edges.items():
        for t in ts:
            a, b = unit(m), unit(t)
            if a != b and b not in allowed.get(a, set()) and t not in leaves:
                bad.append(f"{m} -> {t}")
    return sorted(bad)


def room_of(module: str, rooms=ROOMS) -> str:
    """The room of a module of serve/ (`serve.core.engine` -> `core`); a top-level module's is `serve`."""
    parts = module.split(".")
    return parts[1] if len(parts) > 1 and parts[1] in rooms else parts[0]


def upward_rooms(edges: dict[str, set[str]], rooms=ROOMS, package: str = "serve") -> list[str]:
    """Imports between the rooms of `package` that `rooms` does not allow."""
    bad = []
    for m, ts in edges.items():
        for t in ts:
            if m.split(".")[0] == t.split(".")[0] == package:
                a, b = room_of(m, rooms), room_of(t, rooms)
                if a != b and b not in rooms[a]:
                    bad.append(f"{m} -> {t}")
    return sorted(bad)


def not_leaves(edges: dict[str, set[str]], package: str = "kern") -> list[str]:
    """The modules of `package` (its face, `kern.cli`, aside) that import something of the project."""
    return sorted(f"{m} -> {t}" for m, ts in edges.items() if unit(m) == package for t in ts)


def test_no_import_circle():
    assert circles(graph(ROOT)) == []


def test_the_modules_of_kern_beside_its_face_are_leaves():
    assert not_leaves(graph(ROOT)) == []


def test_the_checks_catch_a_package_importing_the_kern_command(tmp_path):
    """The face may import every package; a package (or a leaf of kern) importing it is caught, even
    inside a function, and a module of kern importing anything of the project is no leaf."""
    files = {"kern/cli.py": "from kern import errors\nfrom oracle.run import go\nfrom serve import cli\n",
             "kern/errors.py": "", "kern/tokens.py": "def f():\n    from kern.cli import main\n",
             "kern/names.py": "from oracle.version import v\n",
             "oracle/run.py": "from kern.errors import E\n", "oracle/version.py": "",
             "oracle/host.py": "def f():\n    from kern.cli import run_command\n",
             "serve/cli.py": "from oracle.run import go\n", "e2e/spawn.py": "import kern.cli\n"}
    for name, text in files.items():
        (tmp_path / name).parent.mkdir(parents=True, exist_ok=True)
        (tmp_path / name).write_text(text)
    for pkg in ("kern", "oracle", "serve", "e2e"):
        (tmp_path / pkg / "__init__.py").write_text("")
    edges = graph(tmp_path, ("kern", "oracle", "serve", "e2e"))
    assert upward(edges) == ["e2e.spawn -> kern.cli", "kern.tokens -> kern.cli", "oracle.host -> kern.cli",
                             "serve.cli -> oracle.run"]
    assert not_leaves(edges) == ["kern.names -> oracle.version", "kern.tokens -> kern.cli"]


def test_imports_point_the_way_the_architecture_draws_them():
    assert upward(graph(ROOT)) == []


def test_the_rooms_of_serve_import_only_downward():
    assert set(ROOMS) == {p.name for p in (ROOT / "serve").iterdir() if (p / "__init__.py").is_file()} | {"serve"}
    assert upward_rooms(graph(ROOT)) == []


def test_the_rooms_check_catches_an_upward_import(tmp_path):
    files = {"cli.py": "from serve.api import app\nfrom serve.core import engine\n",
             "api/app.py": "from serve.client.seam import Request\nfrom serve.core.engine import Engine\n",
             "client/seam.py": "from serve.core.request import Request\nfrom serve.common import logs\n",
             "core/engine.py": "from serve.common import logs\n",
             "core/request.py": "def f():\n    from serve.client import seam\n",
             "core/faults.py": "from serve import cli\n",
             "common/logs.py": "import serve.core.engine\n",
             "pipeline/head.py": "from serve.core.engine import Engine\nfrom serve.api.app import x\n"}
    for name, text in files.items():
        (tmp_path / "serve" / name).parent.mkdir(parents=True, exist_ok=True)
        (tmp_path / "serve" / name).write_text(text)
    for room in ("", "api", "client", "core", "common", "pipeline"):
        (tmp_path / "serve" / room / "__init__.py").write_text("")
    assert upward_rooms(graph(tmp_path, ("serve",))) == [
        "serve.api.app -> serve.core.engine", "serve.common.logs -> serve.core.engine",
        "serve.core.faults -> serve.cli", "serve.core.request -> serve.client.seam",
        "serve.pipeline.head -> serve.api.app"]


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
ROOMS_HEADER = "| room | owns | imports |"


def drawn(text: str, packages=UNITS, header: str = HEADER) -> dict[str, set[str]]:
    """docs/architecture.md's table under `header` (the packages', or serve's rooms'): each row's name
    (the first word in backticks of its first cell) -> the names its `imports` cell gives in backticks
    (other words there are notes)."""
    lines = text.splitlines()
    if header not in lines:
        raise ValueError(f"no table headed {header!r}")
    rows = {}
    for line in lines[lines.index(header) + 2:]:
        if not line.startswith("|"):
            break
        cells = [c.strip() for c in line.strip().strip("|").split("|")]
        name = re.search(r"`([^`]+)`", cells[0])
        name = (name.group(1) if name else cells[0]).rstrip("/")
        rows[name] = {w for w in re.findall(r"`([^`]+)`", cells[-1]) if w in packages}
    return rows


def drift(text: str, allowed=ALLOWED, packages=UNITS, header: str = HEADER) -> list[str]:
    """Where the page's table and `allowed` differ: a package with no row, a row for no package, an
    arrow drawn and not allowed, or allowed and not drawn."""
    rows = drawn(text, packages, header)
    out = [f"{p}: no row" for p in packages if p not in rows]
    out += [f"{p}: a row for no package" for p in rows if p not in packages and p != "tests"]
    for p in packages:
        if p in rows:
            out += [f"{p} -> {q}: drawn, not allowed" for q in sorted(rows[p] - allowed.get(p, set()))]
            out += [f"{p} -> {q}: allowed, not drawn" for q in sorted(allowed.get(p, set()) - rows[p])]
    return out


def test_the_architecture_page_draws_the_allowed_imports():
    assert set(ALLOWED) == set(UNITS)
    assert drift(ARCHITECTURE.read_text()) == []


def test_the_drawing_check_catches_a_missing_row_and_a_wrong_arrow():
    text = ARCHITECTURE.read_text()
    pool_row = next(line for line in text.splitlines() if line.startswith("| `pool/` |"))
    e2e_row = next(line for line in text.splitlines() if line.startswith("| `e2e/` |"))
    broken = text.replace(pool_row + "\n", "").replace(e2e_row, e2e_row.replace("`oracle`, ", "`serve`, "))
    assert drift(broken) == ["pool: no row", "e2e -> serve: drawn, not allowed", "e2e -> oracle: allowed, not drawn"]
    added = text.replace(pool_row, pool_row + "\n| `extra/` | x | nothing |")
    assert drift(added) == ["extra: a row for no package"]
    face = next(line for line in text.splitlines() if line.startswith("| `kern.cli` |"))
    upward_face = text.replace(face + "\n", "").replace(e2e_row, e2e_row.replace("`oracle`, ", "`oracle`, `kern.cli`, "))
    assert drift(upward_face) == ["kern.cli: no row", "e2e -> kern.cli: drawn, not allowed"]


def test_the_architecture_page_draws_the_rooms_of_serve():
    assert drift(ARCHITECTURE.read_text(), ROOMS, tuple(ROOMS), ROOMS_HEADER) == []


def test_the_rooms_drawing_check_catches_an_upward_arrow_drawn():
    text = ARCHITECTURE.read_text()
    lines = text.splitlines()
    core = next(line for line in lines[lines.index(ROOMS_HEADER):] if line.startswith("| `core/` |"))
    broken = text.replace(core, core.rpartition("|")[0] + "| `common`, `client` |")
    assert drift(broken, ROOMS, tuple(ROOMS), ROOMS_HEADER) == ["core -> client: drawn, not allowed"]


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
