"""conc1_equals_run: the 12 prompts one at a time, each identical to the oracle's answer.

run_equals_reference: with `--reference`, `kern run` on the same ids must equal the reference.
"""

from __future__ import annotations

from e2e.prompts import PROMPTS
from verdicts import Same, oracle_gate


def run(r) -> None:
    same = Same(r.oracle, r.rows)
    for i, p in enumerate(PROMPTS):
        a = r.answer(p)
        a.prompt_ids = r.prompt_ids(a, p)
        r.cold.append(a)
        r.first_turns[i] = [a.request]
        want = r.oracle.run(a.prompt_ids, r.m, r.rows)
        same.add(f"prompt {i + 1}", a.prompt_ids, a.ids, want)
    gate = oracle_gate(r.target.ranks, r.oracle.available)
    ok = same.ok if gate else gate
    r.checks.add("conc1_equals_run", ok, f"{same} (oracle: {r.oracle.kind})", same.excused)


def run_equals_reference(r) -> None:
    """kern run against the reference with `Same`: identical, or (a float target) divergent only at
    near-ties the probe shows, as the server's answers are judged."""
    if r.runner is None:
        r.checks.add("run_equals_reference", None, "no kern run oracle")
        return
    rows = r.rows
    same = Same(r.oracle, rows)
    for i, p in enumerate(PROMPTS):
        ids = list(p.encode())
        same.add(f"prompt {i + 1}", ids, r.runner.run(ids, r.m, rows), r.oracle.run(ids, r.m, rows))
    r.checks.add("run_equals_reference", same.ok, f"{same} (kern run vs reference, rows {rows})", same.excused)
