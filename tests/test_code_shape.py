"""The shape rules (docs/architecture.md, "The shape rules"), held over every product package and
bench/ by bench/code_shape.py: each of its counts is 0. The reader itself is shown to catch each rule
on a small tree built to break it, and to pass what the rules allow."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest
from conftest import bench_module

ROOT = Path(__file__).resolve().parent.parent


def _code_shape():
    return bench_module("code_shape")


SHAPE = _code_shape()

ALLOWED_FOR_NOW: set[str] = set()  # a rule's violation tolerated for now, by name (none today)

FOUND = SHAPE.violations(ROOT)


@pytest.mark.parametrize("rule", list(FOUND))
def test_no_violation_of(rule):
    left = [f"{where}  {what}" for where, what in FOUND[rule] if where not in ALLOWED_FOR_NOW]
    assert not left, f"{rule}:\n" + "\n".join(left)


def test_every_exemption_names_something_that_exists_and_says_why():
    for key, (rule, reason) in SHAPE.EXEMPT.items():
        path, _, qual = key.partition(":")
        assert (ROOT / path).is_file(), key
        assert rule in ("file", "kwargs") and len(reason) > 20, key
        if qual:
            assert qual in {q for q, _ in SHAPE._defs(ast.parse((ROOT / path).read_text()))}, key


def test_allowed_for_now_lists_only_what_is_still_there():
    found = {where for items in FOUND.values() for where, _ in items}
    assert ALLOWED_FOR_NOW <= found, sorted(ALLOWED_FOR_NOW - found)


def test_the_reader_catches_each_rule(tmp_path):
    (tmp_path / "serve").mkdir()
    (tmp_path / "tests").mkdir()
    long_body = "\n".join(f"    x{i} = {i}" for i in range(60))
    wide = ", ".join(f"a{i}" for i in range(13))
    (tmp_path / "serve" / "bad.py").write_text(
        f"def long():\n{long_body}\n\n\ndef wide({wide}):\n    pass\n\n\ndef loose(**kw):\n    pass\n")
    (tmp_path / "serve" / "big.py").write_text("x = 1\n" * 501)
    (tmp_path / "serve" / "trace_replay.py").write_text("import replay.run\n")
    (tmp_path / "serve" / "client").mkdir()
    (tmp_path / "serve" / "client" / "seam.py").write_text(
        "from typing import Any, Protocol\n\n\nclass EngineClient(Protocol):\n    faults: Any\n\n\n"
        "def use(c: EngineClient):\n    return getattr(c, 'x', None)\n")
    (tmp_path / "serve" / "fine.py").write_text(
        "import click\n\n\n@click.command()\ndef cmd(**kw):\n    flags = Flags(**kw)\n    return flags\n\n\n"
        "def snug(self, a0, a1, a2, a3, a4, a5, a6, a7, a8, a9, a10, a11):\n    pass\n")
    found = SHAPE.violations(tmp_path)
    assert [w for w, _ in found["functions > 60"]] == ["serve/bad.py:long"]
    assert [w for w, _ in found["params > 12"]] == ["serve/bad.py:wide"]
    assert [w for w, _ in found["**kwargs"]] == ["serve/bad.py:loose"]
    assert [w for w, _ in found["files > 500"]] == ["serve/big.py"]
    assert [w for w, _ in found["replay in serve"]] == ["serve/trace_replay.py"]
    assert [w for w, _ in found["seam probes"]] == ["serve/client/seam.py:9"]
    assert [w for w, _ in found["Any on seam"]] == ["serve/client/seam.py:5"]
