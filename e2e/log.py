"""The server's log: one event a line, ``key=value`` pairs after the event name (SPEC §7a).

`kv` follows the Rust kern gate: a quoted value loses its quotes (not unescaped); other values are
tried as int, then float, else kept as strings (``woken=true`` is the string ``"true"``).
"""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

__all__ = ["KV", "Log", "kv"]

KV = re.compile(r'(\w+)=("(?:[^"\\]|\\.)*"|\S+)')


def _value(text: str) -> Any:
    if len(text) >= 2 and text[0] == '"' and text[-1] == '"':
        return text[1:-1]
    for cast in (int, float):
        try:
            return cast(text)
        except ValueError:
            pass
    return text


def kv(line: str) -> dict[str, Any]:
    return {k: _value(v) for k, v in KV.findall(line)}


class Log:
    """A server's log file, read afresh on every question (the server keeps writing it)."""

    def __init__(self, path: str | Path):
        self.path = Path(path)

    def text(self) -> str:
        try:
            return self.path.read_text(errors="replace")
        except OSError:
            return ""

    def raw(self, tag: str) -> list[str]:
        needle = f" {tag} "
        return [ln for ln in self.text().splitlines() if needle in ln + " "]

    def lines(self, tag: str) -> list[dict[str, Any]]:
        """Every line with the event `tag` between spaces, parsed."""
        return [kv(ln) for ln in self.raw(tag)]

    def count(self, tag: str) -> int:
        return len(self.raw(tag))

    def tail(self, n: int = 8) -> str:
        return "\n".join(self.text().splitlines()[-n:])
