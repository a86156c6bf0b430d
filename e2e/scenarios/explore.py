"""explore: a workload generated from `--seed` and the target's limits, where the fixed one never goes.

Session `explore`: a small pool (`--capacity`: a few worst-case requests on a lined target; on a
paged one exactly what the compaction phase holds; on a packing one the context bound), with or
without a small host tier, as the seed says. Its requests, drawn by PRNGs seeded from `--seed` and
the model's name (docs/checks.md has the phases in full):

- fresh prompts of random bytes and lengths, conversations that come back with their answer and a
  new suffix, exact repeats: in a pool this small, inserts, evictions, parks and wakes follow each
  other;
- EOS exactly at the last allowed token (`max_tokens` the reference's EOS position) and one short;
- a request whose room is exactly the server's `max_request_tokens` (served: everything else is
  evicted or parked to seat it; paged targets: a lined pool also carves the request's line slot out
  of its pages, so what it seats depends on the layout, and such a request may be refused with
  `kv_budget_exceeded`) and one token over (400 `context_length_exceeded`);
- paged targets whose prefill declares no context bound: a heap compaction, then evictions (`compaction_plan`: prefill a
  page per call, a churn on a branch point whose removed entries outgrow the recency heap, a long
  prompt that evicts everything older, then fresh prompts that must each evict the coldest of
  conversations whose recency was shuffled);
- a burst of prompts sent at once (packed prefill with the pool this full);
- on a target that packs prefill and declares a context bound (`/stats` facts `pack`, `context`):
  two prompts at once whose packed call reaches the bound exactly and leaves one row of the second
  to the next call (`pack_plan`; the session's `--chunk` is drawn so that the call's rows do not bind
  first, and its pool holds the bound).

Every request sent is recorded as a plain dict (`prompt` ids, `max_tokens`, `concurrent`: sent at
once with the next, `expect`, `label`) and written with the session's seed and flags to
`OUT/TARGET/explore-requests.json`: the workload as a shrinker replays it.

Every answer is gated identical to the reference (`explore_equals_run`), every serial request's hit,
tier, snapshot and the counters by the policy oracle (`policy_explore`), the metrics by
`metrics_explore`. `e2e --seed S` replays a workload exactly; `e2e --explore N` gates N fresh seeds.
"""

from __future__ import annotations

import json
import random
import threading
import time
from typing import Any

from e2e.client import Answer, Rejected
from e2e.oracle_seam import Oracle
from e2e.prompts import PROMPTS, SUFFIX
from verdicts import Same

TOKENS = 48  # answer tokens of most requests
REQUESTS = 10  # serial requests before the edges and the burst
BURST = 4


def rng_of(r) -> random.Random:
    return random.Random(f"{getattr(r.opts, 'seed', 0)}:{r.target.model}:explore")


