"""The server's counters: ``GET /stats`` when it has one, else its ``stats`` log lines (SPEC §7, §7a).

`Stats.read` flattens ``/stats`` into one dict (counters and gauges) plus ``facts`` and the set of
parked lengths. A server without ``/stats`` (the Rust kern-serve) is read from its log: window
counters summed, gauges last seen, parked lengths from the `` parked `` lines.
"""

from __future__ import annotations

import time
from typing import Any

from e2e.client import Client
from e2e.log import Log
from verdicts import accept_rate

__all__ = ["Stats", "acceptance"]

WINDOW_SUMS = ("steps", "parks", "wakes", "host_hits", "resident_hits", "evictions", "host_evictions",
               "prefill_tokens", "prefix_hit_tokens", "host_hit_tokens", "resident_hit_tokens")
GAUGES = ("remaps", "slots", "slots_used", "checkpoints", "parked", "host_gib", "accept_pct", "accepted")


def acceptance(before: dict[str, Any], after: dict[str, Any]) -> tuple[float | None, float | None]:
    """(accept_pct, tokens per round) of the rounds between two `/stats` reads.

    ``drafted_rows`` counts rows past row 0 and ``accepted_rows`` the drafts accepted (count − 1),
    so the share is theirs and a round yields ``1 + accepted/rounds`` tokens.
    """
    rounds = after.get("rounds", 0) - before.get("rounds", 0)
    drafted = after.get("drafted_rows", 0) - before.get("drafted_rows", 0)
    accepted = after.get("accepted_rows", 0) - before.get("accepted_rows", 0)
    if not rounds or not drafted:
        return None, None
    return round(100.0 * accepted / drafted, 1), round(1 + accepted / rounds, 2)


class Stats:
    def __init__(self, client: Client, log: Log, reads_log: bool = True):
        self.client = client
        self.log = log
        self.reads_log = reads_log  # False: an engine under the contract, whose log says nothing the gate reads
        self.has_endpoint: bool | None = None

    def read(self) -> dict[str, Any]:
        """Counters and gauges in one dict, with ``facts`` and ``parked_lengths`` (a set)."""
        raw = self.client.stats() if self.has_endpoint is not False else None
        self.has_endpoint = raw is not None
        if raw is not None:
            out: dict[str, Any] = {**raw.get("counters", {}), **raw.get("gauges", {})}
            out["facts"] = raw.get("facts", {})
            out["parked_lengths"] = set(raw.get("parked_lengths") or [])
            out["answer_tokens"] = (raw.get("timing") or {}).get("tokens")  # every answer's tokens so far
            return out
        return self._from_log()

    def logged_parks(self) -> set[int]:
        return {p["tokens"] for p in self.log.lines("parked") if isinstance(p.get("tokens"), int)}

    def _from_log(self) -> dict[str, Any]:
        windows = self.log.lines("stats")
        out: dict[str, Any] = {k: sum(w.get(k, 0) or 0 for w in windows) for k in WINDOW_SUMS}
        for w in windows:
            out.update({k: w[k] for k in GAUGES if k in w})
        out["accept_pct"] = accept_rate(windows)
        out["facts"] = {}
        out["parked_lengths"] = self.logged_parks()
        out["windows"] = len(windows)
        return out

    def flush(self) -> None:
        """Close the log's stats window (only a server without ``/stats`` needs it: one read finds
        out, so a server that has one never pays the window's 5 s)."""
        if self.has_endpoint is None:
            self.read()
        if self.has_endpoint or not self.reads_log:
            return
        time.sleep(5.2)
        self.client.complete("Hi", 1)
        time.sleep(0.5)

    def idle(self, timeout: float = 30.0) -> dict[str, Any]:
        """Wait until nothing runs or waits; the last read."""
        t0 = time.monotonic()
        while True:
            s = self.read()
            if not self.has_endpoint or (not s.get("running") and not s.get("waiting")):
                return s
            if time.monotonic() - t0 > timeout:
                return s
            time.sleep(0.02)
