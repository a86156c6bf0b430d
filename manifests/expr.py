"""Launch-geometry expressions: a constant, a var name, or {ceil_div|mul|add: [e, c]}."""

from __future__ import annotations

from typing import Any

OPS = {
    "ceil_div": lambda a, b: -(-a // b),
    "mul": lambda a, b: a * b,
    "add": lambda a, b: a + b,
}


def names(e: Any) -> set[str]:
    """The var names an expression mentions."""
    if isinstance(e, str):
        return {e}
    if isinstance(e, dict) and len(e) == 1:
        (_, args), = e.items()
        if isinstance(args, list):
            return set().union(*(names(a) for a in args))
    return set()


def check(e: Any) -> str | None:
    """None if `e` is well formed, else what is wrong."""
    if isinstance(e, bool):
        return f"not an expression: {e!r}"
    if isinstance(e, (int, str)):
        return None
    if isinstance(e, dict) and len(e) == 1:
        (op, args), = e.items()
        if op not in OPS:
            return f"unknown operator {op!r} (one of {', '.join(OPS)})"
        if not (isinstance(args, list) and len(args) == 2 and isinstance(args[1], int)):
            return f"{op} takes [expression, constant]"
        return check(args[0])
    return f"not an expression: {e!r}"


def evaluate(e: Any, env: dict[str, int]) -> int:
    if isinstance(e, int):
        return e
    if isinstance(e, str):
        return env[e]
    (op, (a, c)), = e.items()
    return OPS[op](evaluate(a, env), c)
