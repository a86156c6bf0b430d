"""concurrent: the 12 prompts at once; all finish, and (exact oracle) each is its conc1 answer.

spec_acceptance: serial acceptance from the rounds before the burst, burst acceptance from the
burst alone (deltas of `/stats` counters, or the log's stats windows without one).
"""

from __future__ import annotations

import time

from e2e.client import Answer
from e2e.prompts import PROMPTS
from e2e.results import Burst, Cold
from e2e.stats import acceptance
from verdicts import Same, acceptance_holds, accept_rate


def run(r) -> Burst:
    live = r.need("default")
    r.serial_ends("the concurrent phase (recency and counters depend on timing)")
    if r.rows > 1:
        live.stats.flush()
    before = live.stats.read()
    windows = len(live.session.log.lines("stats"))
    t0 = time.monotonic()
    answers = live.client.run_all([(p, r.m) for p in PROMPTS])
    dt = time.monotonic() - t0
    for a in answers:
        if isinstance(a, Answer):
            r.snapshots[a.request] = a.snapshot
    errors = [f"prompt {i + 1}: {type(a).__name__}: {a}" for i, a in enumerate(answers) if not isinstance(a, Answer)]
    if any(not isinstance(a, Answer) for a in answers):
        live.session.check()
    finished = sum(isinstance(a, Answer) and a.finish in ("length", "stop") for a in answers)
    same = Same(r.oracle, r.rows)
    for i, a in enumerate(answers):
        if isinstance(a, Answer):
            cold = r.got(Cold).answers[i]
            same.add(f"prompt {i + 1}", cold.prompt_ids, a.ids, cold.ids, a.served)
    live.stats.flush()
    after = live.stats.read()
    r.counters["default"] = _plain(after)
    if live.stats.has_endpoint:
        serial, _ = acceptance({}, before)
        burst, per_round = acceptance(before, after)
    else:
        stats = live.session.log.lines("stats")
        serial = accept_rate(stats[:windows])
        busiest = max(stats[windows:], key=lambda w: w.get("steps", 0), default={})
        burst, per_round = busiest.get("accept_pct"), busiest.get("accepted")
    ok = finished == len(PROMPTS) and (same.ok or not r.oracle.exact)
    note = f"{finished}/{len(PROMPTS)} finished in {dt:.1f}s; {same}"
    if errors:
        note += "; " + "; ".join(errors)
    r.checks.add("concurrent", ok, note, same.excused, same.first)
    return Burst(serial, burst, per_round)


def spec_acceptance(r) -> None:
    b = r.got(Burst)
    bounds = r.oracle.accept_pct
    ok = acceptance_holds(b.serial, b.burst, bounds)
    r.checks.add("spec_acceptance", ok, f"serial {b.serial}%, burst {b.burst}% "
                 f"({b.accepted} tokens/round); bounds {bounds}")


def _plain(stats: dict) -> dict:
    return {k: (sorted(v) if isinstance(v, set) else v) for k, v in stats.items()}
