"""The names the packages share, read from the code: every exception class the project defines is a
`kern.errors.KernError`; one EOS (`kern.tokens`) outside the toy, whose own copies equal it; no package
uses another's private names. Each check is shown to fail on a tree or module planted to break it.
"""

from __future__ import annotations

import ast
import builtins
import importlib
import importlib.util
import inspect
import pkgutil
from pathlib import Path

from kern.errors import KernError
from kern.tokens import BYTES, EOS
from tests.test_imports import PACKAGES, ROOT


def modules(packages=PACKAGES) -> list[str]:
    """Every module of `packages` (their `__main__`s, which run a command when imported, left out)."""
    out = []
    for pkg in packages:
        mod = importlib.import_module(pkg)
        out.append(pkg)
        out += [m.name for m in pkgutil.walk_packages(mod.__path__, pkg + ".") if not m.name.endswith("__main__")]
    return out


def _written_strays(path: Path, nested_only: bool) -> list[str]:
    """Classes of the file (or only those inside a function or class) whose written bases name a
    builtin exception and not KernError: what an import cannot show."""
    tree = ast.parse(path.read_text())
    top = {id(n) for n in tree.body}
    out = []
    for node in ast.walk(tree):
        if not isinstance(node, ast.ClassDef) or nested_only and id(node) in top:
            continue
        bases = [b.attr if isinstance(b, ast.Attribute) else getattr(b, "id", "") for b in node.bases]
        if "KernError" not in bases and any(isinstance(getattr(builtins, b, None), type)
                                            and issubclass(getattr(builtins, b), BaseException) for b in bases):
            out.append(node.name)
    return out


def stray_exceptions(packages=PACKAGES) -> list[str]:
    """Every exception class defined in `packages` that is not a KernError: each module's classes as
    imported, and, read from the source, a class defined inside a function or class, or in a module
    that cannot be imported here (the GPU backend without cupy)."""
    out = []
    for name in modules(packages):
        origin = importlib.util.find_spec(name).origin  # None: a folder without __init__.py
        try:
            mod = importlib.import_module(name)
        except ImportError:
            out += [f"{name}.{c}" for c in _written_strays(Path(origin), nested_only=False)]
            continue
        if origin:
            out += [f"{name}.{c}" for c in _written_strays(Path(origin), nested_only=True)]
        for v in vars(mod).values():
            if (inspect.isclass(v) and v.__module__ == name and issubclass(v, BaseException)
                    and not issubclass(v, KernError)):
                out.append(f"{name}.{v.__qualname__}")
    return sorted(out)


def test_every_exception_of_the_project_is_a_kern_error():
    assert stray_exceptions() == []


def test_the_root_check_finds_a_planted_exception(tmp_path, monkeypatch):
    pkg = tmp_path / "planted_errors"
    pkg.mkdir()
    (pkg / "__init__.py").write_text("")
    (pkg / "a.py").write_text("from kern.errors import KernError\n\n\nclass Fine(KernError, ValueError):\n    pass\n\n\n"
                              "class Stray(ValueError):\n    pass\n\n\nclass NotAnError:\n    pass\n")
    (pkg / "b.py").write_text("from planted_errors.a import Fine\n\n\nclass Child(Fine):\n    pass\n\n\n"
                              "class Loose(ConnectionError):\n    pass\n")
    (pkg / "c.py").write_text("import no_such_module_here\n\n\nclass Hidden(RuntimeError):\n    pass\n\n\n"
                              "class Kept(KernError, RuntimeError):\n    pass\n")
    (pkg / "d.py").write_text("def f():\n    class Inner(KeyError):\n        pass\n\n    return Inner\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    assert stray_exceptions(("planted_errors",)) == ["planted_errors.a.Stray", "planted_errors.b.Loose",
                                                     "planted_errors.c.Hidden", "planted_errors.d.Inner"]



# -- one EOS ------------------------------------------------------------------------------------------

TOKEN_NAMES = {"EOS": EOS, "BYTES": BYTES, "VOCAB": BYTES, "VOCAB_BYTES": BYTES}
"""The names the toy's copies use for kern.tokens' two ids."""


