"""`accept_rate` and `acceptance_holds` (reference/kern-e2e.md §2.5, the newer rule)."""

from __future__ import annotations

from typing import Any

import pytest

from verdicts import BURST_SHARE, accept_rate, acceptance_holds


@pytest.mark.parametrize(
    "windows, rate",
    [
        # reference §2.5
        pytest.param([{"accept_pct": 20, "steps": 100}, {"accept_pct": 40, "steps": 300}, {"steps": 50}], 35.0,
                     id="steps-weighted"),
        pytest.param([{"steps": 50}], None, id="no-rate"),
        # our own
        pytest.param([], None, id="no-windows"),
        pytest.param([{"accept_pct": 20}, {"accept_pct": 40, "steps": None}], None, id="rated-without-steps"),
        pytest.param([{"accept_pct": 20}, {"accept_pct": 60, "steps": 10}], 60.0, id="stepless-window-weightless"),
        pytest.param([{"accept_pct": 0, "steps": 100}, {"accept_pct": 50, "steps": 100}], 25.0, id="zero-rate-counts"),
        pytest.param([{"accept_pct": None, "steps": 900}, {"accept_pct": 50, "steps": 1}], 50.0,
                     id="none-rate-skipped"),
        pytest.param([{"accept_pct": 10, "steps": 1}, {"accept_pct": 20, "steps": 2}], 16.7, id="rounded-to-tenth"),
        pytest.param([{"accept_pct": 50.0, "steps": 7, "running": 3, "tok_s": 1.5}], 50.0, id="other-keys-ignored"),
    ],
)
def test_accept_rate(windows: list[dict[str, Any]], rate: float | None) -> None:
    assert accept_rate(windows) == rate
    assert accept_rate(iter(windows)) == rate


@pytest.mark.parametrize(
    "serial, burst, bounds, holds",
    [
        # reference §2.5
        pytest.param(48, 47, None, True, id="48-47"),
        pytest.param(48, 43.2, None, True, id="48-at-ninety-pct"),
        pytest.param(48, 40, None, False, id="48-40"),
        pytest.param(None, 30, None, False, id="no-serial"),
        pytest.param(30, None, None, False, id="no-burst"),
        pytest.param(0, 0, None, False, id="zero-serial"),
        pytest.param(48, 48, (40, 60), True, id="bounds-inside"),
        pytest.param(33, 33, (40, 60), False, id="bounds-below"),
        pytest.param(70, 70, (40, 60), False, id="bounds-above"),
        # our own
        pytest.param(50, 45, None, True, id="exactly-ninety-pct"),
        pytest.param(50, 44.9, None, False, id="just-below-ninety-pct"),
        pytest.param(48, 96, None, True, id="burst-above-serial"),
        pytest.param(48, 0, None, False, id="zero-burst"),
        pytest.param(40, 40, (40, 60), True, id="bounds-low-edge"),
        pytest.param(60, 60, (40, 60), True, id="bounds-high-edge"),
        pytest.param(48, 40, (40, 60), False, id="bounds-inside-burst-low"),
        pytest.param(50, 60, (40, 60), True, id="bounds-judge-serial-not-burst"),
    ],
)
def test_acceptance_holds(
    serial: float | None, burst: float | None, bounds: tuple[float, float] | None, holds: bool
) -> None:
    assert acceptance_holds(serial, burst, bounds) is holds


def test_burst_share_is_ninety_pct() -> None:
    assert BURST_SHARE == 0.9
