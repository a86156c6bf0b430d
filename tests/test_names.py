"""The names the packages share, read from the code: every exception class the project defines is a
`kern.errors.KernError`; one EOS constant on the serving path. Each check is shown to fail on a tree
or module planted to break it.
"""

from __future__ import annotations

import ast
import builtins
import importlib
import inspect
import pkgutil
from pathlib import Path

from kern.errors import KernError
from tests.test_imports import PACKAGES


def modules(packages=PACKAGES) -> list[str]:
    """Every module of `packages` (their `__main__`s, which run a command when imported, left out)."""
    out = []
    for pkg in packages:
        mod = importlib.import_module(pkg)
        out.append(pkg)
        out += [m.name for m in pkgutil.walk_packages(mod.__path__, pkg + ".") if not m.name.endswith("__main__")]
    return out


def _declared_bases(path: Path) -> dict[str, list[str]]:
    """Class name -> the names of its bases as written (the last part of `a.b.C`), every class of the file."""
    out = {}
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.ClassDef):
            out[node.name] = [b.attr if isinstance(b, ast.Attribute) else getattr(b, "id", "") for b in node.bases]
    return out


def stray_exceptions(packages=PACKAGES) -> list[str]:
    """Every exception class defined in `packages` that is not a KernError. A module that cannot be
    imported here (the GPU backend without cupy) is read instead: a class whose written bases name a
    builtin exception and not KernError is a stray."""
    out = []
    for name in modules(packages):
        try:
            mod = importlib.import_module(name)
        except ImportError:
            path = Path(importlib.util.find_spec(name).origin)
            for cls, bases in _declared_bases(path).items():
                builtin = [b for b in bases if isinstance(getattr(builtins, b, None), type)
                           and issubclass(getattr(builtins, b), BaseException)]
                if builtin and "KernError" not in bases:
                    out.append(f"{name}.{cls}")
            continue
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
    monkeypatch.syspath_prepend(str(tmp_path))
    assert stray_exceptions(("planted_errors",)) == ["planted_errors.a.Stray", "planted_errors.b.Loose",
                                                     "planted_errors.c.Hidden"]
