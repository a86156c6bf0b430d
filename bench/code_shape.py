"""The code's shape, as issues 30 and 42 count it: product files and lines, the longest functions,
import circles, uses of another package's private names, when the `duplicates` tool is on the PATH its
pair count, and the shape rules (docs/architecture.md, "The shape rules") over every product package
and bench/, each violation listed below the table:

- a function is at most 60 lines (`MAX_LINES`);
- a signature takes at most 12 parameters (`MAX_PARAMS`; self/cls not counted) and no `**kwargs`,
  except a click command whose first statement builds its flags dataclass from them;
- a file is at most 500 lines (`MAX_FILE`);
- no trace-replay module inside serve/ (replay/ is its own room);
- no `getattr(x, name, default)` / `hasattr(x, name)` on an `x` typed as a seam protocol (`SEAMS`),
  and no `Any` in a seam protocol's annotations;
- no import circle.

Tests and the toy's kernel files are outside the rules (`OUTSIDE`); what else is exempt is exempt by
name, with its reason, in `EXEMPT`. tests/test_code_shape.py holds every count at 0. For a before/after,
give a git revision: it is read from `git archive REV` in a temporary folder.

    python bench/code_shape.py              # the working tree
    python bench/code_shape.py --rev a8895aa --rev HEAD
"""

from __future__ import annotations

import argparse
import ast
import importlib.util
import io
import re
import shutil
import subprocess
import sys
import tarfile
import tempfile
from pathlib import Path

from tabulate import tabulate

REPO = Path(__file__).resolve().parent.parent
PACKAGES = ("kern", "toy", "manifests", "runtime", "pool", "serve", "replay", "oracle", "verdicts", "e2e")
RULED = (*PACKAGES, "bench")
MAX_LINES, MAX_PARAMS, MAX_FILE = 60, 12, 500
LONG = 80  # issue 30's older count: functions over 80 lines in serve/ and e2e/

OUTSIDE = ("toy/kernels/", "toy/layers/", "toy/float_kernels/", "toy/attn/cpu.py", "toy/attn/cuda.py")
"""The toy's kernel files (numba kernels written as one loop nest each, the reference's arithmetic
spelled out): outside the rules. Tests are outside them too (tests/ is not read)."""

EXEMPT = {
    "bench/mutant_catalogue.py": ("file", "a data table: one row per mutant (file, snippet, replacement, the checks that catch it)"),
    "serve/api/params.py": ("file", "a data table: one row per request parameter (PARAMS), read by the validator, docs and tests"),
    "toy/model.py": ("file", "the normative reference, loaded by path by every gate driver (`e2e --reference`, the "
                     "Rust kern's tools/e2e/e2e.py, with no `toy` package on its path): one file that stands alone"),
    "serve/common/logs.py:fmt": ("kwargs", "a log line's fields, given as keywords: data, not parameters"),
    "serve/common/logs.py:event": ("kwargs", "a log line's fields, given as keywords: data, not parameters"),
    "serve/common/logs.py:Limiter.__call__": ("kwargs", "a log line's fields, given as keywords: data, not parameters"),
    "e2e/metrics.py:get": ("kwargs", "a Prometheus sample's labels, given as keywords: data, not parameters"),
    "e2e/case.py:shrink.body": ("kwargs", "a request body's fields, given as keywords: data, not parameters"),
    "e2e/scenarios/params.py:Params.body": ("kwargs", "a request body's fields, given as keywords: data, not "
                                            "parameters"),
    "e2e/engine.py:Engine.argv": ("kwargs", "the values of an engine command's placeholders, by name: data"),
    "replay/run.py:_no_log": ("kwargs", "serve.common.logs.event's stand-in (the admission's log, silenced): a log line's "
                              "fields, given as keywords: data, not parameters"),
}
"""What is exempt from a rule, by name (a file, or path:qualified function), with the rule and why."""

SEAMS = {"serve/client/seam.py": ("EngineClient", "EngineView"), "serve/core/device.py": ("Device", "Losable")}
"""The seam protocols, by the module that defines them."""
SEAMS["e2e/oracle_seam.py"] = ("Oracle",)  # the gate's oracle (`Run.oracle`)
SEAM_NAMES = {n for names in SEAMS.values() for n in names}


def _imports():
    spec = importlib.util.spec_from_file_location("kern_test_imports", REPO / "tests" / "test_imports.py")
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def ruled_files(root: Path) -> list[Path]:
    """The .py files the rules read: the product packages and bench/, kernel files aside."""
    out = []
    for pkg in RULED:
        for p in sorted((root / pkg).rglob("*.py")):
            rel = p.relative_to(root).as_posix()
            if not rel.startswith(OUTSIDE):
                out.append(p)
    return out


def _defs(tree: ast.AST, prefix: str = ""):
    """(qualified name, node) of every function, nested ones and methods included."""
    for node in ast.iter_child_nodes(tree):
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
            yield f"{prefix}{node.name}", node
            yield from _defs(node, f"{prefix}{node.name}.")
        elif isinstance(node, ast.ClassDef):
            yield from _defs(node, f"{prefix}{node.name}.")
        else:
            yield from _defs(node, prefix)


