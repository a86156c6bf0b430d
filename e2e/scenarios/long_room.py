"""long_room: long requests that hold most of a small pool beside short ones (issue 41, fair admission).

The session's server holds ``--capacity CAPACITY`` tokens. Three streamed requests with ``ignore_eos``
each reserve just under half its pages past the pad (`long_pages`, read off the session's own facts):
two run and the third waits, not fitting. Once the
gate sees it wait (`/stats/live`), it sends `SHORTS` short requests at once, each needing one page of
the few left. Under kern serve's default policy (fair, docs/pool-at-scale.md) a request that fits
starts ahead of a head of the queue that does not, so short requests start while the third long
one waits; under first-come order (``--admission fifo``) none does.

`long_beside_short` holds: every answer exact (the long ones run past EOS to their max_tokens, the
reference's continuation as `ignore_eos` serves it), every long one finished by length, and at least
one of the short requests that reached the core (its server `queued` line) before any long one ended
started (its `admitted` line) before the waiting long one did: under fifo none can. Short requests
that reached the core only after a long one ended (a machine so loaded that the long ones, about a
second each, ran out first) say nothing of the policy: if every one did, the order is reported, not
judged. A server with no `admitted` lines at all fails (its debug lines were asked for). On a float target the long
answers are held to their length alone (near-ties past EOS are not judged, as in `params_ids`). The note counts how many
started ahead of it and how many finished before the first long one. Judged on a server with
`/stats/live` and its debug lines (this project's); another engine's is not gated.
"""

from __future__ import annotations

import threading
import time

from e2e.log import kv
from e2e.scenarios.params import eos_of
from verdicts import Same
from verdicts.params import continuation

CAPACITY = 2048  # the session's pool in tokens per row of a step (toy-paged: 128 pages of 16, the pad's one
# included; a target of speculative rounds, emitting up to `rows` tokens a step, gets `rows` times as many)
SHORTS = 8
SHORT_TOKENS = 4
WAIT_S = 60.0  # for the third long request to be seen waiting


def flags(r) -> list[str]:
    return ["--capacity", str(CAPACITY * max(1, r.target.widest))]


def _long_prompt(i: int) -> list[int]:
    return list(f"long {i}".encode())


def _short_prompt(i: int) -> list[int]:
    return list(f"s{i}".encode())


