"""turn2_hit and turn2_warm_equals_run: prompt + answer (+ stop) + suffix, sent as ids.

Ids, not text: re-tokenizing the answer's text may not give its ids back. A hit must reach its
floor (whole pages below the first prompt's last token, or the whole first prompt when stateful),
or be 0 with its own first turns not kept.
"""

from __future__ import annotations

from e2e.prompts import SUFFIX
from e2e.results import Cold, Repeated, Turn, Turn2
from verdicts import Same, turn2_hit

TURNS = 4


def floor(page: int, stateful: bool):
    return (lambda n: n) if stateful else (lambda n: (n - 1) // page * page)


def unkept(r) -> set[str]:
    """The requests whose snapshot was not kept: from each answer's `kern.snapshot`; only a server with
    no /stats (the Rust kern) is read from its `not kept` log lines as well."""
    said = {req for req, snap in r.snapshots.items() if snap == "not kept"}
    live = r.need_any()
    if live.stats.has_endpoint:
        return said
    return said | {str(ln["request"]) for ln in live.session.log.lines("not kept") if "request" in ln}


def run(r) -> Turn2:
    suffix = r.need("default").client.tokenize(SUFFIX)
    turns = []
    for i in range(TURNS):
        cold = r.got(Cold).answers[i]
        ids = cold.prompt_ids + cold.fed + suffix
        a = r.answer(ids)
        turns.append(Turn(tuple(ids), tuple(a.ids), a.cached, len(cold.prompt_ids), a.served))
    lost = unkept(r)
    first_turns = r.got(Repeated).first_turns
    entries = [(t.cached, t.prompt_len, list(first_turns[i])) for i, t in enumerate(turns)]
    f = floor(r.page, r.stateful)
    ok = turn2_hit(entries, f, lost)
    cached = [t.cached for t in turns]
    mine = sorted({q for _, _, reqs in entries for q in reqs} & lost)
    note = f"cached {cached} (floor {[f(t.prompt_len) for t in turns]})"
    if mine:
        note += f"; not kept: {', '.join(mine)}"
    r.checks.add("turn2_hit", ok, note)
    same = Same(r.oracle, r.rows)
    answered = 0
    for i, t in enumerate(turns):
        want = r.oracle.run(list(t.ids), r.m, r.rows)
        if want is None:
            continue
        answered += 1
        same.add(f"turn 2 of prompt {i + 1}", list(t.ids), list(t.warm_ids), want, t.served)
    if answered:
        r.checks.add("turn2_warm_equals_run", same.ok, str(same), same.excused, same.first)
    return Turn2(tuple(suffix), tuple(turns))