def _params(node) -> int:
    a = node.args
    names = [x.arg for x in (*a.posonlyargs, *a.args)]
    n = len(names) + len(a.kwonlyargs) + (1 if a.vararg else 0)
    return n - 1 if names and names[0] in ("self", "cls") else n


def _flags_command(node) -> bool:
    """A click command whose first statement builds its flags object from its keywords at once (one
    `**` of them, beside keywords it takes from the click context, such as `kern run`'s config)."""
    decorated = any("command" in ast.unparse(d) for d in node.decorator_list)
    body = [s for s in node.body if not (isinstance(s, ast.Expr) and isinstance(s.value, ast.Constant))]
    first = body[0] if body else None
    value = getattr(first, "value", None)
    builds = (isinstance(value, ast.Call) and not value.args
              and sum(k.arg is None for k in value.keywords) == 1)
    return decorated and builds


def _exempt(key: str, rule: str) -> bool:
    return key in EXEMPT and EXEMPT[key][0] == rule


def function_rules(root: Path) -> tuple[list, list, list]:
    """(functions over MAX_LINES, signatures over MAX_PARAMS, signatures with **kwargs), each a list of
    (path:qualname, count) sorted longest first."""
    long, wide, kwargs = [], [], []
    for p in ruled_files(root):
        rel = p.relative_to(root).as_posix()
        for qual, node in _defs(ast.parse(p.read_text())):
            key = f"{rel}:{qual}"
            n = node.end_lineno - node.lineno + 1
            if n > MAX_LINES:
                long.append((key, n))
            if _params(node) > MAX_PARAMS:
                wide.append((key, _params(node)))
            if node.args.kwarg and not _exempt(key, "kwargs") and not _flags_command(node):
                kwargs.append((key, f"**{node.args.kwarg.arg}"))
    return (sorted(long, key=lambda x: -x[1]), sorted(wide, key=lambda x: -x[1]), kwargs)


def long_files(root: Path) -> list:
    out = []
    for p in ruled_files(root):
        rel = p.relative_to(root).as_posix()
        n = len(p.read_text().splitlines())
        if n > MAX_FILE and not _exempt(rel, "file"):
            out.append((rel, n))
    return sorted(out, key=lambda x: -x[1])


def replay_in_serve(root: Path) -> list:
    """Modules in serve/ that are trace replay: named for it, or importing the replay package."""
    out = []
    for p in sorted((root / "serve").rglob("*.py")):
        rel = p.relative_to(root).as_posix()
        tree = ast.parse(p.read_text())
        imports = [a.name for n in ast.walk(tree) if isinstance(n, ast.Import) for a in n.names]
        imports += [n.module or "" for n in ast.walk(tree) if isinstance(n, ast.ImportFrom) and not n.level]
        if "replay" in p.stem or "trace" in p.stem or any(m.split(".")[0] == "replay" for m in imports):
            out.append((rel, "replay"))
    return out


def _names_in(annotation) -> set[str]:
    """The names an annotation mentions (a quoted one parsed)."""
    if annotation is None:
        return set()
    out = set()
    for n in ast.walk(annotation):
        if isinstance(n, ast.Name):
            out.add(n.id)
        elif isinstance(n, ast.Attribute):
            out.add(n.attr)
        elif isinstance(n, ast.Constant) and isinstance(n.value, str):
            try:
                out |= _names_in(ast.parse(n.value, mode="eval"))
            except SyntaxError:
                pass
    return out


def _seam_typed(scope) -> set[str]:
    """The names (and self.attrs) a scope annotates with a seam protocol."""
    out = set()
    for n in ast.walk(scope):
        if isinstance(n, (ast.FunctionDef, ast.AsyncFunctionDef)):
            a = n.args
            out |= {x.arg for x in (*a.posonlyargs, *a.args, *a.kwonlyargs) if _names_in(x.annotation) & SEAM_NAMES}
        elif isinstance(n, ast.AnnAssign) and _names_in(n.annotation) & SEAM_NAMES:
            out.add(ast.unparse(n.target) if not isinstance(n.target, ast.Name) else n.target.id)
            if isinstance(n.target, ast.Name):
                out.add(f"self.{n.target.id}")  # a class-level annotation: the attribute
    return out


def seam_probes(root: Path) -> list:
    """getattr with a default, or hasattr, on a name typed as a seam protocol in its function or class."""
    out = []
    for p in ruled_files(root):
        rel = p.relative_to(root).as_posix()
        tree = ast.parse(p.read_text())
        for scope in [n for n in ast.walk(tree) if isinstance(n, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef))]:
            typed = _seam_typed(scope)
            for call in ast.walk(scope):
                if not (isinstance(call, ast.Call) and isinstance(call.func, ast.Name) and call.args):
                    continue
                probe = (call.func.id == "getattr" and len(call.args) == 3) or call.func.id == "hasattr"
                if probe and ast.unparse(call.args[0]) in typed:
                    out.append((f"{rel}:{call.lineno}", ast.unparse(call)))
    return sorted(set(out))