def eos_copies(root: Path = ROOT, packages=PACKAGES) -> list[str]:
    """Where code outside toy/ (and kern/tokens.py, the one definition) writes EOS's value itself: a
    token name bound to a number, the number in a comparison, in a list or set of tokens, or as
    getattr's default for EOS."""
    out = []
    for pkg in packages:
        if pkg == "toy":
            continue
        for p in sorted((root / pkg).rglob("*.py")):
            if p.relative_to(root).as_posix() == "kern/tokens.py":
                continue
            where = p.relative_to(root).as_posix()
            for n in ast.walk(ast.parse(p.read_text())):
                if isinstance(n, (ast.Assign, ast.AnnAssign)) and isinstance(n.value, ast.Constant):
                    targets = n.targets if isinstance(n, ast.Assign) else [n.target]
                    out += [f"{where}:{n.lineno} binds {t.id}" for t in targets
                            if isinstance(t, ast.Name) and (t.id in TOKEN_NAMES or "EOS" in t.id)]
                    continue
                if isinstance(n, ast.Compare):
                    values = [n.left, *n.comparators]
                elif isinstance(n, (ast.List, ast.Set)):
                    values = n.elts
                elif (isinstance(n, ast.Call) and isinstance(n.func, ast.Name) and n.func.id == "getattr"
                      and len(n.args) == 3 and isinstance(n.args[1], ast.Constant) and n.args[1].value == "EOS"):
                    values = [n.args[2]]
                else:
                    continue
                if any(isinstance(v, ast.Constant) and v.value == EOS and type(v.value) is int for v in values):
                    out.append(f"{where}:{n.lineno} writes {EOS}: {ast.unparse(n)[:60]}")
    return out


def toy_copies(root: Path = ROOT) -> dict[str, int]:
    """toy/'s own token constants (the reference's and the kernels', pinned by the manifests), by file."""
    out = {}
    for p in sorted((root / "toy").rglob("*.py")):
        for n in ast.parse(p.read_text()).body:
            if (isinstance(n, ast.Assign) and isinstance(n.value, ast.Constant) and len(n.targets) == 1
                    and isinstance(n.targets[0], ast.Name) and n.targets[0].id in TOKEN_NAMES):
                out[f"{p.relative_to(root).as_posix()}:{n.targets[0].id}"] = n.value.value
    return out


def test_one_eos_outside_the_toy():
    assert eos_copies() == []


def test_the_toys_copies_of_eos_are_kerns():
    copies = toy_copies()
    assert "toy/model.py:EOS" in copies and "toy/kernels/cpu.py:EOS" in copies
    assert {k: v for k, v in copies.items() if v != TOKEN_NAMES[k.rpartition(":")[2]]} == {}


def test_the_eos_check_catches_a_copy(tmp_path):
    (tmp_path / "serve").mkdir()
    (tmp_path / "toy").mkdir()
    (tmp_path / "serve" / "a.py").write_text(
        f"EOS = {EOS}\nVOCAB: int = {BYTES}\nBUCKETS = (1, 2, {EOS})\n\n\ndef f(t, m):\n    return t >= {EOS}, [{EOS}],"
        f" getattr(m, 'EOS', {EOS}), t - {EOS}\n")
    (tmp_path / "toy" / "model.py").write_text(f"EOS = {EOS + 1}\n")
    assert eos_copies(tmp_path, ("serve", "toy")) == [
        "serve/a.py:1 binds EOS", "serve/a.py:2 binds VOCAB", f"serve/a.py:7 writes {EOS}: t >= {EOS}",
        f"serve/a.py:7 writes {EOS}: [{EOS}]", f"serve/a.py:7 writes {EOS}: getattr(m, 'EOS', {EOS})"]
    assert toy_copies(tmp_path) == {"toy/model.py:EOS": EOS + 1}


# -- private names stay in their package ------------------------------------------------------------------

OUTSIDE = ("bench",)
"""Code outside every package that uses them and is held to the same rule (each of its files a room of its
own). tests/ is not: a test may reach into the module it tests."""


def _private(name: str) -> bool:
    return len(name) > 1 and name.startswith("_") and not (name.startswith("__") and name.endswith("__"))


def _files(root: Path, packages, outside=()) -> dict[Path, str]:
    """Every source file -> the room it belongs to (its top-level package, or the file itself outside)."""
    out = {p: pkg for pkg in packages for p in sorted((root / pkg).rglob("*.py"))}
    out.update({p: str(p.relative_to(root)) for d in outside for p in sorted((root / d).rglob("*.py"))})
    # a folder named _x or .x inside (bench/_tmp: scratch that git ignores) is not the project's code
    return {p: room for p, room in out.items()
            if not any(part.startswith(("_", ".")) for part in p.relative_to(root).parts[:-1])}


