"""host_churn: a host tier small enough to fill and drop, and sessions that go round it.

Session churn: ``--capacity C --host-gib H --max-seqs 8`` where, in pages of the target, C holds the
scenario's largest request and the pad, and H holds one and a half of it (lined: and two line
slots; a pipeline: on the stage whose host pages are largest, as `--host-gib` is per stage). Four conversations (prompts 1-4) take turns: each turn sends the conversation so far
(its last turn's ids, the answer fed back, the suffix). The turns are ordered so that sessions are
parked, woken, extended, parked again (their host copy still live, so only new pages are copied)
and woken again, and the host runs out so a parked conversation is dropped and its next turn
misses. Every answer is gated against the reference, every hit, tier and snapshot against the policy
oracle (check ``policy_churn``), and the check asserts the run did go round: host evictions, a
conversation woken twice, and a turn whose earlier snapshot had been dropped.
"""

from __future__ import annotations

from e2e.prompts import PROMPTS
from e2e.results import Cold, Turn2
from verdicts import Same

CONVERSATIONS = 4
# which conversation takes each turn after the four first turns
ORDER = (0, 1, 0, 2, 3, 0, 1, 2, 0, 3)
MAX_SEQS = 8
# Answer tokens per request in these sessions, whatever --max-tokens: their pool and host sizes are
# fitted to answers of this length (at 256 most answers meet EOS far short of the bound, the tiers
# sized for the bound never fill, and nothing is evicted or dropped).
TOKENS = 64


def _room_pages(r, order=ORDER) -> int:
    """Pages of the largest request the scenario sends (a conversation's last turn, bounded)."""
    turns = max(order.count(i) for i in range(CONVERSATIONS)) + (order is ORDER)
    longest = max(len(a.prompt_ids) for a in r.got(Cold).answers[:CONVERSATIONS])
    tokens = longest + turns * (TOKENS + 1 + len(r.got(Turn2).suffix)) + r.rows - 1
    return -(-tokens // r.page)


def flags(r) -> list[str]:
    f = r.facts["default"]
    pages = _room_pages(r)
    page_bytes = r.host_page_bytes()  # a pipeline: the largest stage's, so every stage holds H
    slot_bytes = int(r.live_facts("slot_bytes"))
    host = (pages * 3 // 2) * page_bytes + (2 * slot_bytes if r.stateful else 0)
    capacity = (pages + 1) * int(f["page"])
    return ["--capacity", str(capacity), "--host-gib", f"{host / (1 << 30):.9f}", "--max-seqs", str(MAX_SEQS)]


def run(r) -> None:
    live = r.need("churn")
    same = Same(r.oracle, r.rows)
    convo: list[list[int]] = []
    tiers: list[list[tuple[str | None, int]]] = [[] for _ in range(CONVERSATIONS)]
    for i in range(CONVERSATIONS):
        a = r.answer(PROMPTS[i], TOKENS)
        ids = r.prompt_ids(a, PROMPTS[i])
        same.add(f"conversation {i + 1} turn 1", ids, a.ids, r.oracle.run(ids, TOKENS, r.rows))
        convo.append(ids + a.fed)
        tiers[i].append((a.tier, a.cached))
    suffix = list(r.got(Turn2).suffix)
    for n, i in enumerate(ORDER):
        ids = convo[i] + suffix
        a = r.answer(ids, TOKENS)
        same.add(f"conversation {i + 1} turn {len(tiers[i]) + 1}", ids, a.ids, r.oracle.run(ids, TOKENS, r.rows))
        convo[i] = ids + a.fed
        tiers[i].append((a.tier, a.cached))
    c = live.stats.read()
    r.counters["churn"] = {k: c.get(k, 0) for k in ("parks", "wakes", "host_hits", "host_evictions", "evictions")}
    woken_twice = [i + 1 for i in range(CONVERSATIONS) if sum(t == "host" for t, _ in tiers[i]) >= 2]
    missed = [i + 1 for i in range(CONVERSATIONS) if any(t is None for t, _ in tiers[i][1:])]
    problems = []
    if not c.get("host_evictions", 0):
        problems.append("the host tier never dropped a parked snapshot")
    if not woken_twice:
        problems.append("no conversation was woken twice")
    if not missed:
        problems.append("no later turn missed after its snapshot was dropped")
    note = (f"tiers {[[t or '-' for t, _ in ts] for ts in tiers]}, cached {[[n for _, n in ts] for ts in tiers]}; "
            f"parks {c.get('parks', 0)}, wakes {c.get('wakes', 0)}, host_evictions {c.get('host_evictions', 0)}, "
            f"evictions {c.get('evictions', 0)}; answers {same}" + "".join(f"; {p}" for p in problems))
    r.checks.add("host_churn", same.ok and not problems, note)


# session drop: the same conversations with no host tier, so evicting a snapshot drops it

DROP_TURNS = (0, 1, 0, 1)


def drop_flags(r) -> list[str]:
    pages = _room_pages(r, DROP_TURNS)
    return ["--capacity", str((pages + 1) * int(r.facts["default"]["page"])), "--max-seqs", str(MAX_SEQS)]


def drop(r) -> None:
    """evict_drops: with no host tier, room for a turn evicts (drops) older snapshots; every answer
    equals the reference, the drops are counted, and (policy_drop) every hit, tier and counter is
    the policy oracle's."""
    live = r.need("drop")
    same = Same(r.oracle, r.rows)
    convo: dict[int, list[int]] = {}
    suffix = list(r.got(Turn2).suffix)
    for i in DROP_TURNS:
        ids = convo[i] + suffix if i in convo else PROMPTS[i]
        a = r.answer(ids, TOKENS)
        ids = r.prompt_ids(a, ids)
        same.add(f"conversation {i + 1}", ids, a.ids, r.oracle.run(ids, TOKENS, r.rows))
        convo[i] = ids + a.fed
    c = live.stats.read()
    ev = c.get("evictions", 0)
    ok = same.ok and ev >= 1 and not c.get("parks", 0)
    r.checks.add("evict_drops", ok, f"evictions {ev}, parks {c.get('parks', 0)}; answers {same}"
                 + ("" if ev else "; nothing was evicted"))
