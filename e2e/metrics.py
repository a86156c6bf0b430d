"""`/metrics` gated: what a session's scrape must say, predicted from what the gate sent and got.

The client keeps a ledger of every completion of the session (`Sent`): the answered ones with their
usage, cached tokens and finish reason, the streams it hung up on, the ones refused. At the
session's close (the server idle) the gate scrapes `/metrics` and `/stats` at once and holds:

- the request metrics (docs/metrics.md) to the ledger exactly: `prompt_tokens_total` (answered and
  hung-up requests: each got its first token), `request_success_total` by finish reason, the counts
  of the time-to-first-token, end-to-end, prompt-length and answer-length histograms, the sums of the
  last two, `prefix_cache_queries_total` (the prompt tokens of every admitted request), and
  `prefix_cache_hits_total` (a hung-up stream's hit as its first chunk's `kern` told it) and
  `generation_tokens_total` exactly when no stream was hung up (a hung-up stream's last tokens are
  not known to the client: then at least the ledger's);
- `inter_token_latency_seconds_count` to `generation_tokens_total - ttft count` (one per token after
  a request's first);
- every `kern:<counter>_total` to `/stats` `counters.<counter>`, and, while the session's policy
  oracle still predicts, the policy counters to the oracle's;
- `prefix_cache_hits_by_tier_total{tier}` to the cached tokens of the answers whose `kern.cache_tier`
  was that tier (exactly when no stream was hung up, else at least), and to `/stats`
  `resident_hit_tokens` (device) and `host_hit_tokens` (host);
- the tiers the API told (`told`, a server with /stats): every answer's response carries the whole
  `kern` object, streamed, chat or in a burst; `woken` is true exactly for a host-tier hit; and the
  answers told a device hit, a host hit (woken) and their cached tokens are `resident_hits_total`,
  `host_hits_total` and `wakes_total`, and `wake_tokens_total` (a hung-up stream's hit told by its
  first chunk's `kern`; one hung up before its first chunk may add a hit and its prompt's tokens);
- the token-count histograms (`request_prompt_tokens`, `request_generation_tokens`) bucket by bucket
  to the ledger, and every histogram's `+Inf` bucket to its count;
- an idle server's gauges: `num_requests_running` and `num_requests_waiting` 0, every `kern:<gauge>`,
  `kv_pages_used`, `kv_pages_total` and `kv_cache_usage_perc` as `/stats` says them;
- the scrape at the session's start to zero for all of these (a fresh server has counted nothing).
"""

from __future__ import annotations

import threading
from dataclasses import dataclass, field
from typing import Any

from prometheus_client.parser import text_string_to_metric_families

__all__ = ["Ledger", "Sent", "held", "parse", "predict", "told", "verdict", "START_ZERO"]

P = "kern:"
TIERS = ("device", "host")
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
    tier: str | None = None  # kern.cache_tier: where its cached tokens came from (device, host, none)
    woken: bool | None = None  # kern.woken: its hit was a parked snapshot woken from the host tier
    untold: tuple[str, ...] = ()  # the kern fields its response lacked (docs/api.md)
    request: str = ""  # kern.request_id (else the client's name for it)


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
    least = {"generation_tokens_total": sum(s.generated for s in answered) + len(hung)}
    hit = answered + [s for s in hung if s.woken is not None]  # a hung-up stream's hit told in its first chunk
    hits = {"prefix_cache_hits_total": sum(s.cached for s in hit)}
    for tier in TIERS:
        hits[f"prefix_cache_hits_by_tier_total{{tier={tier}}}"] = sum(s.cached for s in hit if s.tier == tier)
    (exact if len(hit) == len(answered) + len(hung) else least).update(hits)
    if not hung:
        exact.update(least)
        least = {}
    return exact, least


def _read(m: dict, key: str) -> float | None:
    if key.endswith("}"):
        name, label = key[:-1].split("{")
        k, _, v = label.rpartition("=")
        return get(m, name, **{k or "finished_reason": v})
    return get(m, key)


