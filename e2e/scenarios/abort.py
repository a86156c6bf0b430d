"""abort: read 3 stream chunks and hang up; the request is aborted, the next answer is unchanged and
nothing leaked.

The hung-up prompt is the fill variant with the longest answer (the oracle's, up to 4096 tokens),
so the request is still running when the client hangs up: a toy answer that stops after a few
dozen tokens can finish before the server sees the socket close, and then no abort is exercised.
A server with /stats (this project's) is also asked `ignore_eos`, so the answer runs to the bound
(the room its default session allows): on a loaded machine even the longest toy answer finished
before the hang-up was seen, and the check failed a good commit (one run in 26 of two gates at once).
Nothing leaked, when idle (SPEC §7): no lease, every used page the pad's or a snapshot's, and on
lined targets every used slot a snapshot's or the pad's.
"""

from __future__ import annotations

import time

from e2e.prompts import PROMPTS, variant
from e2e.results import Cold
from verdicts import Same

CHUNKS = 3
HANG_UP_TOKENS = 4096
CANDIDATES = 24


def longest(r) -> str:
    lengths = {n: len(r.oracle.run(list(variant(n).encode()), HANG_UP_TOKENS, r.rows) or []) for n in range(CANDIDATES)}
    return variant(max(lengths, key=lambda n: (lengths[n], -n)))


def leaks(s: dict) -> list[str]:
    if "leases" not in s:
        return []
    out = []
    facts = s.get("facts", {})
    if s["leases"] != 0:
        out.append(f"leases={s['leases']}")
    pad = facts.get("pad_pages")
    if pad is not None and s.get("pages_used") != pad + s.get("snapshot_pages", 0):
        out.append(f"pages_used={s.get('pages_used')} != pad {pad} + snapshot {s.get('snapshot_pages')}")
    if s.get("slots") and "snapshot_slots" in s and s.get("slots_used") != s["snapshot_slots"] + 1:
        out.append(f"slots_used={s.get('slots_used')} != snapshot {s['snapshot_slots']} + pad 1")
    return out


def ended(log, rid: str, timeout: float = 10.0) -> str | None:
    """The ``reason`` of the request's ``finished`` line, waiting a little for it; None if never logged."""
    t0 = time.monotonic()
    while True:
        reasons = [ln.get("reason") for ln in log.lines("finished") if ln.get("request") == rid]
        if reasons or time.monotonic() - t0 > timeout:
            return reasons[-1] if reasons else None
        time.sleep(0.02)


def run(r) -> None:
    live = r.need("default")
    prompt = longest(r)
    if live.stats.has_endpoint is None:
        live.stats.read()
    ours = bool(live.stats.has_endpoint)
    bound = HANG_UP_TOKENS
    room = r.facts["default"].get("max_request_tokens")
    if ours and room:
        bound = max(1, min(bound, int(room) - len(prompt.encode()) - r.rows + 1))
    aborted = live.stats.read().get("aborted", 0) if ours else 0
    rid, got = live.client.hang_up(prompt, CHUNKS, bound, ignore_eos=ours)
    if not ours:  # the Rust kern tells how a request ended only in its `finished` lines
        reason = ended(live.session.log, rid)
    a = r.answer(PROMPTS[0])
    same = Same(r.oracle, r.rows)
    cold = r.got(Cold).answers[0]
    same.add("prompt 1", cold.prompt_ids, a.ids, cold.ids)
    idle = live.stats.idle()
    if ours:  # /stats counts the requests that ended by abort: the hung-up one, and only it
        n = idle.get("aborted", 0) - aborted
        reason = "abort" if n == 1 else f"{n} aborted (counters.aborted)"
    leaked = leaks(idle) if live.stats.has_endpoint else []
    problems = []
    if got != CHUNKS:
        problems.append(f"read only {got} chunks")
    if reason is not None and reason != "abort":
        problems.append(f"{rid} finished by {reason}, not abort")
    if leaked:
        problems.append("leaked: " + ", ".join(leaked))
    note = f"read {got}/{CHUNKS} chunks of {rid} then hung up ({reason or 'no finished line'}); next answer {same}"
    note += "".join(f"; {p}" for p in problems) if problems else (
        "; nothing leaked" if live.stats.has_endpoint else "; no /stats to check leaks")
    r.checks.add("abort", not problems and same.ok, note, same.excused)
