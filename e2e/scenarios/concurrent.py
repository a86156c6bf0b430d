"""concurrent: the 12 prompts at once; all finish, and (exact oracle) each is its conc1 answer; a burst
shares a step (`/stats` batched_steps), sent up to three times, unless the server's log shows no two of a
burst were ever in it at once (a loaded gate's client can send them further apart than a fast engine
answers: nothing could be batched; a server that queued one while another ran and never batched fails).

spec_acceptance: serial acceptance from the rounds before the burst, burst acceptance from the
burst alone (deltas of `/stats` counters, or the log's stats windows without one).
"""

from __future__ import annotations

import datetime
import time

from e2e.client import Answer
from e2e.log import kv
from e2e.prompts import PROMPTS
from e2e.results import Burst, Cold
from e2e.stats import acceptance
from verdicts import Same, acceptance_holds, accept_rate

BURSTS = 3


def run(r) -> Burst:
    live = r.need("default")
    r.serial_ends("the concurrent phase (recency and counters depend on timing)")
    if r.rows > 1:
        live.stats.flush()
    before = live.stats.read()
    windows = len(live.session.log.lines("stats"))
    t0 = time.monotonic()
    bursts, shared = _burst(r, live, before)
    apart = not shared and all(_together(live, b) is False for b in bursts)
    answers = bursts[-1]
    dt = time.monotonic() - t0
    for a in answers:
        if isinstance(a, Answer):
            r.snapshots[a.request] = a.snapshot
    errors = [f"prompt {i + 1}: {type(a).__name__}: {a}" for i, a in enumerate(answers) if not isinstance(a, Answer)]
    if any(not isinstance(a, Answer) for a in answers):
        live.session.check()
    finished = sum(isinstance(a, Answer) and a.finish in ("length", "stop") for a in answers)
    same = Same(r.oracle, r.rows)
    for k, burst in enumerate(bursts):
        for i, a in enumerate(burst):
            if isinstance(a, Answer):
                cold = r.got(Cold).answers[i]
                where = f"prompt {i + 1}" if len(bursts) == 1 else f"burst {k + 1} prompt {i + 1}"
                same.add(where, cold.prompt_ids, a.ids, cold.ids, a.served)
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
    ok = finished == len(PROMPTS) and (same.ok or not r.oracle.exact) and (shared or apart)
    note = f"{finished}/{len(PROMPTS)} finished in {dt:.1f}s; {same}"
    if apart:
        note += (f"; none of {BURSTS} bursts shared a step, and no two of a burst were in the server at once (its "
                 "log's queued and finished lines: each answered before the next arrived): batching not exercisable")
    elif not shared:
        note += f"; none of {BURSTS} bursts shared a step (/stats batched_steps +0): batching not exercised"
    elif len(bursts) > 1:
        note += f"; burst {len(bursts)} of {BURSTS} (the ones before never shared a step)"
    if errors:
        note += "; " + "; ".join(errors)
    r.checks.add("concurrent", ok, note, same.excused, same.first)
    return Burst(serial, burst, per_round)


def _burst(r, live, before: dict) -> tuple[list[list], bool]:
    """The burst, sent again (up to BURSTS times in all) while a server that counts `batched_steps`
    shows none: on a loaded machine the 12 short answers can each end before the next arrives, and a
    burst that never shared a step tests nothing a serial run did not. (every burst's answers, whether
    one of them shared a step: True where the server does not say)."""
    bursts = []
    for _ in range(BURSTS):
        bursts.append(live.client.run_all([(p, r.m) for p in PROMPTS]))
        if not live.stats.has_endpoint or any(not isinstance(a, Answer) for a in bursts[-1]):
            return bursts, True
        batched = live.stats.read().get("batched_steps")
        if batched is None or batched > before.get("batched_steps", 0):
            return bursts, True
    return bursts, False


def _together(live, answers: list) -> bool | None:
    """Whether two of a burst's requests were in the server at once (one queued or running before another
    finished), by the server log's `queued` and `finished` lines (ms stamps; a tie is not "at once");
    None where the log does not tell (no log, no such lines, a request missing from them)."""
    log = getattr(live.session, "log", None)
    ids = {a.request for a in answers if isinstance(a, Answer)}
    if log is None or len(ids) < 2:
        return None
    spans: dict[str, list] = {i: [None, None] for i in ids}
    for at, tag in enumerate(("queued", "finished")):
        for line in log.raw(tag):
            rid = kv(line).get("request")
            if rid in spans:
                spans[rid][at] = _stamp(line.split(" ", 1)[0])
    got = list(spans.values())
    if any(a is None or b is None for a, b in got):
        return None
    return any(a1 < b2 and a2 < b1 for k, (a1, b1) in enumerate(got) for a2, b2 in got[k + 1 :])


def _stamp(text: str) -> float | None:
    """Seconds of a log line's UTC stamp (``2026-12-07T09:57:17.464Z``), or None."""
    try:
        return datetime.datetime.fromisoformat(text.replace("Z", "+00:00")).timestamp()
    except ValueError:
        return None


def spec_acceptance(r) -> None:
    b = r.got(Burst)
    bounds = r.oracle.accept_pct
    ok = acceptance_holds(b.serial, b.burst, bounds)
    r.checks.add("spec_acceptance", ok, f"serial {b.serial}%, burst {b.burst}% "
                 f"({b.accepted} tokens/round); bounds {bounds}")


def _plain(stats: dict) -> dict:
    return {k: (sorted(v) if isinstance(v, set) else v) for k, v in stats.items()}