def pool_pages(r, rng: random.Random) -> int:
    """The pool: room for two to four of the largest requests drawn, and the pad."""
    largest = 200 + 2 * (TOKENS + len(SUFFIX)) + r.rows
    return rng.randint(2, 4) * -(-largest // r.page) + 1


def flags(r) -> list[str]:
    return draw_flags(r, rng_of(r))


def draw_flags(r, rng: random.Random) -> list[str]:
    """The session's flags, the seed's first draws (a packing target's chunk and pool from its own)."""
    pages = pool_pages(r, rng)
    packed, compact = pack_plan(r), compaction_plan(r)
    if packed is not None:  # the pool holds a call at the bound: the two prompts, their answers, the pad
        pages = max(pages, -(-(packed["bound"] + packed["chunk"] + 4 * PACK_TOKENS) // r.page) + 4)
    if compact is not None:  # the pool holds the long prompt and the conversations, nothing more
        pages = compact["pages"]
    out = ["--capacity", str(pages * r.page), "--max-seqs", str(rng.choice([2, 4, 8]))]
    if packed is not None:
        out += ["--chunk", str(packed["chunk"])]
    elif compact is not None:
        out += ["--chunk", str(compact["chunk"])]
    if rng.random() < 0.5:
        host_pages = rng.randint(pages // 2, 2 * pages)
        out += ["--host-gib", f"{host_pages * r.host_page_bytes() / (1 << 30):.9f}"]
    return out


PACK_TOKENS = 2  # answer tokens of the packed-bound prompts (their prefill is the point)


def packing(r) -> tuple[int, int] | None:
    """(context bound, the manifest's chunk) of a target that packs prefill and declares a bound."""
    f = (getattr(r, "server_facts", None) or {}).get("default") or {}
    bound, chunk = f.get("context"), f.get("chunk") or (r.facts.get("default") or {}).get("chunk")
    if not f.get("pack") or not bound or not chunk:
        return None
    return int(bound), int(chunk)


def pack_plan(r) -> dict[str, Any] | None:
    """The packed-prefill edges, from their own PRNG (the other draws stay as they were)."""
    got = packing(r)
    if got is None:
        return None
    f = (getattr(r, "server_facts", None) or {}).get("default") or {}
    rng = random.Random(f"{getattr(r.opts, 'seed', 0)}:{r.target.model}:explore:pack")
    return draw_pack(got[0], got[1], rng, emits=bool(f.get("prefill_emits", True)))


def draw_pack(bound: int, chunk_max: int, rng: random.Random, emits: bool = True) -> dict[str, Any]:
    """A chunk `c` and a burst of a long prompt A (`bound - d` rows to prefill) then a short B of
    `d + 1` rows, B sent once A is running (so A is the older: `pack` takes the oldest first).

    `pack` feeds A chunk by chunk; its last chunk (`A % c` rows) shares a call with B, which gets
    `min(B, c - A % c, bound - A)` rows: `c - A % c >= d + 2` is drawn, so the context bound, not the
    rows, is what stops B. That call's context is the bound exactly (the runtime must accept it) and
    it leaves B's last row to the next call (a bound off by one packs it: a call one over what the
    runtime accepts). `fed` are the rows prefill feeds; a prompt is one token longer where prefill
    emits nothing (its last token goes with the first step: `prefill_emits` false), `lengths` the
    prompts'. One burst covers both edges; the one whose total is the bound exactly (B = d) only
    repeats the first.
    """
    lo = max(2, chunk_max // 2)
    while True:
        c = rng.randint(lo, chunk_max)
        d = rng.randint(1, max(1, c // 4))
        a = bound - d
        if a > 0 and a % c and c - a % c >= d + 2:
            break
    extra = 0 if emits else 1
    return {"bound": bound, "chunk": c, "bursts": [
        {"label": "packed call at the context bound, one row left over", "fed": [a, d + 1],
         "lengths": [a + extra, d + 1 + extra]}]}


CONVERSATIONS = 6  # the compaction phase's conversations (two pages and a bit each)
CHURN_PAGES = 4  # what the churn leaves resident: `a`'s and `b`'s entries, `x`'s two pages shared


def compaction_plan(r) -> dict[str, Any] | None:
    """A heap compaction, then evictions (paged targets without a packed context bound: a checkpoint every page).

    The index keeps each tier's recency in a lazy heap and rebuilds it (`Prefix._compact`) once it
    holds more than twice the tier's entries and 64: the items left behind by entries removed while
    not the coldest. A sequence checkpointed every page grows one entry in place (no item left), so
    the stale items come from a churn on a branch point (`churn`): a prompt `x` of two whole pages
    whose own checkpoint lands on the node where two longer prompts `a` and `b` (`x` and a page more)
    part, then `a` again (its hit is `x`'s entry: a prompt's last token always runs), whose
    checkpoint a page further removes that entry by the growth rule, one stale item each round; `cycles` rounds outnumber the entries any earlier request can
    have left resident and 64. So: CONVERSATIONS prompts of two whole pages and a bit, asked again in
    a shuffled order (their recency is not their insertion order); the churn, whose compaction finds
    them resident; a long prompt `g` of `64 + 2 * (CONVERSATIONS + 3) + 6` pages (the pool's size kept
    from when its own checkpoints compacted the heap) in a pool of exactly the pad, its lease, the
    conversations' and the churn's pages (so its admission evicts everything older than the
    conversations first); three fresh prompts `f` of three pages' lease, each of which must then
    evict the coldest conversation (one page is left free); the conversations again, whose hits and
    tiers tell which went. A compaction that lost the recency evicts in some other order. From its
    own PRNGs (the other draws stay)."""
    if getattr(r, "stateful", False) or packing(r) is not None:
        return None
    page = r.page
    rng = random.Random(f"{getattr(r.opts, 'seed', 0)}:{r.target.model}:explore:compact")
    k = 64 + 2 * (CONVERSATIONS + 3) + 6
    cycles = 64 + 2 * (REQUESTS + 3) + CONVERSATIONS + 3 + 8  # entries resident at most, 64, a margin
    return {"chunk": page, "pages": 1 + (k + 1) + 2 * CONVERSATIONS + CHURN_PAGES,
            "conversations": [rng.randint(2 * page + 1, 2 * page + page // 2) for _ in range(CONVERSATIONS)],
            "touch": rng.sample(range(CONVERSATIONS), CONVERSATIONS), "g": k * page,
            "f": [rng.randint(2 * page + 1, 3 * page - 2) for _ in range(3)], "cycles": cycles}


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
        self.record: list[dict[str, Any]] = []  # every request sent, in order (`explore-requests.json`)

    def note(self, label: str, ids: list[int], m: int, expect: str = "answer", concurrent: bool = False) -> None:
        self.sent += 1
        self.record.append({"label": label, "prompt": list(ids), "max_tokens": m, "concurrent": concurrent,
                            "expect": expect})

    def ask(self, label: str, ids: list[int], m: int) -> Answer | None:
        self.note(label, ids, m)
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
    bursts = pack_calls(r)
    for _, calls in bursts:  # long prompts: the reference starts on them now, while the rest is served
        for ids, m in calls:
            r.oracle.prefetch(ids, m, r.rows)
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
    compaction(r, e)
    burst(r, e, rng)
    packed(r, e, bursts)
    write(r, e)
    ok = e.same.ok and not e.problems
    c = (e.live.client.stats() or {}).get("counters") or {}
    went = ", ".join(f"{k} {c[k]}" for k in ("evictions", "parks", "wakes", "host_evictions", "remaps") if c.get(k))
    note = (f"seed {getattr(r.opts, 'seed', 0)}: {e.sent} requests ({went or 'nothing evicted'}), {e.same}"
            + "".join(f"; {p}" for p in e.problems[:6]))
    r.checks.add("explore_equals_run", ok, note, e.same.excused)


def eos_edge(oracle: Oracle, rows: int, rng: random.Random) -> tuple[list[int], int] | None:
    """A random prompt whose reference answer meets EOS within TOKENS, and EOS's position k (1-based):
    `max_tokens` k makes EOS the last allowed token, k - 1 ends one short (length). None: 8 tries missed."""
    for _ in range(8):
        ids = [rng.randrange(256) for _ in range(rng.randint(1, 120))]
        want = oracle.run(ids, TOKENS, rows)
        if len(want) < TOKENS:
            return ids, len(want) + 1
    return None


def room_edge(room: int, rows: int, rng: random.Random) -> tuple[list[int], int]:
    """A random prompt and the `max_tokens` that make its room (prompt + max_tokens + rows - 1) `room`."""
    n = rng.randint(1, min(200, room // 2))
    return [rng.randrange(256) for _ in range(n)], room - n - rows + 1


def edges(r, e: Explore, rng: random.Random) -> None:
    """EOS at the last allowed token and one short; a room of exactly max_request_tokens, one over."""
    got = eos_edge(r.oracle, r.rows, rng)
    if got is not None:
        ids, k = got
        e.ask(f"EOS at the last allowed token ({k})", ids, k)
        if k > 1:
            e.ask(f"one short of EOS ({k - 1})", ids, k - 1)
    facts = (e.live.client.stats() or {}).get("facts") or r.facts.get("explore") or {}
    room = int(facts.get("max_request_tokens") or 0)
    if room <= 0:
        return
    ids, m = room_edge(room, r.rows, rng)
    if not r.stateful:  # a lined pool must also carve the request's line slot out of its pages: how much
        e.ask(f"room exactly max_request_tokens {room}", ids, m)  # room that leaves depends on the layout
    e.note(f"room {room + 1}, one over max_request_tokens", ids, m + 1, "context_length_exceeded")
    try:
        r.answer(ids, m + 1)
        e.problems.append(f"room {room + 1} (one over max_request_tokens) was served")
    except Rejected as exc:
        if exc.status != 400 or exc.code != "context_length_exceeded":
            e.problems.append(f"room {room + 1}: {exc}, not 400 context_length_exceeded")


def compaction(r, e: Explore) -> None:
    """`compaction_plan`'s requests, serial (the policy oracle predicts each hit and eviction)."""
    p = compaction_plan(r)
    if p is None:
        return
    rng = random.Random(f"{getattr(r.opts, 'seed', 0)}:{r.target.model}:explore:compact:ids")
    xs = [[rng.randrange(256) for _ in range(n)] for n in p["conversations"]]
    for i, ids in enumerate(xs):
        e.ask(f"compaction: conversation {i + 1}", ids, 2)
    for i in p["touch"]:
        e.ask(f"compaction: conversation {i + 1} again", xs[i], 1)
    churn(r, e, p["cycles"])
    e.ask(f"compaction: a long prompt ({p['g']} tokens, a checkpoint per page)",
          [rng.randrange(256) for _ in range(p["g"])], 1)
    for j, n in enumerate(p["f"]):
        e.ask(f"compaction: a fresh prompt that evicts {j + 1}", [rng.randrange(256) for _ in range(n)], 1)
    for i, ids in enumerate(xs):
        e.ask(f"compaction: conversation {i + 1} after the evictions", ids, 1)


def churn(r, e: Explore, cycles: int) -> None:
    """`compaction_plan`'s stale heap items: `x` (two whole pages) checkpointed on the node where `a`
    and `b` part, then `a` again, whose checkpoint a page on removes `x`'s entry (the growth rule),
    `cycles` times. Two answer tokens each: the checkpoint at a prompt's last whole page is made once
    its last token has run."""
    page = r.page
    rng = random.Random(f"{getattr(r.opts, 'seed', 0)}:{r.target.model}:explore:compact:churn")
    x = [rng.randrange(256) for _ in range(2 * page)]
    a, b = (x + [rng.randrange(256) for _ in range(page)] for _ in range(2))
    e.ask("compaction: churn, a", a, 2)
    e.ask("compaction: churn, b", b, 2)
    for c in range(cycles):
        e.ask(f"compaction: churn {c + 1}, x", x, 2)
        e.ask(f"compaction: churn {c + 1}, a", a, 2)


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
    at_once(r, e, "burst", calls)


def at_once(r, e: Explore, label: str, calls: list[tuple[list[int], int]], ordered: bool = False) -> None:
    """Send `calls` at once; each answer gated against the reference. `ordered`: each call is sent
    once the server runs the one before (so it is the older in the packed prefill's order)."""
    for k, (ids, m) in enumerate(calls):
        e.note(f"{label} {k + 1}", ids, m, concurrent=k + 1 < len(calls))
        r.oracle.prefetch(ids, m, r.rows)
    if ordered:
        answers = in_order(e.live.client, calls)
    else:
        answers = e.live.client.run_all(calls)
    for k, ((ids, m), a) in enumerate(zip(calls, answers)):
        if isinstance(a, Answer):
            e.same.add(f"{label} {k + 1}", ids, a.ids, r.oracle.run(ids, m, r.rows))
        else:
            e.problems.append(f"{label} {k + 1}: {type(a).__name__}: {str(a)[:200]}")


def in_order(client, calls: list[tuple[list[int], int]]) -> list[Any]:
    """`run_all`, but each call sent once `/stats` shows one more request running (at most 5 s)."""
    out: list[Any] = [None] * len(calls)
    with client._lock:
        client.script.append({"kind": "burst", "calls": [[p, n] for p, n in calls]})

    def one(i: int) -> None:
        client._in_burst.on = True
        try:
            out[i] = client.complete(*calls[i])
        except BaseException as exc:  # reported per request by the caller
            out[i] = exc

    threads = []
    for i in range(len(calls)):
        if threads:
            deadline = time.monotonic() + 5.0
            while time.monotonic() < deadline and threads[-1].is_alive():
                g = (client.stats() or {}).get("gauges") or {}
                if int(g.get("running", 0)) >= i:
                    break
                time.sleep(0.002)
        t = threading.Thread(target=one, args=(i,), daemon=True)
        t.start()
        threads.append(t)
    for t in threads:
        t.join()
    return out


def pack_calls(r) -> list[tuple[str, list[tuple[list[int], int]]]]:
    """`pack_plan`'s bursts as calls: [(label, [(prompt ids, max_tokens), ...])]; none on other targets."""
    p = pack_plan(r)
    if p is None:
        return []
    rng = random.Random(f"{getattr(r.opts, 'seed', 0)}:{r.target.model}:explore:pack:ids")
    return [(f"{b['label']} ({'+'.join(map(str, b['fed']))} rows of {p['bound']}, chunk {p['chunk']})",
             [([rng.randrange(256) for _ in range(n)], PACK_TOKENS) for n in b["lengths"]]) for b in p["bursts"]]


def packed(r, e: Explore, bursts: list[tuple[str, list[tuple[list[int], int]]]]) -> None:
    """A packing target: the burst whose packed call meets its context bound exactly, one row left over."""
    for label, calls in bursts:
        at_once(r, e, label, calls, ordered=True)


def write(r, e: Explore) -> None:
    """The requests as sent, with the seed and the session's flags: a replayable workload."""
    try:
        r.dir.mkdir(parents=True, exist_ok=True)
        (r.dir / "explore-requests.json").write_text(json.dumps(
            {"target": r.target.name, "session": "explore", "seed": getattr(r.opts, "seed", 0),
             "flags": flags(r), "requests": e.record}, indent=1))
    except OSError as exc:
        e.problems.append(f"could not write explore-requests.json: {exc}")
