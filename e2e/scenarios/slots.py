"""slot_growth (lined targets): from ``--max-seqs 2``'s few slots, enough requests to grow them by
remaps; answers identical, and turn 2 hits exactly as in the default session."""

from __future__ import annotations

from e2e.prompts import PROMPTS, variant
from e2e.results import Cold, Turn2
from e2e.scenarios.concurrent import _plain
from verdicts import Same


def flags(r) -> list[str]:
    return ["--max-seqs", "2"]


def run(r) -> None:
    live = r.need("slots")
    first = int(r.facts["slots"].get("seq_slots", 0))
    total = max(2 * first + 4, len(PROMPTS))
    fill = Same(r.oracle, r.rows)
    for n in range(total):
        a = r.answer(variant(n))
        if n < len(PROMPTS):
            cold = r.got(Cold).answers[n]
            fill.add(f"prompt {n + 1}", cold.prompt_ids, a.ids, cold.ids)
    same = Same(r.oracle, r.rows)
    hits = []
    for i, t in enumerate(r.got(Turn2).turns):
        a = r.answer(list(t.ids))
        same.add(f"turn 2 of prompt {i + 1}", list(t.ids), a.ids, list(t.warm_ids))
        hits.append((a.cached, t.cached))
    live.stats.flush()
    c = live.stats.read()
    r.counters["slots"] = _plain(c)
    remaps, slots = c.get("remaps", 0), c.get("slots", 0)
    ok = remaps >= 1 and slots > first and fill.ok and same.ok and all(x == y for x, y in hits)
    note = (f"slots {first}→{slots}, {remaps} remaps, {total} requests ({fill}); turn 2 cached "
            f"{[x for x, _ in hits]} (default session {[y for _, y in hits]}); {same}")
    r.checks.add("slot_growth", ok, note, fill.excused + same.excused)
