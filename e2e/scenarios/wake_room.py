"""wake_room: a pool sized for exactly one worst-case turn 2 of prompt 1 (``--host-gib 2``).

The first turn, then turn 2 must complete within 60 s, identical, with parks ≤ 1 and wakes ≤ 1 (a
lined target parks its snapshot once and wakes it straight into the lease; a paged one continues in
place): a park/wake live-lock logs ``parked`` without end. Then a request whose room is the whole
pool (pages × page) is rejected as ContextLength: the pad's page is not the request's.
capacity = (⌈(len(turn 2) + M + rows − 1)/page⌉ + 1)·page.
"""

from __future__ import annotations

import httpx

from e2e.client import Rejected
from e2e.prompts import PROMPTS
from e2e.results import Turn2
from e2e.watch import Hung
from verdicts import Same

TURN2_TIMEOUT = 60.0


def capacity(r) -> int:
    room = len(r.got(Turn2).turns[0].ids) + r.m + r.rows - 1
    return (-(-room // r.page) + 1) * r.page


def flags(r) -> list[str]:
    return ["--capacity", str(capacity(r)), "--host-gib", "2"]


def run(r) -> None:
    live = r.need("wake_room")
    first = r.answer(PROMPTS[0])
    ids = r.prompt_ids(first, PROMPTS[0]) + first.fed + list(r.got(Turn2).suffix)
    problems = []
    if ids != list(r.got(Turn2).turns[0].ids):
        problems.append("the first turn answered otherwise than in the default session")
    same = Same(r.oracle, r.rows)
    try:
        a = r.answer(ids, timeout=TURN2_TIMEOUT)
        same.add("turn 2 of prompt 1", ids, a.ids, r.oracle.run(ids, r.m, r.rows))
        hit = a.cached
    except httpx.TimeoutException:
        live.session.check()
        problems.append(f"turn 2 did not complete within {TURN2_TIMEOUT:.0f}s")
        hit = None
    except Hung as exc:
        problems.append(f"turn 2 did not complete: {exc}")
        hit = None
    except Rejected as exc:
        problems.append(f"turn 2 rejected: {exc}")
        hit = None
    c = live.stats.read()
    parks, wakes = c.get("parks", 0), c.get("wakes", 0)
    logged = 0 if live.stats.has_endpoint else live.session.log.count("parked")  # /stats counts parks
    if parks > 1 or wakes > 1 or logged > 1:
        problems.append(f"park/wake loop: parks {parks}, wakes {wakes}, {logged} parked lines")
    facts = c.get("facts") or r.facts["wake_room"]
    pool = int(facts["pages"]) * int(facts["page"])
    prompt = r.prompt_ids(first, PROMPTS[0])
    fill = pool - len(prompt) - r.rows + 1
    try:
        r.answer(prompt, fill, timeout=TURN2_TIMEOUT)
        problems.append(f"the exact-fill request (room {pool} = the whole pool) was served")
    except Rejected as exc:
        if exc.status != 400 or exc.code != "context_length_exceeded":
            problems.append(f"the exact-fill request (room {pool}) got {exc}, not ContextLength")
    except httpx.TimeoutException:
        problems.append(f"the exact-fill request (room {pool}) hung: no answer within {TURN2_TIMEOUT:.0f}s")
    except Hung as exc:
        problems.append(f"the exact-fill request (room {pool}) hung: {exc}")
    ok = not problems and same.ok
    note = (f"capacity {capacity(r)}; turn 2 {same}, hit {hit}; parks {parks}, wakes {wakes}; "
            f"room {pool} → ContextLength" + ("".join(f"; {p}" for p in problems)))
    r.checks.add("wake_room", ok, note, same.excused)
