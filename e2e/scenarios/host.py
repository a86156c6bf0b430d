"""Session host: a small pool and a host tier (``--capacity C --host-gib 2 --max-seqs 4``).

turn2_warm_equals_cold: the turn-2 ids on a fresh server answer as they did warm.
park_wake: fill until turn 2's first-turn snapshots park, then turn 2 again wakes them.
C = (4·⌈(P + 16)/page⌉ + 1)·page, P = the longest conc1 prompt + M + len(suffix) + 1.
"""

from __future__ import annotations

from e2e.prompts import PROMPTS, variant
from e2e.results import Cold, HostCold, Turn2
from e2e.scenarios.concurrent import _plain
from verdicts import Same

PER = 4
FILL_MIN = len(PROMPTS)
FILL_MAX = 48


def capacity(r) -> int:
    p = max(len(a.prompt_ids) for a in r.got(Cold).answers) + r.m + len(r.got(Turn2).suffix) + 1
    page = r.page
    return (PER * -(-(p + 16) // page) + 1) * page


def flags(r) -> list[str]:
    return ["--capacity", str(capacity(r)), "--host-gib", "2", "--max-seqs", str(PER)]


def cold(r) -> HostCold:
    same = Same(r.oracle, r.rows)
    got = []
    for i, t in enumerate(r.got(Turn2).turns):
        a = r.answer(list(t.ids))
        got.append(tuple(a.ids))
        same.add(f"turn 2 of prompt {i + 1}", list(t.ids), list(t.warm_ids), a.ids)
    r.checks.add("turn2_warm_equals_cold", same.ok if r.oracle.available else None,
                 f"warm (default session) vs cold (fresh server): {same}", same.excused)
    return HostCold(tuple(got))


def park_wake(r) -> None:
    live = r.need("host")
    turns, cold_ids, first = r.got(Turn2).turns, r.got(HostCold).ids, r.got(Cold).answers
    want = {t.cached for t in turns if t.cached}
    fill = Same(r.oracle, r.rows)
    n = 0
    parked: set[int] = set()
    hits_before = live.stats.read().get("host_hits", 0)
    woken = []  # the requests whose answers say they woke a parked snapshot (kern.woken)
    while n < FILL_MIN or (n < FILL_MAX * r.target.ranks and not want <= parked):
        a = r.answer(variant(n))
        if a.woken:
            woken.append(a.request)
        if n < FILL_MIN:
            fill.add(f"fill {n}", first[n].prompt_ids, a.ids, first[n].ids)
        n += 1
        if n >= FILL_MIN:
            parked = live.stats.read()["parked_lengths"]
    same = Same(r.oracle, r.rows)
    for i, t in enumerate(turns):
        a = r.answer(list(t.ids))
        same.add(f"turn 2 of prompt {i + 1}", list(t.ids), a.ids, list(cold_ids[i]))
        if a.woken:
            woken.append(a.request)
    live.stats.flush()
    c = live.stats.read()
    r.counters["host"] = _plain(c)
    if not live.stats.has_endpoint:  # the Rust kern tells a wake only in its `admitted` lines
        woken = [ln.get("request") for ln in live.session.log.lines("admitted") if ln.get("woken") == "true"]
    parks, wakes, hits = c.get("parks", 0), c.get("wakes", 0), c.get("host_hits", 0)
    # every host hit of this step's requests says it woke (a fill may hit a parked fill)
    told = len(woken) == hits - hits_before or not live.stats.has_endpoint
    ok = parks >= 1 and wakes >= 1 and hits >= 1 and told and fill.ok and same.ok
    note = (f"capacity {capacity(r)}, {n} fills ({fill}); parks {parks} (turn-2 lengths parked: "
            f"{sorted(want & c['parked_lengths'])} of {sorted(want)}), host_evictions {c.get('host_evictions', 0)}, "
            f"evictions {c.get('evictions', 0)}, wakes {wakes}, host_hits {hits}, woken {len(woken)}"
            + ("" if told else f" (answers saying kern.woken {len(woken)} != this step's host hits "
                                f"{hits - hits_before})")
            + f"; turn 2 again: {same}")
    r.checks.add("park_wake", ok, note, fill.excused + same.excused)
