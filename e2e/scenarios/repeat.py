"""repeat_hit: prompts 1-4 again; the hit is the whole pages below the last token (paged) or 0
(stateful: its only snapshot, prompt + answer, is longer than the prompt); same answers."""

from __future__ import annotations

from e2e.prompts import PROMPTS
from e2e.results import Cold, Repeated
from verdicts import Same

REPEATED = 4


def want_cached(n: int, page: int, stateful: bool) -> int:
    return 0 if stateful else (n - 1) // page * page


def run(r) -> Repeated:
    same = Same(r.oracle, r.rows)
    got, want = [], []
    first_turns = [list(reqs) for reqs in r.got(Cold).requests]
    for i in range(REPEATED):
        a = r.answer(PROMPTS[i])
        cold = r.got(Cold).answers[i]
        first_turns[i].append(a.request)
        same.add(f"prompt {i + 1}", cold.prompt_ids, a.ids, cold.ids, a.served)
        got.append(a.cached)
        want.append(want_cached(len(cold.prompt_ids), r.page, r.stateful))
    ok = got == want and same.ok
    r.checks.add("repeat_hit", ok, f"cached {got} (want {want}); {same}", same.excused, same.first)
    return Repeated(tuple(tuple(reqs) for reqs in first_turns))