def long_pages(facts: dict) -> int:
    """A long request's reservation: two fit with a sixteenth of the pool (one page at least) to spare
    for short ones, and a third does not (toy-paged: 63 pages past the pad, 2 x 30 + 3)."""
    usable = int(facts["pages"]) - int(facts.get("pad_pages", 1))
    return (usable - max(1, usable // 16)) // 2


def long_tokens(facts: dict, rows: int, ids: list[int]) -> int:
    """max_tokens that makes `ids`' room exactly `long_pages` pages."""
    return long_pages(facts) * int(facts["page"]) - len(ids) - rows + 1


def _seen(live, running: int, waiting: int, over) -> bool:
    """/stats/live shows `running` requests running and `waiting` waiting, within WAIT_S; False at once
    when `over()` (a long request ended: the moment passed)."""
    deadline = time.monotonic() + WAIT_S
    while time.monotonic() < deadline and not over():
        d = live.client.get("/stats/live").json()
        if d.get("running") == running and d.get("waiting") == waiting:
            return True
        time.sleep(0.005)
    return False


def _streams(live, bodies: list[dict]) -> tuple[list, list[threading.Thread], bool]:
    """Send the long requests one after another, each once the one before runs; True when the last
    was seen waiting beside the others running."""
    out: list = [None] * len(bodies)

    def one(i: int) -> None:
        try:
            out[i] = live.client.request(bodies[i])[0]
        except BaseException as exc:  # reported with the check
            out[i] = exc

    threads = [threading.Thread(target=one, args=(i,), daemon=True) for i in range(len(bodies))]
    seen = True
    for i, t in enumerate(threads):
        t.start()
        last = i == len(threads) - 1
        seen = seen and _seen(live, i + (not last), int(last), lambda: any(o is not None for o in out))
    return out, threads, seen


def _order(log, long_m: set[int]) -> tuple[int, int, int]:
    """(short requests queued while the third long one waited, those of them admitted before it was,
    short ones finished before the first long one did), from the server's own `queued`, `admitted`
    and `finished` lines, in the order its scheduler wrote them. A short one "queued while the third
    waited" reached the core before any long one finished (so before the third could start): a
    server that lets a request that fits go first admits it in that same round. One queued later (the
    machine so loaded that the long ones ended first) says nothing of the policy."""
    events = []  # (event, request) for every queued, admitted and finished line, in the log's order
    kinds: dict = {}  # request -> long?
    for line in log.text().splitlines():
        tag = next((t for t in ("queued", "admitted", "finished") if f" {t} " in line), None)
        if tag is None:
            continue
        d = kv(line)
        if tag != "finished" and "max_tokens" in d:
            kinds.setdefault(d.get("request"), int(d["max_tokens"]) in long_m)
        events.append((tag, d.get("request")))
    events = [(e, q) for e, q in events if q in kinds]
    first_long_end = next((i for i, (e, q) in enumerate(events) if e == "finished" and kinds[q]), len(events))
    early = {q for e, q in events[:first_long_end] if e == "queued" and not kinds[q]}
    admitted = [q for e, q in events if e == "admitted"]
    last_long = max((i for i, q in enumerate(admitted) if kinds[q]), default=0)
    ahead = sum(1 for q in admitted[:last_long] if q in early)
    finished = [kinds[q] for e, q in events if e == "finished"]
    first = finished.index(True) if True in finished else len(finished)
    return len(early), ahead, sum(1 for k in finished[:first] if k is False)


def run(r) -> None:
    live = r.need("long_room")
    r.serial_ends("long_room's requests run at once")
    if live.stats.has_endpoint is None:
        live.stats.read()
    if not live.stats.has_endpoint or live.client.get("/stats/live").status_code != 200:
        r.checks.add("long_beside_short", None, "not gated: the server has no /stats/live")
        return
    facts = r.server_facts.get("long_room") or r.facts["long_room"]
    rows = int(facts.get("rows", r.target.widest))
    longs = [_long_prompt(i) for i in range(3)]
    ms = [long_tokens(facts, rows, ids) for ids in longs]
    bodies = [{"model": live.client.model, "prompt": ids, "max_tokens": m, "ignore_eos": True, "stream": True,
               "return_token_ids": True} for ids, m in zip(longs, ms)]
    got, threads, seen = _streams(live, bodies)
    shorts = live.client.run_all([(_short_prompt(i), SHORT_TOKENS) for i in range(SHORTS)])
    problems: list[str] = []
    for t in threads:
        t.join()
    same = Same(r.oracle, rows)
    for i, a in enumerate(shorts):
        if isinstance(a, BaseException):
            problems.append(f"short {i}: {type(a).__name__}: {a}")
        else:
            same.add(f"short {i}", _short_prompt(i), a.ids, r.oracle.run(_short_prompt(i), SHORT_TOKENS, rows))
    eos = eos_of(r)
    for i, data in enumerate(got):
        if isinstance(data, BaseException):
            problems.append(f"long {i}: {type(data).__name__}: {data}")
            continue
        chunks = data.get("chunks") or []
        ids = [t for c in chunks for t in (c["choices"][0].get("token_ids") or [])]
        finish = chunks[-1]["choices"][0].get("finish_reason") if chunks else None
        if finish != "length" or not data.get("done"):
            problems.append(f"long {i}: finish {finish}, [DONE] {data.get('done')}")
        if len(ids) != ms[i]:
            problems.append(f"long {i}: {len(ids)} tokens, not its max_tokens {ms[i]}")
        elif not r.target.floats:  # past a float target's EOS its near-ties are not judged (as params_ids)
            same.add(f"long {i}", longs[i], ids, continuation(r.oracle, rows, longs[i], ms[i], eos, True))
    early, ahead, before = _order(live.session.log, set(ms))
    if ahead == 0 and early == 0 and not live.session.log.count("admitted"):
        problems.append("the server wrote no `admitted` lines (asked for its debug lines: RUST_LOG=kern_serve=debug "
                        "did not reach it?), so the order cannot be read")
    if ahead == 0 and seen and early:
        problems.append(f"none of the {early} short request(s) that reached the core while the third long one "
                        "waited started before it (first-come order)")
    ok = not problems and (same.ok or not r.oracle.exact)
    if ok and not (seen and early):  # answers right, the order not judged: never a failure for a machine's speed
        ok = None
        problems.append("the order is not judged: " + ("a long request ended before the third was seen waiting"
                                                       if not seen else "every short request reached the core "
                                                       "after a long one had ended (a loaded machine)"))
    note = (f"pool {facts['pages']} pages; 3 long ({', '.join(map(str, ms))} tokens, {long_pages(facts)} pages each), "
            f"{SHORTS} short: "
            f"{early} reached the core while the third waited, {ahead} of them started ahead of it, {before} "
            f"finished before the first long one; {same}")
    r.checks.add("long_beside_short", ok, note + "".join(f"; {p}" for p in problems), same.excused)
