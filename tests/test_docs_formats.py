"""docs/manifest.md and docs/config.md hold every key their loaders accept, and no other.

The key sets come from the code: the config's from `manifests.config` (TOP_KEYS, TARGET_KEYS); the
manifest's from `manifests/load.py`'s source, read as a syntax tree: the fields each `_Errors.fields`
call accepts (required and optional), the keys it reads with `.get("k")` or tests with `"k" in d`,
and the one-key forms it matches (`k == "var"`, `k in ("i32", "i64")` on a `.items()` unpacking).
A doc's keys are the first column of its tables headed `| key | type | default | meaning |`.
"""

from __future__ import annotations

import ast
import importlib
import re
from pathlib import Path

import pytest


from manifests import config, expr, schema

load = importlib.import_module("manifests.load")  # the module (the package exports its load function)

REPO = Path(__file__).resolve().parents[1]
DOCS = REPO / "docs"
HEADER = re.compile(r"^\|\s*key\s*\|\s*type\s*\|\s*default\s*\|\s*meaning\s*\|\s*$")


def _strs(node: ast.AST) -> tuple[str, ...] | None:
    """The strings of a tuple or list of string constants (or one string constant)."""
    if isinstance(node, ast.Constant) and isinstance(node.value, str):
        return (node.value,)
    if isinstance(node, (ast.Tuple, ast.List)) and all(
            isinstance(e, ast.Constant) and isinstance(e.value, str) for e in node.elts):
        return tuple(e.value for e in node.elts)
    return None


def _names(target: ast.AST) -> list[str]:
    return [n.id for n in ast.walk(target) if isinstance(n, ast.Name)]


def loader_keys(source: str) -> set[str]:
    """Every object key the manifest loader's source accepts (module docstring)."""
    keys: set[str] = set()
    for fn in ast.walk(ast.parse(source)):
        if not isinstance(fn, ast.FunctionDef):
            continue
        named: dict[str, tuple[str, ...]] = {}  # a name bound to string constants in this function
        item_keys: set[str] = set()  # names bound to a key by unpacking `d.items()`
        for node in ast.walk(fn):
            if isinstance(node, ast.Assign) and len(node.targets) == 1:
                t, v = node.targets[0], node.value
                if isinstance(t, ast.Name) and _strs(v) and not isinstance(v, ast.Constant):
                    named[t.id] = _strs(v)
                if isinstance(v, ast.Call) and isinstance(v.func, ast.Attribute) and v.func.attr == "items":
                    item_keys.update(_names(t))
            elif isinstance(node, (ast.For, ast.comprehension)) and isinstance(node.target, ast.Name) and _strs(node.iter):
                named[node.target.id] = _strs(node.iter)

        def resolve(node: ast.AST) -> tuple[str, ...]:
            if isinstance(node, ast.Name):
                return named.get(node.id, ())
            if isinstance(node, (ast.Tuple, ast.List)):
                return tuple(s for e in node.elts for s in (_strs(e) or resolve(e)))
            return _strs(node) or ()

        for node in ast.walk(fn):
            if isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute):
                if node.func.attr == "fields":
                    for a in node.args[2:]:
                        keys.update(resolve(a))
                elif node.func.attr == "get" and node.args:
                    keys.update(resolve(node.args[0]))
            elif isinstance(node, ast.Compare) and len(node.ops) == 1:
                left, right = node.left, node.comparators[0]
                if isinstance(node.ops[0], ast.In) and isinstance(left, ast.Constant) and \
                        isinstance(left.value, str) and left.value.isidentifier():
                    keys.add(left.value)  # "index_into" in d (not "/" in name)
                elif isinstance(left, ast.Name) and left.id in item_keys and isinstance(node.ops[0], (ast.Eq, ast.In)):
                    keys.update(resolve(right))  # k == "var", k in ("i32", "i64")
    return keys


