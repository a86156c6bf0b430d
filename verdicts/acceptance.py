"""Speculative acceptance: the serial rate, and whether a burst keeps it.

Windows are parsed ``stats`` lines: mappings with an optional ``accept_pct`` (the window's share
of drafted rows accepted) and ``steps``. A batch changes reduction order, not what a sequence
accepts, so a burst must keep `BURST_SHARE` of the serial rate.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from typing import Any

__all__ = ["BURST_SHARE", "accept_rate", "acceptance_holds"]

BURST_SHARE = 0.9
"""The least share of the serial acceptance rate a burst must keep."""


def accept_rate(windows: Iterable[Mapping[str, Any]]) -> float | None:
    """Steps-weighted mean ``accept_pct`` over the windows that report one, to 0.1; None if no steps."""
    rated: list[tuple[float, float]] = [
        (w["accept_pct"], w.get("steps") or 0) for w in windows if w.get("accept_pct") is not None
    ]
    total = sum(n for _, n in rated)
    if total == 0:
        return None
    return round(sum(p * n for p, n in rated) / total, 1)


def acceptance_holds(
    serial: float | None,
    burst: float | None,
    bounds: tuple[float, float] | None = None,
) -> bool:
    """Burst ≥ `BURST_SHARE` × serial, serial nonzero, and serial inside the reference's `bounds`."""
    if not serial or burst is None:
        return False
    if burst < serial * BURST_SHARE:
        return False
    return bounds is None or bounds[0] <= serial <= bounds[1]
