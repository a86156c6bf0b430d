"""rows1_equals_run (spec targets): ``--rows 1`` runs plain decode and must answer as the oracle does
with one row; rows1_vs_spec reports how many equal the multi-row answers."""

from __future__ import annotations

from e2e.prompts import PROMPTS
from e2e.results import Cold
from verdicts import Same

ASKED = 4


def flags(r) -> list[str]:
    return ["--rows", "1"]


def run(r) -> None:
    same = Same(r.oracle, 1)
    same_spec = 0
    answered = 0
    for i in range(ASKED):
        a = r.answer(PROMPTS[i])
        ids = r.prompt_ids(a, PROMPTS[i])
        same_spec += a.ids == r.got(Cold).answers[i].ids
        want = r.oracle.run(ids, r.m, 1)
        if want is not None:
            answered += 1
            same.add(f"prompt {i + 1}", ids, a.ids, want)
    if answered:
        r.checks.add("rows1_equals_run", same.ok, str(same), same.excused)
    r.checks.add("rows1_vs_spec", None, f"{same_spec}/{ASKED} identical to the {r.rows}-row answers")
