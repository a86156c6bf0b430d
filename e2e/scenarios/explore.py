"""explore: a workload generated from `--seed` and the target's limits, where the fixed one never goes.

Session `explore`: a pool of a few worst-case requests (`--capacity`), with or without a small host
tier, as the seed says. Its requests, drawn by a PRNG seeded from `--seed` and the model's name:

- fresh prompts of random bytes and lengths, conversations that come back with their answer and a
  new suffix, exact repeats: in a pool this small, inserts, evictions, parks and wakes follow each
  other, and the index's heaps are compacted between evictions;
- EOS exactly at the last allowed token (`max_tokens` the reference's EOS position) and one short;
- a request whose room is exactly the server's `max_request_tokens` (served: everything else is
  evicted or parked to seat it; paged targets: a lined pool also carves the request's line slot out
  of its pages, so what it seats depends on the layout, and such a request may be refused with
  `kv_budget_exceeded`) and one token over (400 `context_length_exceeded`);
- last, a burst of prompts sent at once (packed prefill with the pool this full).

Every answer is gated identical to the reference (`explore_equals_run`), every serial request's hit,
tier, snapshot and the counters by the policy oracle (`policy_explore`), the metrics by
`metrics_explore`. `e2e --seed S` replays a workload exactly; `e2e --explore N` gates N fresh seeds.
"""

from __future__ import annotations

import random
from typing import Any

from e2e.client import Answer, Rejected
from e2e.prompts import PROMPTS, SUFFIX
from verdicts import Same

TOKENS = 48  # answer tokens of most requests
REQUESTS = 14  # serial requests before the edges and the burst
BURST = 6


def rng_of(r) -> random.Random:
    return random.Random(f"{getattr(r.opts, 'seed', 0)}:{r.target.model}:explore")


