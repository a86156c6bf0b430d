"""Sessions ties and frag: the index's tie and tier rules and the host allocator's coalescing, each in
a situation the other sessions never make. Both take churn's flags (a pool of one largest request, a
host tier of one and a half) and its answer length. Every answer is gated against the reference
(checks ``index_ties``, ``host_frag``) and every hit, tier, snapshot and counter against the policy
oracle (``policy_ties``, ``policy_frag``).

ties, paged targets (a sequence checkpointed every page keeps one growing entry):
1. S + a, S + b (a shared head S of two pages and a bit), then a squeeze (a fresh prompt whose room
   is one page more than is free: exactly one eviction) parks S + a; S + c must hit S + b, the
   resident one, though S + a is first in token order;
2. prompt 1 (its entry K tokens), fills until K is parked; ``fed[:K]`` exactly (2 tokens) wakes the
   pages below K and re-inserts K, resident with its host copy; ``fed[:K]`` + a short tail then
   checkpoints K + page alone, and the growth rule must keep K (it has a host copy);
3. fills until K and that chain are parked, ``fed[:K]`` again (K alone resident again), then a prompt
   through K parting from the chain inside the next page: the resident entry on the path and the
   parked chain off it offer the same length, and resident wins (no wake).

ties, lined targets (snapshots at request end): three turns of one conversation nest three snapshots
on one path; the third turn's lookup leaves the one nearer the root warmer, so a squeeze parks the
second; the second turn's ids with another suffix then find it parked (a host hit).

frag, lined targets: conversations in an order (found against the oracle) whose parks and drops free
adjacent host runs one after the other, so a later park's slot fits only where they coalesced.
"""

from __future__ import annotations

from e2e.prompts import PROMPTS, variant
from e2e.results import Turn2
from e2e.scenarios import churn
from verdicts import Same

FILLS = 16
FIRST_FILL = 100  # fill prompts variant(100 + n): no prefix shared with prompt 1 or each other's pages


def flags(r) -> list[str]:
    return churn.flags(r)


class _Run:
    def __init__(self, r, session: str = "ties") -> None:
        self.r = r
        self.live = r.need(session)
        self.same = Same(r.oracle, r.rows)
        self.n = 0
        self.problems: list[str] = []
        self.tiers: list[str] = []

    def ask(self, label: str, ids, max_tokens: int | None = None):
        r = self.r
        m = max_tokens or churn.TOKENS
        a = r.answer(ids, m)
        ids = r.prompt_ids(a, ids)
        self.same.add(label, ids, a.ids, r.oracle.run(ids, m, r.rows))
        self.tiers.append(f"{a.tier or '-'}:{a.cached}")
        return ids, a

    def parked(self) -> set[int]:
        return set((self.live.client.stats() or {}).get("parked_lengths") or [])

    def squeeze(self, label: str) -> None:
        """A fresh prompt whose room is one page more than the pool has free: one eviction (the
        coldest resident entry) makes room."""
        r = self.r
        raw = self.live.client.stats() or {}
        facts, gauges = raw.get("facts") or {}, raw.get("gauges") or {}
        free = int(facts["pages"]) - int(gauges["pages_used"])
        prompt = variant(FIRST_FILL + self.n)
        self.n += 1
        n = len(self.live.client.tokenize(prompt))
        m = (free + 1) * r.page - n - r.rows + 1
        if m < 1:
            self.problems.append(f"{label}: {free} pages free, no room to squeeze")
            return
        self.ask(f"squeeze ({free} pages free)", prompt, m)

    def fill_until(self, label: str, done) -> None:
        """Fill requests until `done(parked lengths)`, at most FILLS."""
        for _ in range(FILLS):
            if done(self.parked()):
                return
            self.ask(f"fill {self.n}", variant(FIRST_FILL + self.n))
            self.n += 1
        if not done(self.parked()):
            self.problems.append(f"{label}: not parked after {FILLS} fills")


def _suffix(r) -> list[int]:
    """The suffix's ids, as turn2 found the server tokenizes it."""
    return list(r.got(Turn2).suffix)


def _parting(tail: list[int], token: int) -> list[int]:
    """`tail`, led by another token than `token` (so a prompt parts there)."""
    return tail if tail[0] != token else [token ^ 1] + tail


