"""Counters (cumulative), the 5 s window behind the `stats` line, and the /stats and /metrics views.

Gauges are read from the pool and the index when asked, on the scheduler thread; the snapshot pages
and slots are recounted from the index's stores, not from the pool's tallies, so a leak shows.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field

from serve import logs

__all__ = ["COUNTERS", "GAUGES", "Counters", "Window", "prometheus"]

COUNTERS = (
    "requests", "steps", "rounds", "drafted_rows", "accepted_rows", "prefill_tokens", "prefix_hit_tokens",
    "resident_hits", "resident_hit_tokens", "host_hits", "host_hit_tokens", "parks", "wakes", "wake_tokens",
    "evictions", "host_evictions", "remaps", "not_kept", "prefill_calls",
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

    def add(self, name: str, n: int = 1) -> None:
        self.values[name] += n

    def __getitem__(self, name: str) -> int:
        return self.values[name]

    def copy(self) -> Counters:
        return Counters(dict(self.values), self.tokens, self.step_s, self.loop_s, self.copy_s)


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


def prometheus(stats: dict) -> str:
    """/metrics: every counter as `kern_<name>_total`, every gauge as `kern_<name>`, hits by tier."""
    c, g = stats["counters"], stats["gauges"]
    lines = []

    def metric(name: str, kind: str, help: str, samples: list[tuple[str, int | float]]) -> None:
        lines.append(f"# HELP {name} {help}")
        lines.append(f"# TYPE {name} {kind}")
        lines.extend(f"{name}{labels} {value}" for labels, value in samples)

    metric("kern_prefix_cache_hits_total", "counter", "Prefix-cache hits by tier.",
           [('{tier="device"}', c["resident_hits"]), ('{tier="host"}', c["host_hits"])])
    metric("kern_prefix_cache_hit_tokens_total", "counter", "Prefix-cache hit tokens by tier.",
           [('{tier="device"}', c["resident_hit_tokens"]), ('{tier="host"}', c["host_hit_tokens"])])
    for name in COUNTERS:
        metric(f"kern_{name}_total", "counter", f"Cumulative {name.replace('_', ' ')}.", [("", c[name])])
    for name in GAUGES:
        metric(f"kern_{name}", "gauge", f"Current {name.replace('_', ' ')}.", [("", g[name])])
    metric("kern_requests_running", "gauge", "Requests holding a lease.", [("", g["running"])])
    metric("kern_requests_waiting", "gauge", "Requests waiting for room.", [("", g["waiting"])])
    return "\n".join(lines) + "\n"