def pool_pages(r, rng: random.Random) -> int:
    """The pool: room for two to four of the largest requests drawn, and the pad."""
    largest = 200 + 2 * (TOKENS + len(SUFFIX)) + r.rows
    return rng.randint(2, 4) * -(-largest // r.page) + 1


def flags(r) -> list[str]:
    return draw_flags(r, rng_of(r))


def draw_flags(r, rng: random.Random) -> list[str]:
    """The session's flags, the seed's first draws."""
    pages = pool_pages(r, rng)
    out = ["--capacity", str(pages * r.page), "--max-seqs", str(rng.choice([2, 4, 8]))]
    if rng.random() < 0.5:
        host_pages = rng.randint(pages // 2, 2 * pages)
        out += ["--host-gib", f"{host_pages * r.host_page_bytes() / (1 << 30):.9f}"]
    return out


def workload(r, rng: random.Random) -> list[dict[str, Any]]:
    """The serial requests, drawn up front: each `{"kind", "prompt" (ids or a conversation's index),
    "max_tokens"}`; a turn's ids are known only once its conversation's last answer is."""
    out: list[dict[str, Any]] = []
    conversations = 0
    for _ in range(REQUESTS):
        pick = rng.random()
        if pick < 0.45 or conversations == 0:
            n = rng.randint(1, 200)
            base = list(PROMPTS[rng.randrange(len(PROMPTS))].encode())
            ids = [rng.randrange(256) for _ in range(n)] if rng.random() < 0.5 else (base * 3)[:n]
            out.append({"kind": "new", "prompt": ids, "max_tokens": rng.randint(1, TOKENS)})
            conversations += 1
        elif pick < 0.85:
            out.append({"kind": "turn", "of": rng.randrange(conversations), "max_tokens": rng.randint(1, TOKENS)})
        else:
            out.append({"kind": "repeat", "of": rng.randrange(conversations), "max_tokens": TOKENS})
    return out


class Explore:
    def __init__(self, r) -> None:
        self.r = r
        self.live = r.need("explore")
        self.same = Same(r.oracle, r.rows)
        self.sent = 0
        self.problems: list[str] = []

    def ask(self, label: str, ids: list[int], m: int) -> Answer | None:
        self.sent += 1
        try:
            a = self.r.answer(ids, m)
        except Rejected as exc:
            self.problems.append(f"{label}: refused: {exc}")
            return None
        self.same.add(label, ids, a.ids, self.r.oracle.run(ids, m, self.r.rows))
        return a


def run(r) -> None:
    rng = rng_of(r)
    draw_flags(r, rng)  # the draws `flags` made, so the workload follows them as it did
    e = Explore(r)
    convos: list[list[int]] = []
    suffix = list(SUFFIX.encode())
    for i, q in enumerate(workload(r, rng)):
        if q["kind"] == "new":
            ids = q["prompt"]
        elif q["kind"] == "turn":
            ids = convos[q["of"]] + suffix[:rng.randint(1, len(suffix))]
        else:
            ids = convos[q["of"]]
        a = e.ask(f"request {i + 1} ({q['kind']}, {len(ids)} tokens)", ids, q["max_tokens"])
        if a is None:
            continue
        if q["kind"] == "new":
            convos.append(ids + a.fed)
        elif q["kind"] == "turn":
            convos[q["of"]] = ids + a.fed
    edges(r, e, rng)
    burst(r, e, rng)
    ok = e.same.ok and not e.problems
    c = (e.live.client.stats() or {}).get("counters") or {}
    went = ", ".join(f"{k} {c[k]}" for k in ("evictions", "parks", "wakes", "host_evictions", "remaps") if c.get(k))
    note = (f"seed {getattr(r.opts, 'seed', 0)}: {e.sent} requests ({went or 'nothing evicted'}), {e.same}"
            + "".join(f"; {p}" for p in e.problems[:6]))
    r.checks.add("explore_equals_run", ok, note, e.same.excused)


def edges(r, e: Explore, rng: random.Random) -> None:
    """EOS at the last allowed token and one short; a room of exactly max_request_tokens, one over."""
    for _ in range(8):  # a prompt whose answer meets EOS within TOKENS
        ids = [rng.randrange(256) for _ in range(rng.randint(1, 120))]
        want = r.oracle.run(ids, TOKENS, r.rows)
        if len(want) < TOKENS:
            e.ask(f"EOS at the last allowed token ({len(want) + 1})", ids, len(want) + 1)
            if want:
                e.ask(f"one short of EOS ({len(want)})", ids, len(want))
            break
    facts = (e.live.client.stats() or {}).get("facts") or r.facts.get("explore") or {}
    room = int(facts.get("max_request_tokens") or 0)
    if room <= 0:
        return
    n = rng.randint(1, min(200, room // 2))
    ids = [rng.randrange(256) for _ in range(n)]
    m = room - n - r.rows + 1
    if not r.stateful:  # a lined pool must also carve the request's line slot out of its pages: how much
        e.ask(f"room exactly max_request_tokens {room}", ids, m)  # room that leaves depends on the layout
    e.sent += 1
    try:
        r.answer(ids, m + 1)
        e.problems.append(f"room {room + 1} (one over max_request_tokens) was served")
    except Rejected as exc:
        if exc.status != 400 or exc.code != "context_length_exceeded":
            e.problems.append(f"room {room + 1}: {exc}, not 400 context_length_exceeded")


def burst(r, e: Explore, rng: random.Random) -> None:
    """Prompts at once, packed into prefill calls with the pool this full (the policy stops here)."""
    live = e.live
    if live.policy is not None and live.policy.active:
        live.policy.compare("the serial requests", live.client.stats())
    r.serial_ends("the burst (recency and counters depend on timing)")
    calls = []
    for _ in range(BURST):
        ids = [rng.randrange(256) for _ in range(rng.randint(1, 160))]
        calls.append((ids, rng.randint(1, TOKENS)))
    answers = e.live.client.run_all(calls)
    for k, ((ids, m), a) in enumerate(zip(calls, answers)):
        e.sent += 1
        if isinstance(a, Answer):
            e.same.add(f"burst {k + 1}", ids, a.ids, r.oracle.run(ids, m, r.rows))
        else:
            e.problems.append(f"burst {k + 1}: {type(a).__name__}: {a}")