def seam_any(root: Path) -> list:
    """`Any` in a seam protocol's annotations."""
    out = []
    for rel, names in SEAMS.items():
        if not (root / rel).exists():
            continue
        for cls in ast.walk(ast.parse((root / rel).read_text())):
            if not (isinstance(cls, ast.ClassDef) and cls.name in names):
                continue
            for n in ast.walk(cls):
                anns = []
                if isinstance(n, ast.AnnAssign):
                    anns = [n.annotation]
                elif isinstance(n, (ast.FunctionDef, ast.AsyncFunctionDef)):
                    a = n.args
                    anns = [n.returns, *(x.annotation for x in (*a.posonlyargs, *a.args, *a.kwonlyargs))]
                if any("Any" in _names_in(x) for x in anns):
                    out.append((f"{rel}:{n.lineno}", f"{cls.name}: {ast.unparse(n).splitlines()[0]}"))
    return out


def circles(root: Path) -> list:
    imp = _imports()
    return [(" -> ".join(c), "circle") for c in imp.circles(imp.graph(root))]


def violations(root: Path) -> dict[str, list]:
    """Each shape rule -> its violations, (where, what) each."""
    long, wide, kwargs = function_rules(root)
    return {f"functions > {MAX_LINES}": long, f"params > {MAX_PARAMS}": wide, "**kwargs": kwargs,
            f"files > {MAX_FILE}": long_files(root), "replay in serve": replay_in_serve(root),
            "seam probes": seam_probes(root), "Any on seam": seam_any(root), "circles": circles(root)}


def functions(root: Path):
    """(lines, "path:name") of every function in the product packages."""
    out = []
    for pkg in PACKAGES:
        for p in sorted((root / pkg).rglob("*.py")):
            for qual, node in _defs(ast.parse(p.read_text())):
                out.append((node.end_lineno - node.lineno + 1, f"{p.relative_to(root)}:{qual}"))
    return sorted(out, reverse=True)


def private_uses(root: Path) -> int:
    """Uses of another package's private names (tests/test_names.py's reading: imports, attributes
    on another package's module, names only another package defines)."""
    spec = importlib.util.spec_from_file_location("kern_test_names", REPO / "tests" / "test_names.py")
    mod = importlib.util.module_from_spec(spec)
    sys.path.insert(0, str(REPO))
    try:
        spec.loader.exec_module(mod)
    finally:
        sys.path.remove(str(REPO))
    packages = [p for p in PACKAGES if (root / p).is_dir()]
    return len(mod.private_uses(root, packages, ("bench",)))


def shape(root: Path) -> tuple[dict, dict]:
    """The table's row for a tree, and its violations."""
    files = [p for pkg in PACKAGES for p in (root / pkg).rglob("*.py")]
    lines = sum(len(p.read_text().splitlines()) for p in files)
    funcs = functions(root)
    over = [f for f in funcs if f[0] > LONG and f[1].split("/")[0] in ("serve", "e2e")]
    found = violations(root)
    row = {"files": len(files), "lines": lines, "longest": ", ".join(f"{n} {name}" for n, name in funcs[:3]),
           f"serve/e2e > {LONG}": len(over), **{k: len(v) for k, v in found.items()},
           "private cross-package": private_uses(root)}
    if shutil.which("duplicates"):
        out = subprocess.run(["duplicates", "--repo", str(root), "--most", "200", "--seconds", "120"],
                             capture_output=True, text=True).stdout
        m = re.match(r"(\d+) pairs", out)
        row["duplicates pairs"] = int(m.group(1)) if m else "?"
    return row, found


def tree_of(rev: str, into: Path) -> Path:
    data = subprocess.run(["git", "-C", str(REPO), "archive", rev], capture_output=True, check=True).stdout
    with tarfile.open(fileobj=io.BytesIO(data)) as t:
        t.extractall(into, filter="data")
    subprocess.run(["git", "init", "-q", str(into)], check=True)  # so `duplicates` reads it as a checkout
    subprocess.run(["git", "-C", str(into), "add", "-A"], check=True)
    return into


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0], formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--rev", action="append", help="a git revision to read (repeatable); none: the working tree")
    args = ap.parse_args()
    rows, lists = [], []
    if not args.rev:
        row, found = shape(REPO)
        rows.append({"tree": "working tree", **row})
        lists.append(("working tree", found))
    for rev in args.rev or []:
        with tempfile.TemporaryDirectory() as d:
            row, found = shape(tree_of(rev, Path(d)))
        rows.append({"tree": rev, **row})
        lists.append((rev, found))
    print(tabulate(rows, headers="keys", tablefmt="github"))
    for tree, found in lists:
        for rule, items in found.items():
            if items:
                print(f"\n{tree}: {rule} ({len(items)})")
                for where, what in items:
                    print(f"  {where}  {what}")


if __name__ == "__main__":
    main()
