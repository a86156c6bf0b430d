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

The abort must be a real one (`verdict`): the server ended the request by abort (this project's
`/stats` `counters.aborted` went up by exactly one; a server without /stats says so in its `finished`
line) having generated fewer tokens than the whole answer would have (`/stats` `timing.tokens` less
the next answer's, or the `finished` line's `generated`). Reading 3 chunks proves nothing: an answer
that finished before the hang-up was seen also gives them, and a server that never aborts passes a
check that asks no more (`kern serve --fault ignore-hang-up` shows this one failing).
"""

from __future__ import annotations

import time

from e2e import metrics_vllm
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


def ended(log, rid: str, timeout: float = 10.0) -> dict | None:
    """The request's ``finished`` line (its ``reason`` and ``generated``), waiting a little for it; None
    if never logged."""
    t0 = time.monotonic()
    while True:
        lines = [ln for ln in log.lines("finished") if ln.get("request") == rid]
        if lines or time.monotonic() - t0 > timeout:
            return lines[-1] if lines else None
        time.sleep(0.02)


def verdict(got: int, reason: str | None, generated: int | None, full: int) -> list[str]:
    """What keeps the hang-up from being a real abort (none: it was one). `reason`: how the server
    says the request ended (None: it does not say); `generated`: the tokens it made before that (None:
    not told); `full`: the tokens its whole answer has."""
    problems = []
    if got != CHUNKS:
        problems.append(f"read only {got} chunks")
    if reason is None:
        problems.append("nothing shows a server-side abort (no finished line names the request)")
    elif reason != "abort" and not reason.startswith("abort ("):
        problems.append(f"ended by {reason}, not by abort")
    elif generated is not None and generated >= full:
        problems.append(f"generated {generated} of its {full} tokens before the abort: nothing was cut short")
    return problems


def run(r) -> None:
    live = r.need("default")
    prompt = longest(r)
    if live.stats.has_endpoint is None:
        live.stats.read()
    ours = bool(live.stats.has_endpoint)
    vllm = not ours and r.opts.engine.has("metrics-vllm")  # vLLM's own counters tell the abort (metrics_vllm)
    bound = HANG_UP_TOKENS
    room = r.facts["default"].get("max_request_tokens")
    if (ours or vllm) and room:
        bound = max(1, min(bound, int(room) - len(prompt.encode()) - r.rows + 1))
    # its whole answer: all of `bound` under ignore_eos, else the oracle's (and its stop token, if it stops)
    n = bound if ours or vllm else len(r.oracle.run(list(prompt.encode()), bound, r.rows) or [])
    full = n + (n < bound)
    before = live.stats.read() if ours else metrics_vllm.idle(live.client.metrics) if vllm else {}
    rid, got = live.client.hang_up(prompt, CHUNKS, bound, ignore_eos=ours or vllm)
    line = None if ours or vllm else ended(live.session.log, rid)  # the Rust kern tells it only in its log
    a = r.answer(PROMPTS[0])
    same = Same(r.oracle, r.rows)
    cold = r.got(Cold).answers[0]
    same.add("prompt 1", cold.prompt_ids, a.ids, cold.ids)
    idle = live.stats.idle()
    if vllm:  # vLLM counts requests by how they finished, and every token it generated, the cut one's too
        after = metrics_vllm.idle(live.client.metrics)
        n = metrics_vllm.delta(before, after, "request_success_total", reason="abort")
        normal = sum(metrics_vllm.delta(before, after, "request_success_total", reason=f) for f in ("stop", "length"))
        # vLLM up to 0.32 counts no client abort as finished (vllm#31503): then only the next answer ended
        reason = "abort" if n == 1 and normal == 1 else "abort (uncounted: vllm#31503)" if n == 0 and normal == 1 else \
            f"vllm:request_success_total abort +{n:g}, stop or length +{normal:g} (the next answer: 1)"
        generated = int(metrics_vllm.delta(before, after, "generation_tokens_total")) - len(a.fed)
    elif ours:  # /stats counts the requests that ended by abort: the hung-up one, and only it
        n = idle.get("aborted", 0) - before.get("aborted", 0)
        reason = "abort" if n == 1 else f"counters.aborted +{n}"
        made = [s.get("answer_tokens") for s in (before, idle)]
        generated = made[1] - made[0] - len(a.fed) if None not in made else None
    else:
        reason = line.get("reason") if line else None
        generated = line.get("generated") if line and isinstance(line.get("generated"), int) else None
    leaked = leaks(idle) if live.stats.has_endpoint else []
    problems = verdict(got, reason, generated, full) + (["leaked: " + ", ".join(leaked)] if leaked else [])
    told = f", {generated} of {full} tokens made" if generated is not None else ""
    note = f"read {got}/{CHUNKS} chunks of {rid} then hung up ({reason or 'no finished line'}{told}); next answer {same}"
    note += "".join(f"; {p}" for p in problems) if problems else (
        "; nothing leaked" if live.stats.has_endpoint else "; no /stats to check leaks")
    r.checks.add("abort", not problems and same.ok, note, same.excused)