def doc_keys(text: str) -> dict[str, set[str]]:
    """The keys of each `## ` section's key tables: {section heading: keys}; '' for the whole doc."""
    out: dict[str, set[str]] = {"": set()}
    section, in_table = "", False
    for line in text.splitlines():
        if line.startswith("## "):
            section, in_table = line[3:].strip(), False
            out.setdefault(section, set())
        elif HEADER.match(line):
            in_table = True
        elif in_table and line.startswith("|"):
            m = re.match(r"^\|\s*`([^`]+)`\s*\|", line)
            if m:
                out[section].add(m.group(1))
                out[""].add(m.group(1))
        else:
            in_table = False
    return out


def test_the_tree_reading_finds_the_keys_it_should():
    # a loader with one key of each form: the reading must find them all and nothing else
    src = '''
def _x(path, d, err):
    top = ("a", "b")
    if not err.fields(path, d, top, ("c",)):
        return None
    for k in ("d", "e"):
        d.get(k, False)
    d.get("f")
    if "g" in d or "/" in path:
        pass
    (k, v), = d.items()
    if k == "h" or k in ("i", "j"):
        pass
    if k not in top:
        pass
'''
    assert loader_keys(src) == set("abcdefghij")


def test_manifest_doc_lists_every_key_the_loader_accepts():
    accepted = loader_keys((REPO / "manifests" / "load.py").read_text())
    # the reading found the sections and a few keys of each form (a broken reading finds nothing)
    assert {"schema_version", "programs", "bytes_per_token", "index_into", "stride", "offset", "expr",
            "param", "context", "sha256", "monotone"} <= accepted
    documented = doc_keys((DOCS / "manifest.md").read_text())[""]
    assert not accepted - documented, f"docs/manifest.md lacks keys the loader accepts: {sorted(accepted - documented)}"
    assert not documented - accepted, f"docs/manifest.md lists keys the loader refuses: {sorted(documented - accepted)}"


def test_manifest_doc_lists_every_value_the_schema_accepts():
    text = (DOCS / "manifest.md").read_text()
    values = {*schema.DTYPES, *schema.KINDS, *schema.INPUT_FILLS, *schema.OUTPUT_FILLS, *schema.AXES,
              *schema.SCALARS, *expr.OPS}
    missing = sorted(v for v in values if f"`{v}`" not in text)
    assert not missing, f"docs/manifest.md does not name these values: {missing}"
    assert f"must be {load.SCHEMA_VERSION}" in text


@pytest.mark.parametrize("section, keys", [("Top-level keys", config.TOP_KEYS),
                                           ("Target keys: `[targets.NAME]`", config.TARGET_KEYS)])
def test_config_doc_lists_every_key_the_reader_accepts(section, keys):
    documented = doc_keys((DOCS / "config.md").read_text())
    assert section in documented, f"docs/config.md has no section {section!r}"
    got = documented[section]
    assert not keys - got, f"docs/config.md's {section!r} lacks keys the reader accepts: {sorted(keys - got)}"
    assert not got - keys, f"docs/config.md's {section!r} lists keys the reader refuses: {sorted(got - keys)}"


def test_config_doc_links_the_engine_contract_for_its_keys():
    assert "](engine-contract.md" in (DOCS / "config.md").read_text()


def _docs() -> list[Path]:
    return [REPO / "README.md", *sorted(DOCS.glob("*.md"))]


def test_docs_cite_nothing_outside_the_repo():
    """No SPEC section and no reference/ file (neither is in the repo), and every relative link
    resolves to a file that is."""
    problems = []
    for p in _docs():
        text = p.read_text()
        for m in re.finditer(r"\bSPEC\b|\breference/[\w.-]+\.md", text):
            problems.append(f"{p.name}: cites {m.group(0)!r}")
        for m in re.finditer(r"\]\(([^)#\s]+)(#[^)]*)?\)", text):
            target = m.group(1)
            if "://" in target or target.startswith("mailto:"):
                continue
            if not (p.parent / target).exists():
                problems.append(f"{p.name}: links {target!r}, which is not in the repo")
    assert not problems, "\n".join(problems)
