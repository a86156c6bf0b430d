"""Counters (cumulative), the 5 s window behind the `stats` line, and the /stats view (/metrics is
serve/api/metrics.py, over the same counters and gauges).

Gauges are read from the pool and the index when asked, on the scheduler thread; the snapshot pages
and slots are recounted from the index's stores, not from the pool's tallies, so a leak shows.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field

from pool import Tier
from serve.common import logs

__all__ = ["COUNTERS", "GAUGES", "Counters", "Window", "core_gauges", "core_stats", "snapshot_holdings"]

COUNTERS = (
    "requests", "steps", "rounds", "drafted_rows", "accepted_rows", "prefill_tokens", "prefix_hit_tokens",
    "resident_hits", "resident_hit_tokens", "host_hits", "host_hit_tokens", "parks", "wakes", "wake_tokens",
    "evictions", "host_evictions", "remaps", "not_kept", "prefill_calls", "aborted", "batched_steps",
)
GAUGES = (
    "running", "waiting", "leases", "pages_used", "snapshot_pages", "slots", "slots_used", "snapshot_slots",
    "resident_entries", "parked_entries", "host_used_bytes",
)
# windowed in the stats line (the rest of the line is gauges)
WINDOWED = (
    "steps", "prefill_tokens", "prefix_hit_tokens", "resident_hits", "resident_hit_tokens", "host_hits",
    "host_hit_tokens", "parks", "wakes", "evictions", "host_evictions", "rounds", "drafted_rows",
    "accepted_rows",
)


@dataclass(slots=True)
class Counters:
    values: dict[str, int] = field(default_factory=lambda: dict.fromkeys(COUNTERS, 0))
    tokens: int = 0  # answer tokens emitted
    step_s: float = 0.0  # inside runtime.step (the kernels and their staging)
    loop_s: float = 0.0  # whole scheduler iterations that ran a step
    copy_s: float = 0.0  # copies, parks, wakes, remaps
    queried: int = 0  # prompt tokens of admitted requests: /metrics' prefix-cache queries (not in /stats)

    def add(self, name: str, n: int = 1) -> None:
        self.values[name] += n

    def __getitem__(self, name: str) -> int:
        return self.values[name]

    def copy(self) -> Counters:
        return Counters(dict(self.values), self.tokens, self.step_s, self.loop_s, self.copy_s, self.queried)


class Window:
    """Logs one `stats` line per `every` seconds in which something happened."""

    def __init__(self, counters: Counters, every: float = 5.0) -> None:
        self.counters = counters
        self.every = every
        self.start = time.monotonic()
        self.base = counters.copy()

    def due(self) -> bool:
        return time.monotonic() - self.start >= self.every

    def flush(self, gauges: dict[str, int]) -> None:
        now = time.monotonic()
        c, b = self.counters, self.base
        d = {k: c[k] - b[k] for k in WINDOWED}
        if d["steps"] or d["prefix_hit_tokens"] or c.tokens != b.tokens:
            secs = max(now - self.start, 1e-9)
            drafted, rounds = d["drafted_rows"], d["rounds"]
            logs.event(
                "stats",
                running=gauges["running"], waiting=gauges["waiting"], steps=d["steps"],
                step_ms=1000 * (c.step_s - b.step_s) / max(d["steps"], 1), tok_s=(c.tokens - b.tokens) / secs,
                prefill_tokens=d["prefill_tokens"], prefix_hit_tokens=d["prefix_hit_tokens"],
                resident_hits=d["resident_hits"], resident_hit_tokens=d["resident_hit_tokens"],
                host_hits=d["host_hits"], host_hit_tokens=d["host_hit_tokens"], parks=d["parks"], wakes=d["wakes"],
                evictions=d["evictions"], host_evictions=d["host_evictions"], remaps=c["remaps"],
                slots=gauges["slots"], slots_used=gauges["slots_used"],
                accept_pct=100.0 * d["accepted_rows"] / drafted if drafted else 0.0,
                accepted=(d["accepted_rows"] + rounds) / rounds if rounds else 0.0,
            )
        self.start = now
        self.base = c.copy()


def snapshot_holdings(prefix) -> tuple[set[int], set[int]]:
    """Device pages and slots the index's resident snapshots hold, recounted from their stores, so a
    page the tallies lost track of shows up as a leak."""
    pages: set[int] = set()
    slots: set[int] = set()
    for store in prefix.resident_stores():
        pages.update(store.page_ids())
        if store.seq_slot() is not None:
            slots.add(store.seq_slot())
    return pages, slots


def core_gauges(core) -> dict[str, int]:
    """A `serve.core.core.Core`'s gauges: its queues, and the pool's, the index's and the host tier's holdings."""
    e = core.engine
    pages, slots = snapshot_holdings(e.prefix)
    return {"running": len(core.running), "waiting": len(core.waiting), "leases": e.pool.leases - 1,
            "pages_used": e.pool.used, "snapshot_pages": len(pages), "slots": e.pool.slots,
            "slots_used": e.pool.slots_used, "snapshot_slots": len(slots),
            "resident_entries": e.prefix.count(Tier.DEVICE), "parked_entries": e.prefix.count(Tier.HOST),
            "host_used_bytes": e.host.used() if e.host is not None else 0}


def core_stats(core, shown: int) -> dict:
    """A `Core`'s /stats view: facts, counters, gauges, its queues (`shown` names of each), the step's timing."""
    c = core.counters
    rt = core.device
    timing = rt.timing  # None: a pipeline head's runtime keeps none
    return {
        "facts": core.engine.facts(),
        "counters": dict(c.values),
        "gauges": core.gauges(),
        "parked_lengths": core.engine.prefix.parked_lengths(),
        "queue": {"running": [r.id for r in list(core.running)[:shown]],
                  "waiting": [r.id for r in list(core.waiting)[:shown]],
                  "admission": core.turns.rule.name, "timed_out": core.timed_out},
        "timing": {"steps": c["steps"], "step_s": c.step_s, "loop_s": c.loop_s, "tokens": c.tokens,
                   **(timing.as_dict() if timing is not None else {})},
        **({"pipeline": {"epoch": rt.epoch, "losses": rt.losses, "restarts": core.restarts, "requeued": core.requeued,
                         "resumed": core.resumed, "answered_error": core.lost_answered,
                         # a stage being started again: no step runs, yet the server is at work
                         "restarting": not rt.whole.is_set() and rt.failed is None}}
           if rt.broken is not None else {}),
    }