def buckets(m: dict, sent: list[Sent]) -> list[str]:
    """The token-count histograms bucket by bucket (each `le` holds the successful requests whose
    prompt or answer has at most `le` tokens: the ledger fixes them), and every histogram's `+Inf`
    bucket equal to its count."""
    problems = []
    ok = [s for s in sent if s.kind == "answered" and s.finish in ("stop", "length")]
    values = {"request_prompt_tokens": [s.prompt for s in ok], "request_generation_tokens": [s.generated for s in ok]}
    for (name, labels), v in sorted(m.items()):
        if not name.startswith(P) or not name.endswith("_bucket"):
            continue
        hist, le = name[len(P):-len("_bucket")], dict(labels).get("le")
        if le in ("+Inf", "inf"):
            count = get(m, hist + "_count")
            if count != v:
                problems.append(f"{hist} +Inf bucket {v:g} != its count {count}")
        elif hist in values:
            want = sum(x <= float(le) for x in values[hist])
            if v != want:
                problems.append(f"{hist} bucket le={le} {v:g} (sent: {want})")
    return problems


def gauges(m: dict, stats: dict[str, Any]) -> list[str]:
    """An idle server's gauges: nothing running or waiting, the rest as /stats says them."""
    problems = []
    g, facts = stats.get("gauges") or {}, stats.get("facts") or {}
    want = {"num_requests_running": 0, "num_requests_waiting": 0}
    want.update({k: v for k, v in g.items() if k not in ("running", "waiting")})
    if "pages_used" in g:
        want["kv_pages_used"] = g["pages_used"]
    if "pages" in facts:
        pages = facts["pages"]
        want["kv_pages_total"] = pages
        if "pages_used" in g:
            want["kv_cache_usage_perc"] = g["pages_used"] / pages if pages else 0.0
    for name, value in want.items():
        v = get(m, name)
        if v is None or abs(v - value) > 1e-9:
            problems.append(f"{name} {'missing' if v is None else f'{v:g}'} (idle, /stats: {value})")
    return problems


START_ZERO = ("prompt_tokens_total", "generation_tokens_total", "request_success_total{stop}",
              "request_success_total{length}", "time_to_first_token_seconds_count", "prefix_cache_queries_total",
              "prefix_cache_hits_total", "e2e_request_latency_seconds_count")


def _against_stats(end: dict, counters: dict[str, Any]) -> list[str]:
    """The end scrape's counters, hits and hits by tier against /stats' counters."""
    problems = []
    for name, value in counters.items():
        v = get(end, f"{name}_total")
        if v is None or v != value:
            problems.append(f"{name}_total {'missing' if v is None else f'{v:g}'} (/stats {value})")
    hits = get(end, "prefix_cache_hits_total")
    if counters and hits is not None and hits != counters.get("prefix_hit_tokens"):
        problems.append(f"prefix_cache_hits_total {hits:g} (/stats prefix_hit_tokens {counters.get('prefix_hit_tokens')})")
    for tier, name in (("device", "resident_hit_tokens"), ("host", "host_hit_tokens")):
        v = get(end, "prefix_cache_hits_by_tier_total", tier=tier)
        if counters and name in counters and v != counters[name]:
            problems.append(f"prefix_cache_hits_by_tier_total{{tier={tier}}} {v} (/stats {name} {counters[name]})")
    return problems


def held(read, start: dict, end: dict, zero, exact: dict[str, int], least: dict[str, int], name: str = "",
         fresh: str = "a fresh server") -> list[str]:
    """What the two scrapes get wrong: each of `zero` at 0 in the start one, each of `exact` equal to the
    ledger's in the end one and each of `least` at least it (`read(scrape, key)`; `name` prefixes keys)."""
    problems = []
    for key in zero:
        v = read(start, key)
        if v is None:
            problems.append(f"{name}{key} missing from the first scrape")
        elif v != 0:
            problems.append(f"{name}{key} {v:g} at the session's start ({fresh}: 0)")
    for key, want in exact.items():
        v = read(end, key)
        if v is None or v != want:
            problems.append(f"{name}{key} {'missing' if v is None else f'{v:g}'} (sent: {want})")
    for key, want in least.items():
        v = read(end, key)
        if v is None or v < want:
            problems.append(f"{name}{key} {'missing' if v is None else f'{v:g}'} (sent: at least {want})")
    return problems


