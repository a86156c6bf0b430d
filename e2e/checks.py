"""The checks of one target: recorded in order, printed as they complete, filtered by `--scenarios`.

A check is ``(name, ok, note)``: ok True passes, False fails (gated), None is reported only. Steps
that run only because a named check depends on them add nothing; ``error`` is always recorded.
A check the engine under test cannot be judged on (docs/engine-contract.md) is recorded
``skipped (engine lacks X)``: ok None and ``skipped`` naming the capabilities, whatever the step found.
A check also records how many near-tie tokens its identity verdicts excused (float targets).
"""

from __future__ import annotations

from typing import Callable

from e2e.engine import FRESH
from e2e.scenarios import lacking
from verdicts import Check

__all__ = ["Checks", "mark"]

SKIP_MEANS = {"eviction_proven": "eviction not exercised"}
"""What a skip of these checks leaves untested, said in its note after what the engine lacks."""


def mark(ok: bool | None, error: bool = False, skipped: bool = False) -> str:
    if skipped:
        return "[skip]"
    return "[ERR ]" if error else {True: "[ok  ]", False: "[FAIL]", None: "[info]"}[ok]


class Checks:
    def __init__(self, wanted: set[str] | None = None, echo: Callable[[str], None] = print, engine=None):
        self.wanted = wanted
        self.echo = echo
        self.engine = engine  # an `e2e.engine.Engine`: checks needing what it lacks are skipped
        self.list: list[Check] = []
        self.excused: dict[str, int] = {}  # near-tie tokens excused, per check

    def lacks(self, name: str) -> list[str]:
        """The capabilities the engine under test lacks for check `name` (none: it is judged)."""
        return [] if self.engine is None else lacking(self.engine, name)

    def skip(self, name: str, lacks: list[str]) -> None:
        """Record check `name` as not applicable to this engine: ``skipped (engine lacks X)``."""
        if lacks == [FRESH]:  # a running engine without a cache reset (e2e --engine-url)
            return self.skip_because(name, lacks, "needs a fresh engine")
        if not self.reports(name) or name in self.names():
            return
        note = f"skipped (engine lacks {', '.join(lacks)}" + (f"; {SKIP_MEANS[name]})" if name in SKIP_MEANS else ")")
        self.list.append(Check(name=name, ok=None, note=note, skipped=list(lacks)))
        self.echo(f"  {mark(None, skipped=True)} {name}: {note}")

    def skip_because(self, name: str, lacks: list[str], why: str) -> None:
        """Record check `name` as skipped for `why` (``skipped (why)``), `lacks` what it lacked."""
        if not self.reports(name) or name in self.names():
            return
        note = f"skipped ({why})"
        self.list.append(Check(name=name, ok=None, note=note, skipped=list(lacks)))
        self.echo(f"  {mark(None, skipped=True)} {name}: {note}")

    def reports(self, name: str) -> bool:
        return name == "error" or self.wanted is None or name in self.wanted

    def add(self, name: str, ok: bool | None, note: str, excused: int = 0, first: dict | None = None) -> None:
        """Record a check; `excused` counts the near-tie tokens its identity verdicts excused; `first` is
        its first wrong answer (`verdicts.Same.first`: what it was served from, its prompt), if it had one."""
        if not self.reports(name):
            return
        lacks = self.lacks(name)
        if lacks:
            self.skip(name, lacks)
            return
        self.list.append(Check(name=name, ok=ok, note=note, **({"first": first} if first and ok is False else {})))
        if excused:
            self.excused[name] = self.excused.get(name, 0) + excused
        self.echo(f"  {mark(ok)} {name}: {note}")

    def could_not_run(self, name: str, why: str) -> None:
        """Record a check its step never judged (a step it needs failed, hung or was not reached): a
        gated failure marked ``error``, so it is in the console, the report and JUnit, never dropped."""
        if not self.reports(name) or name in self.names():
            return
        lacks = self.lacks(name)
        if lacks:
            self.skip(name, lacks)
            return
        note = f"not run: {why}"
        self.list.append(Check(name=name, ok=False, note=note, error=True))
        self.echo(f"  {mark(False, True)} {name}: {note}")

    def names(self) -> set[str]:
        return {c["name"] for c in self.list}

    def fork(self) -> "Checks":
        """An empty list with the same filter and echo, for one lane; `extend` takes it back in."""
        return Checks(self.wanted, self.echo, self.engine)

    def extend(self, other: "Checks") -> None:
        """Take in a lane's checks (already filtered and echoed), in their order."""
        self.list.extend(other.list)
        for name, n in other.excused.items():
            self.excused[name] = self.excused.get(name, 0) + n

    def failed(self) -> list[str]:
        return [c["name"] for c in self.list if c["ok"] is False]
