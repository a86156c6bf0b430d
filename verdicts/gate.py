"""The gate's verdicts over whole targets: the oracle gate, and the summary with its exit code.

A report is what the e2e driver writes per target (``report.json``); `summarize` reads only these
keys and ignores any others (``facts``, ``counters``)::

    {
        "target": "toy-paged",              # str
        "skipped": None,                    # None when the target ran, else the reason (str)
        "checks": [                         # in the order they ran; [] for a skipped target
            {"name": "conc1_equals_run",    # str
             "ok": True,                    # True pass, False FAIL (gated); None reported only
             "note": "12/12 identical"},    # str
        ],
    }

Exit codes (SPEC §9): `EXIT_NOTHING_RAN` (125) when no target ran, all skipped or none given, so
``git bisect run`` skips the commit; else `EXIT_FAIL` (1) if any gated check failed; else
`EXIT_PASS` (0). Usage errors (2) are the driver's, before any report exists.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from typing import Any, TypedDict

__all__ = ["EXIT_FAIL", "EXIT_NOTHING_RAN", "EXIT_PASS", "Check", "Report", "oracle_gate", "summarize"]

EXIT_PASS = 0
"""Every gated check of every target that ran passed."""
EXIT_FAIL = 1
"""Some gated check failed."""
EXIT_NOTHING_RAN = 125
"""No target ran; ``git bisect run`` reads 125 as "skip this commit"."""


class Check(TypedDict, total=False):
    """One check of a target: ``ok`` True pass, False FAIL, None reported only; ``error`` True when
    the check could not run (a step it needs failed or hung): a failure, never a dropped check."""

    name: str
    ok: bool | None
    note: str
    error: bool
    skipped: list[str]  # the capabilities the engine under test lacks for it (docs/engine-contract.md)
    first: dict  # its first wrong answer: label, cached, tier, prompt, divergence (`verdicts.Same.first`)


class Report(TypedDict):
    """One target's report: ``skipped`` None when it ran, else why not."""

    target: str
    skipped: str | None
    checks: list[Check]


def oracle_gate(ranks: int, available: bool) -> bool | None:
    """Gate on the oracle if there is one; a tray (ranks > 1) only reports; one rank without one fails."""
    if available:
        return True
    if ranks > 1:
        return None
    return False


def _cell(text: str) -> str:
    # a "|" inside a cell would split the markdown row
    return text.replace("|", "\\|")


def _row(report: Mapping[str, Any]) -> tuple[str, bool | None]:
    """The table row and whether the target passed; None when it was skipped."""
    try:
        target, skipped, checks = report["target"], report["skipped"], report["checks"]
    except KeyError as exc:
        raise ValueError(f"report lacks {exc.args[0]!r}: {dict(report)!r}") from exc
    if skipped is not None:
        return f"| {_cell(str(target))} | — | skipped: {_cell(str(skipped))} |", None
    for check in checks:
        if not (check["ok"] is None or isinstance(check["ok"], bool)):
            raise ValueError(f"check ok must be True, False or None: {check!r}")
    gated = [c for c in checks if c["ok"] is not None]
    lacked = [c for c in checks if c.get("skipped")]
    bad = [c["name"] for c in gated if c["ok"] is False]
    result = f"FAIL: {', '.join(bad)}" if bad else "all pass"
    counts = f"{len(gated)} gated, {len(checks) - len(gated) - len(lacked)} reported"
    if lacked:
        counts += f", {len(lacked)} skipped"
        if len(lacked) == len(checks):  # nothing was judged: the engine could be gated on none of it
            return f"| {_cell(str(target))} | {counts} | every check skipped |", None
    return f"| {_cell(str(target))} | {counts} | {_cell(result)} |", not bad


def summarize(reports: Iterable[Mapping[str, Any]]) -> tuple[str, int]:
    """The markdown summary table (one row per target) and the gate's exit code."""
    lines = ["| target | checks | result |", "|---|---|---|"]
    ran: list[bool] = []
    for report in reports:
        line, passed = _row(report)
        lines.append(line)
        if passed is not None:
            ran.append(passed)
    if not ran:
        lines.append("| — | — | nothing ran |")
        return "\n".join(lines), EXIT_NOTHING_RAN
    return "\n".join(lines), EXIT_PASS if all(ran) else EXIT_FAIL
