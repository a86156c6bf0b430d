"""Copy plans folded into runs: consecutive pages copied in one call (device to device, or between a
device page and the host tier), so a plan of many pages costs few copies."""

from __future__ import annotations

from typing import Iterable

__all__ = ["host_runs", "page_runs"]


def page_runs(pairs: Iterable[tuple[int, int]]) -> list[tuple[int, int, int]]:
    """Fold consecutive (src, dst) page pairs into (src, dst, count) runs."""
    out: list[list[int]] = []
    for s, d in pairs:
        if out and out[-1][0] + out[-1][2] == s and out[-1][1] + out[-1][2] == d:
            out[-1][2] += 1
        else:
            out.append([s, d, 1])
    return [tuple(r) for r in out]


def host_runs(pairs, host_page: int) -> list[tuple[int, int, int]]:
    """Fold consecutive (device page, host offset) pairs into (page, offset, count) runs."""
    out: list[list[int]] = []
    for d, h in pairs:
        if out and out[-1][0] + out[-1][2] == d and out[-1][1] + out[-1][2] * host_page == h:
            out[-1][2] += 1
        else:
            out.append([d, h, 1])
    return [tuple(r) for r in out]
