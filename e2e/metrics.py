"""`/metrics` gated: what a session's scrape must say, predicted from what the gate sent and got.

The client keeps a ledger of every completion of the session (`Sent`): the answered ones with their
usage, cached tokens and finish reason, the streams it hung up on, the ones refused. At the
session's close (the server idle) the gate scrapes `/metrics` and `/stats` at once and holds:

- the request metrics (docs/metrics.md) to the ledger exactly: `prompt_tokens_total` (answered and
  hung-up requests: each got its first token), `request_success_total` by finish reason, the counts
  of the time-to-first-token, end-to-end, prompt-length and answer-length histograms, the sums of the
  last two, `prefix_cache_queries_total` (the prompt tokens of every admitted request), and
  `generation_tokens_total` and `prefix_cache_hits_total` exactly when no stream was hung up (a
  hung-up stream's tokens and hit are not known to the client: then at least the ledger's);
- `inter_token_latency_seconds_count` to `generation_tokens_total - ttft count` (one per token after
  a request's first);
- every `kern:<counter>_total` to `/stats` `counters.<counter>`, and, while the session's policy
  oracle still predicts, the policy counters to the oracle's;
- the scrape at the session's start to zero for all of these (a fresh server has counted nothing).
"""

from __future__ import annotations

import threading
from dataclasses import dataclass, field
from typing import Any

from prometheus_client.parser import text_string_to_metric_families

__all__ = ["Ledger", "Sent", "parse", "predict", "verdict", "START_ZERO"]

P = "kern:"
HISTOGRAMS = ("time_to_first_token_seconds", "e2e_request_latency_seconds", "request_prompt_tokens",
              "request_generation_tokens", "inter_token_latency_seconds")


@dataclass(frozen=True)
class Sent:
    """One completion of the session as the client saw it."""

    kind: str  # "answered" | "hung_up" | "refused"
    prompt: int  # prompt tokens (usage.prompt_tokens when answered)
    generated: int = 0  # usage.completion_tokens (the stop token included)
    cached: int = 0
    finish: str | None = None


@dataclass
class Ledger:
    sent: list[Sent] = field(default_factory=list)
    lock: threading.Lock = field(default_factory=threading.Lock, repr=False)

    def add(self, s: Sent) -> None:
        with self.lock:
            self.sent.append(s)


def parse(text: str) -> dict[tuple[str, tuple[tuple[str, str], ...]], float]:
    """Prometheus text → {(sample name, labels but model_name): value}."""
    out = {}
    for fam in text_string_to_metric_families(text):
        for s in fam.samples:
            labels = tuple(sorted((k, v) for k, v in s.labels.items() if k != "model_name"))
            out[(s.name, labels)] = s.value
    return out


def get(m: dict, name: str, **labels: str) -> float | None:
    return m.get((P + name, tuple(sorted(labels.items()))))


def predict(sent: list[Sent]) -> tuple[dict[str, int], dict[str, int]]:
    """(exact, at least): the request metrics the ledger fixes, by the names `verdict` reads."""
    answered = [s for s in sent if s.kind == "answered"]
    hung = [s for s in sent if s.kind == "hung_up"]
    ok = [s for s in answered if s.finish in ("stop", "length")]
    first = [s for s in answered if s.generated > 0] + hung
    exact = {
        "prompt_tokens_total": sum(s.prompt for s in first),
        "request_success_total{stop}": sum(s.finish == "stop" for s in ok),
        "request_success_total{length}": sum(s.finish == "length" for s in ok),
        "time_to_first_token_seconds_count": len(first),
        "e2e_request_latency_seconds_count": len(ok),
        "request_prompt_tokens_count": len(ok),
        "request_generation_tokens_count": len(ok),
        "request_prompt_tokens_sum": sum(s.prompt for s in ok),
        "request_generation_tokens_sum": sum(s.generated for s in ok),
        "prefix_cache_queries_total": sum(s.prompt for s in answered + hung),
    }
    least = {"generation_tokens_total": sum(s.generated for s in answered) + len(hung),
             "prefix_cache_hits_total": sum(s.cached for s in answered)}
    if not hung:
        exact.update(least)
        least = {}
    return exact, least


def _read(m: dict, key: str) -> float | None:
    if key.endswith("}"):
        name, reason = key[:-1].split("{")
        return get(m, name, finished_reason=reason)
    return get(m, key)


START_ZERO = ("prompt_tokens_total", "generation_tokens_total", "request_success_total{stop}",
              "request_success_total{length}", "time_to_first_token_seconds_count", "prefix_cache_queries_total",
              "prefix_cache_hits_total", "e2e_request_latency_seconds_count")


def verdict(start: dict, end: dict, sent: list[Sent], stats: dict[str, Any] | None,
            policy: dict[str, int] | None) -> tuple[bool, str]:
    """(ok, note): the end scrape against the ledger, /stats and the policy; the start scrape at zero."""
    problems = []
    for key in START_ZERO:
        v = _read(start, key)
        if v is None:
            problems.append(f"{key} missing from the first scrape")
        elif v != 0:
            problems.append(f"{key} {v:g} at the session's start (a fresh server: 0)")
    exact, least = predict(sent)
    for key, want in exact.items():
        v = _read(end, key)
        if v is None or v != want:
            problems.append(f"{key} {'missing' if v is None else f'{v:g}'} (sent: {want})")
    for key, want in least.items():
        v = _read(end, key)
        if v is None or v < want:
            problems.append(f"{key} {'missing' if v is None else f'{v:g}'} (sent: at least {want})")
    itl, gen, ttft = (_read(end, k) for k in ("inter_token_latency_seconds_count", "generation_tokens_total",
                                               "time_to_first_token_seconds_count"))
    if None in (itl, gen, ttft) or itl != gen - ttft:
        problems.append(f"inter_token_latency_seconds_count {itl} != generation_tokens {gen} - first tokens {ttft}")
    counters = (stats or {}).get("counters") or {}
    for name, value in counters.items():
        v = get(end, f"{name}_total")
        if v is None or v != value:
            problems.append(f"{name}_total {'missing' if v is None else f'{v:g}'} (/stats {value})")
    hits = get(end, "prefix_cache_hits_total")
    if counters and hits is not None and hits != counters.get("prefix_hit_tokens"):
        problems.append(f"prefix_cache_hits_total {hits:g} (/stats prefix_hit_tokens {counters.get('prefix_hit_tokens')})")
    for name, value in (policy or {}).items():
        v = get(end, f"{name}_total")
        if v is None or v != value:
            problems.append(f"{name}_total {'missing' if v is None else f'{v:g}'} (policy {value})")
    n = {k: sum(s.kind == k for s in sent) for k in ("answered", "hung_up", "refused")}
    what = (f"{n['answered']} answered, {n['hung_up']} hung up, {n['refused']} refused; "
            f"{len(exact)} request metrics exact, {len(least)} at least, {len(counters)} counters = /stats"
            + (f", {len(policy)} = policy" if policy else ""))
    if problems:
        return False, f"{len(problems)} difference(s): " + "; ".join(problems[:8]) + f" ({what})"
    return True, what