def verdict(start: dict, end: dict, sent: list[Sent], stats: dict[str, Any] | None,
            policy: dict[str, int] | None, idle: bool = True) -> tuple[bool, str]:
    """(ok, note): the end scrape against the ledger, /stats and the policy; the start scrape at zero.
    `idle`: the server ran and queued nothing at the close (its gauges are then held to /stats too).
    A pipeline head that resumed requests after a stage loss (/stats `pipeline.requeued`) looked each
    up again: its prefix-cache queries and hits are held to at least what was sent, and each resumed
    request may add one hit to those its answers told (docs/pipeline.md)."""
    resumed = int(((stats or {}).get("pipeline") or {}).get("requeued") or 0)
    exact, least = predict(sent)
    if resumed:
        least.update({k: exact.pop(k) for k in [k for k in exact if k.startswith("prefix_cache_")]})
    problems = held(_read, start, end, START_ZERO, exact, least)
    itl, gen, ttft = (_read(end, k) for k in ("inter_token_latency_seconds_count", "generation_tokens_total",
                                               "time_to_first_token_seconds_count"))
    if None in (itl, gen, ttft) or itl != gen - ttft:
        problems.append(f"inter_token_latency_seconds_count {itl} != generation_tokens {gen} - first tokens {ttft}")
    counters = (stats or {}).get("counters") or {}
    problems += _against_stats(end, counters)
    for name, value in (policy or {}).items():
        v = get(end, f"{name}_total")
        if v is None or v != value:
            problems.append(f"{name}_total {'missing' if v is None else f'{v:g}'} (policy {value})")
    problems += buckets(end, sent)
    if stats is not None:
        problems += told(end, sent, resumed)
    if stats and idle:
        problems += gauges(end, stats)
    n = {k: sum(s.kind == k for s in sent) for k in ("answered", "hung_up", "refused")}
    what = (f"{n['answered']} answered, {n['hung_up']} hung up, {n['refused']} refused; "
            f"{len(exact)} request metrics exact, {len(least)} at least, {len(counters)} counters = /stats"
            + (f", {len(policy)} = policy" if policy else "") + ", token-count buckets exact"
            + (", every answer's kern tier and wake = the hit counters" if stats is not None else "")
            + (", idle gauges = /stats" if stats and idle else "")
            + (f"; {resumed} request(s) resumed after a stage loss (looked up again)" if resumed else ""))
    if problems:
        return False, f"{len(problems)} difference(s): " + "; ".join(problems[:8]) + f" ({what})"
    return True, what


TOLD = ("resident_hits", "host_hits", "wakes", "wake_tokens")


def told(m: dict, sent: list[Sent], resumed: int = 0) -> list[str]:
    """The tiers the API told, against the hit counters (a server with /stats: ours). Every answer's
    response carries the whole `kern` object (streamed, chat, in a burst: not only the gate's serial
    requests); a hit's `woken` is true exactly when its `cache_tier` is host; and the requests told a
    device hit are `resident_hits`, those told woken `host_hits` and `wakes`, their cached tokens
    `wake_tokens`. A hung-up stream's hit is told by its first chunk's `kern` (docs/api.md) and counts
    as an answer's; one hung up before any chunk came is not told: it may add one hit and at most its
    prompt's tokens. Each of `resumed` requests (a stage loss's) may add one hit, and its tokens, as well."""
    hung = [s for s in sent if s.kind == "hung_up" and s.woken is None]  # hung up before its hit was told
    answered = [s for s in sent if s.kind == "answered" or (s.kind == "hung_up" and s.woken is not None)]
    problems = []
    untold = [s for s in sent if s.kind != "refused" and s.untold]
    if untold:
        problems.append(f"{len(untold)} response(s) without kern fields, e.g. {untold[0].request or '?'} lacks "
                        f"{', '.join(untold[0].untold)}")
    odd = [s for s in answered if not s.untold and bool(s.woken) != (s.tier == "host")]
    if odd:
        problems.append(f"{len(odd)} answer(s) whose woken disagrees with their tier, e.g. {odd[0].request or '?'}: "
                        f"cache_tier {odd[0].tier}, woken {odd[0].woken}")
    want = {"resident_hits": sum(s.tier == "device" for s in answered),
            "host_hits": sum(s.tier == "host" for s in answered),
            "wakes": sum(bool(s.woken) for s in answered),
            "wake_tokens": sum(s.cached for s in answered if s.woken)}
    room = {"resident_hits": len(hung) + resumed, "host_hits": len(hung) + resumed, "wakes": len(hung) + resumed,
            "wake_tokens": sum(s.prompt for s in hung) + (sum(s.prompt + s.generated for s in sent) if resumed else 0)}
    for name in TOLD:
        v, lo, hi = get(m, f"{name}_total"), want[name], want[name] + room[name]
        if v is None or not lo <= v <= hi:
            told_as = f"{lo}" if lo == hi else f"{lo}..{hi}, {len(hung)} stream(s) hung up untold"
            problems.append(f"{name}_total {'missing' if v is None else f'{v:g}'} (answers told: {told_as})")
    return problems