def _defines(tree: ast.AST, path: Path) -> set[str]:
    """The private names a file makes: its functions, classes, methods, variables, arguments,
    attributes it stores, and its own name when the module is private."""
    out = {path.stem} if _private(path.stem) else set()
    for n in ast.walk(tree):
        if isinstance(n, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
            out.add(n.name)
        elif isinstance(n, ast.Name) and isinstance(n.ctx, ast.Store):
            out.add(n.id)
        elif isinstance(n, ast.Attribute) and isinstance(n.ctx, ast.Store):
            out.add(n.attr)
        elif isinstance(n, ast.arg):
            out.add(n.arg)
    return {x for x in out if _private(x)}


def private_uses(root: Path = ROOT, packages=PACKAGES, outside=OUTSIDE) -> list[str]:
    """Every use of another package's private name: `from other.mod import _x` (or a private module
    of it), `mod._x` on a module imported from another package, and `obj._x` (or `getattr(obj, "_x")`)
    where `_x` is made only by other packages (a name that this package makes too cannot be told
    apart by reading, and passes). Within a package, its modules share what they like; `self._x` and
    `cls._x` are always the object's own."""
    trees = {p: ast.parse(p.read_text()) for p in _files(root, packages, outside)}
    room = _files(root, packages, outside)
    made: dict[str, set[str]] = {}
    for p, tree in trees.items():
        made.setdefault(room[p], set()).update(_defines(tree, p))
    out = []
    for p, tree in trees.items():
        here = room[p]
        where = p.relative_to(root).as_posix()
        foreign: set[str] = set()  # local names bound to another package's modules
        for n in ast.walk(tree):
            if isinstance(n, ast.Import):
                for a in n.names:
                    parts = a.name.split(".")
                    if parts[0] in packages and parts[0] != here:
                        foreign.add(a.asname or parts[0])
                        if any(map(_private, parts)):
                            out.append(f"{where}:{n.lineno} imports {a.name}")
            elif isinstance(n, ast.ImportFrom) and not n.level and n.module:
                parts = n.module.split(".")
                if parts[0] not in packages or parts[0] == here:
                    continue
                for a in n.names:
                    if _private(a.name) or any(map(_private, parts)):
                        out.append(f"{where}:{n.lineno} imports {n.module}.{a.name}")
                    foreign.add(a.asname or a.name)
        for n in ast.walk(tree):
            if isinstance(n, ast.Attribute) and _private(n.attr):
                obj, attr = n.value, n.attr
            elif (isinstance(n, ast.Call) and isinstance(n.func, ast.Name) and n.func.id in ("getattr", "hasattr", "setattr")
                  and len(n.args) >= 2 and isinstance(n.args[1], ast.Constant) and _private(str(n.args[1].value))):
                obj, attr = n.args[0], str(n.args[1].value)
            else:
                continue
            head = obj
            while isinstance(head, ast.Attribute):
                head = head.value
            name = head.id if isinstance(head, ast.Name) else None
            if name in ("self", "cls") and head is obj:
                continue
            elsewhere = any(attr in names for r, names in made.items() if r != here)
            if name in foreign or elsewhere and attr not in made.get(here, set()):
                out.append(f"{where}:{n.lineno} uses {ast.unparse(obj)}.{attr}")
    return sorted(set(out))


def test_no_package_uses_another_packages_private_names():
    assert private_uses() == []


def test_the_private_name_check_catches_each_kind_of_use(tmp_path):
    files = {
        "low/__init__.py": "",
        "low/pages.py": "_SIZE = 4\n\n\ndef _grow(n):\n    return n\n\n\nclass Pool:\n    def __init__(self):\n"
                        "        self._free = []\n\n    def free(self):\n        return self._free\n",
        "low/lease.py": "from low.pages import _grow, Pool\n\n\ndef f(p: Pool):\n    return p._free, _grow(1)\n",
        "high/__init__.py": "",
        "high/a.py": "from low.pages import _grow\n",
        "high/b.py": "import low.pages\n\n\ndef f():\n    return low.pages._SIZE\n",
        "high/c.py": "from low import pages as pp\n\n\ndef f(pool):\n    return pool._free, getattr(pool, '_free'), pp._grow\n",
        "high/d.py": "from low.pages import Pool\n\n\nclass Mine:\n    def __init__(self):\n        self._own = Pool()\n\n"
                     "    def g(self, other):\n        return self._own.free(), other._own\n",
        "tools/t.py": "def f(pool):\n    return pool._free\n",
    }
    for name, text in files.items():
        (tmp_path / name).parent.mkdir(parents=True, exist_ok=True)
        (tmp_path / name).write_text(text)
    assert private_uses(tmp_path, ("low", "high"), ("tools",)) == [
        "high/a.py:1 imports low.pages._grow", "high/b.py:5 uses low.pages._SIZE", "high/c.py:5 uses pool._free",
        "high/c.py:5 uses pp._grow", "tools/t.py:2 uses pool._free"]