def _long(r, head: list[int], token: int) -> list[int]:
    """`head` and a tail of less than a page parting from `token`, the first whose reference answer
    runs at least two pages (so decode steps checkpoint the pages after `head` one by one)."""
    tail = _parting(_suffix(r), token)
    options = [head + tail[:n] for n in range(1, min(len(tail), r.page))]
    for ids in options:
        want = r.oracle.run(ids, churn.TOKENS, r.rows)
        if want is not None and len(want) >= 2 * r.page:
            return ids
    return options[0]


def _entry_len(r, fed: list[int]) -> int:
    """The length of the one entry a paged sequence `fed` left: the policy oracle's, else the whole
    pages below its last step that did not end it."""
    pol = r.need("ties").policy.policy
    if pol is not None:
        keys = [len(k) for k in pol.entries if list(k) == fed[:len(k)]]
        if keys:
            return max(keys)
    return (len(fed) - 2) // r.page * r.page


def run(r) -> None:
    t = _Run(r)
    page = r.page
    if not r.stateful:
        # two sequences parting after a shared head S of two pages and a bit, the first in token
        # order parked by one eviction, then a third parting there too: the resident one is the hit
        head = t.live.client.tokenize(PROMPTS[5])[:2 * page + page // 3]
        t.ask("S + a", head + list(b"a quiet harbour at dawn"))
        t.ask("S + b", head + list(b"b quiet harbour at dusk"))
        t.squeeze("S + a")
        t.ask("S + c", head + list(b"c quiet harbour at noon"))
        ids, a = t.ask("prompt 1", PROMPTS[0])
        fed = ids + a.fed
        k = _entry_len(r, fed)
        t.fill_until(f"prompt 1's entry ({k})", lambda p: k in p)
        t.ask(f"fed[:{k}]", fed[:k], 2)
        # a prefill that ends inside the page after K, so a decode step checkpoints K + page alone
        ids, y = t.ask(f"fed[:{k}] + a short tail", _long(r, fed[:k], fed[k]))
        yfed = ids + y.fed
        ky = _entry_len(r, yfed)
        t.fill_until(f"entries {k} and {ky}", lambda p: k in p and ky in p)
        t.ask(f"fed[:{k}] again", fed[:k], 2)
        at = k + page // 2
        tail = _parting(_suffix(r)[::-1], yfed[at])
        t.ask("the tie", yfed[:at] + tail)
    else:
        ids, a = t.ask("turn 1", PROMPTS[0])
        ids, b = t.ask("turn 2", ids + a.fed + _suffix(r))
        second = ids + b.fed
        ids, c = t.ask("turn 3", second + _suffix(r))
        l1, l2 = b.cached, c.cached
        t.squeeze("one page short")
        if not t.parked() & {l1, l2}:
            t.problems.append(f"neither snapshot {l1} nor {l2} parked")
        t.ask("turn 2, another suffix", second + _parting(_suffix(r)[::-1], _suffix(r)[0]))
    ok = t.same.ok and not t.problems
    note = f"tier:cached {t.tiers}; answers {t.same}" + "".join(f"; {p}" for p in t.problems)
    r.checks.add("index_ties", ok, note, t.same.excused)


# session frag (lined targets; the same flags): conversations whose parks and drops leave the host
# tier's free space in adjacent pieces, so a later park's slot fits only where they coalesced

FRAG = (2, 0, 0, None, 2, 2, 2, 1, 1)  # which conversation takes each turn; None: a fill


def frag(r) -> None:
    """host_frag: every answer equals the reference; (policy_frag) every hit, tier and counter is the
    policy oracle's, whose host tier is one byte a grain (free runs always coalesce)."""
    t = _Run(r, "frag")
    convo: dict[int, list[int]] = {}
    for i in FRAG:
        if i is None:
            t.ask(f"fill {t.n}", variant(FIRST_FILL + t.n))
            t.n += 1
            continue
        ids = convo[i] + _suffix(r) if i in convo else PROMPTS[i]
        ids, a = t.ask(f"conversation {i + 1}", ids)
        convo[i] = ids + a.fed
    c = t.live.stats.read()
    note = (f"tier:cached {t.tiers}; parks {c.get('parks', 0)}, host_evictions {c.get('host_evictions', 0)}; "
            f"answers {t.same}")
    r.checks.add("host_frag", t.same.ok, note, t.same.excused)
