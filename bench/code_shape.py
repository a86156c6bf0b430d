"""The code's shape, as issue 30 counts it: product files and lines, the longest functions (and how
many are over 80 lines in serve/ and e2e/), import circles, uses of another package's private names,
and, when the `duplicates` tool is on the PATH, its pair count. For a before/after, give a git
revision: it is read from `git archive REV` in a temporary folder.

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
PACKAGES = ("toy", "manifests", "runtime", "pool", "serve", "replay", "oracle", "verdicts", "e2e")
LONG = 80


def _imports():
    spec = importlib.util.spec_from_file_location("kern_test_imports", REPO / "tests" / "test_imports.py")
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def functions(root: Path):
    """(lines, "path:name") of every function in the product packages."""
    out = []
    for pkg in PACKAGES:
        for p in sorted((root / pkg).rglob("*.py")):
            for node in ast.walk(ast.parse(p.read_text())):
                if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
                    out.append((node.end_lineno - node.lineno + 1, f"{p.relative_to(root)}:{node.name}"))
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
    packages = [p for p in (*PACKAGES, "kern") if (root / p).is_dir()]
    return len(mod.private_uses(root, packages, ("bench",)))


def shape(root: Path) -> dict:
    imp = _imports()
    files = [p for pkg in PACKAGES for p in (root / pkg).rglob("*.py")]
    lines = sum(len(p.read_text().splitlines()) for p in files)
    funcs = functions(root)
    over = [f for f in funcs if f[0] > LONG and f[1].split("/")[0] in ("serve", "e2e")]
    edges = imp.graph(root)
    row = {"files": len(files), "lines": lines, "longest": ", ".join(f"{n} {name}" for n, name in funcs[:3]),
           f"serve/e2e > {LONG}": len(over), "circles": len(imp.circles(edges)),
           "private cross-package": private_uses(root)}
    if shutil.which("duplicates"):
        out = subprocess.run(["duplicates", "--repo", str(root), "--most", "200", "--seconds", "120"],
                             capture_output=True, text=True).stdout
        m = re.match(r"(\d+) pairs", out)
        row["duplicates pairs"] = int(m.group(1)) if m else "?"
    return row


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
    rows = []
    if not args.rev:
        rows.append({"tree": "working tree", **shape(REPO)})
    for rev in args.rev or []:
        with tempfile.TemporaryDirectory() as d:
            rows.append({"tree": rev, **shape(tree_of(rev, Path(d)))})
    print(tabulate(rows, headers="keys", tablefmt="github"))


if __name__ == "__main__":
    main()
