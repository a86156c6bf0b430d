"""`oracle_gate` and `summarize` (reference/kern-e2e.md §2.6–§2.7, with SPEC §9's exit 125)."""

from __future__ import annotations

from typing import Any

import pytest

from verdicts import EXIT_FAIL, EXIT_NOTHING_RAN, EXIT_PASS, oracle_gate, summarize

HEAD = "| target | checks | result |\n|---|---|---|"
NOTHING = "| — | — | nothing ran |"


@pytest.mark.parametrize(
    "ranks, available, gate",
    [
        # reference §2.6
        pytest.param(1, True, True, id="one-rank-oracle"),
        pytest.param(1, False, False, id="one-rank-no-oracle"),
        pytest.param(4, False, None, id="tray-no-oracle"),
        # our own
        pytest.param(4, True, True, id="tray-with-reference"),
        pytest.param(2, False, None, id="two-ranks-no-oracle"),
    ],
)
def test_oracle_gate(ranks: int, available: bool, gate: bool | None) -> None:
    assert oracle_gate(ranks, available) is gate


def check(name: str, ok: Any, note: str = "") -> dict[str, Any]:
    return {"name": name, "ok": ok, "note": note}


def ran(target: str, *checks: dict[str, Any]) -> dict[str, Any]:
    return {"target": target, "skipped": None, "checks": list(checks)}


def skipped(target: str, reason: str) -> dict[str, Any]:
    return {"target": target, "skipped": reason, "checks": []}


OK = ran("ok", check("a", True), check("b", None))
BAD = ran("bad", check("a", True), check("b", False), check("c", None), check("d", False))
SKIP = skipped("skip", "weights missing")

OK_ROW = "| ok | 1 gated, 1 reported | all pass |"
BAD_ROW = "| bad | 3 gated, 1 reported | FAIL: b, d |"
SKIP_ROW = "| skip | — | skipped: weights missing |"


@pytest.mark.parametrize(
    "reports, rows, code",
    [
        # reference §2.7, only-skipped adapted to 125
        pytest.param([SKIP], [SKIP_ROW, NOTHING], EXIT_NOTHING_RAN, id="only-skipped"),
        pytest.param([OK], [OK_ROW], EXIT_PASS, id="ok-true-none"),
        pytest.param([OK, BAD], [OK_ROW, BAD_ROW], EXIT_FAIL, id="ok-and-bad"),
        # our own
        pytest.param([], [NOTHING], EXIT_NOTHING_RAN, id="empty"),
        pytest.param([SKIP, skipped("s2", "2 ranks, 1 GPU")], [SKIP_ROW, "| s2 | — | skipped: 2 ranks, 1 GPU |",
                                                              NOTHING], EXIT_NOTHING_RAN, id="all-skipped"),
        pytest.param([SKIP, BAD, OK], [SKIP_ROW, BAD_ROW, OK_ROW], EXIT_FAIL, id="skipped-failing-passing"),
        pytest.param([SKIP, OK], [SKIP_ROW, OK_ROW], EXIT_PASS, id="skipped-and-passing"),
        pytest.param([BAD], [BAD_ROW], EXIT_FAIL, id="only-failing"),
        pytest.param([ran("r", check("x", None))], ["| r | 0 gated, 1 reported | all pass |"], EXIT_PASS,
                     id="reported-only-passes"),
        pytest.param([ran("e", check("kern_test", True), check("error", False, "RuntimeError: exit 101"))],
                     ["| e | 2 gated, 0 reported | FAIL: error |"], EXIT_FAIL, id="error-check-fails"),
        pytest.param([ran("n")], ["| n | 0 gated, 0 reported | all pass |"], EXIT_PASS, id="ran-without-checks"),
        pytest.param([skipped("p", "a|b")], ["| p | — | skipped: a\\|b |", NOTHING], EXIT_NOTHING_RAN,
                     id="pipe-escaped"),
    ],
)
def test_summarize(reports: list[dict[str, Any]], rows: list[str], code: int) -> None:
    table, exit_code = summarize(reports)
    assert table == "\n".join([HEAD, *rows])
    assert exit_code == code


def test_exit_codes() -> None:
    assert (EXIT_PASS, EXIT_FAIL, EXIT_NOTHING_RAN) == (0, 1, 125)


def test_extra_keys_ignored_and_iterables_accepted() -> None:
    report = {**OK, "facts": {"page": 16}, "counters": {"default": {}}}
    assert summarize(iter([report])) == ("\n".join([HEAD, OK_ROW]), EXIT_PASS)


@pytest.mark.parametrize(
    "report",
    [
        pytest.param(ran("t", check("a", 1)), id="ok-int"),
        pytest.param(ran("t", check("a", 0)), id="ok-zero"),
        pytest.param(ran("t", check("a", "yes")), id="ok-str"),
        pytest.param({"target": "t", "checks": []}, id="no-skipped-key"),
        pytest.param({"skipped": None, "checks": []}, id="no-target-key"),
        pytest.param({"target": "t", "skipped": None}, id="no-checks-key"),
    ],
)
def test_malformed_report_rejected(report: dict[str, Any]) -> None:
    with pytest.raises(ValueError):
        summarize([report])
