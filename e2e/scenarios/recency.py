"""recency: an entry that grew while other sequences ran is as recent as its last growth (issue 39).

A sequence is checkpointed every page it fills, and kern's index grows its entry in place (one entry
per sequence, `pool/prefix.py` `_grow`, `_grow_found`); the entry's recency must follow each growth,
or the LRU evicts a sequence still being extended ahead of one untouched since. One request at a time
never shows it: nothing is stamped between a sequence's checkpoints. So, on a small pool (`_pages`)
with no host tier:

1. two long streamed requests, A and C (``ignore_eos``, rooms of `LONG_TOKENS` tokens each), run
   together, so their checkpoints interleave (each one's growth follows the other's insert);
2. once both run (``/stats/live``), a short request B is answered (its entry inserted, then never
   touched again);
3. A and C run on more than two pages of the server's steps past B, then the gate hangs up on them
   (the server aborts them; their grown entries stay cached). The server's ``admitted`` and
   ``finished`` lines (each with the step it ended at) must show both admitted before B ended and
   ending more than a page of steps after it, else the order is reported, not judged. As the gate
   ends them itself, nothing races its client's speed;
4. then, idle, prompt-only fillers take the free pages down to what one request can reserve (a
   sequence's reach), and one request D reserves one page more than the pool has free (its
   ``/stats``): exactly one entry must go, the least recently used, which is B's;
5. B's sequence (prompt and answer) is sent again: `recency_after_growth` holds its ``cached_tokens``
   to 0. A B still cached means A's or C's entry, stamped at its first insert and grown since, was
   taken instead (mutant `grown-entry-keeps-its-recency`: SGLang's radix cache / vLLM's block pool,
   a prefix extended in place that keeps its old last-access time).

Every answer is held to the reference (of A and C, hung up on, the tokens before their first EOS:
the rest would cost the reference a run per EOS over thousands of tokens). Judged on a
server with ``/stats`` and ``/stats/live`` and its debug lines (this project's kern); a lined target
(its snapshots are not grown) and a pipeline do not run it.
"""

from __future__ import annotations

import random
import threading
import time

from e2e.log import kv
from verdicts import Same

__all__ = ["flags", "run"]

B_TOKENS = 4
WAIT_S = 60.0  # for A and C to be seen running, and for the server's steps past B


LONG_TOKENS = 8192  # A's and C's rooms, at most: toy-paged's whole reach (a target that reaches less: its reach)


def _pages(page: int, reach: int = LONG_TOKENS) -> tuple[int, int]:
    """(A's and C's room each, the session's pool) in pages: each room `LONG_TOKENS` or a sequence's
    whole reach if less (they run until the gate hangs up on them, so however slowly the gate's client
    moves, B comes while they run: beside a second suite it once reacted after 2,000 steps, when rooms
    of 2,048 tokens had ended); the pool holds both, B, the pad and a quarter more."""
    long = min(reach, LONG_TOKENS) // page
    return long, 2 * long + long // 2 + 4


def flags(r) -> list[str]:
    """A small pool (`_pages`) with no host tier: an entry evicted is gone, not parked."""
    return ["--capacity", str(_pages(r.page)[1] * r.page), "--host-gib", "0", "--max-seqs", "4"]


def _fill(r, live, same: Same, facts: dict, rows: int) -> int:
    """Prompt-only requests (one token each, their prompts' whole pages cached, newer than A, B and C)
    until what is free fits one request's reach with a page to spare; the pages free then."""
    page, reach = int(facts["page"]), int(facts["reach"]) // int(facts["page"])
    rng = random.Random(f"recency-{r.opts.seed}")
    k = 0
    while True:
        free = int(facts["pages"]) - int(((live.client.stats() or {}).get("gauges") or {}).get("pages_used", 0))
        if free + 1 <= reach - 1 or k >= 8:
            return free
        ids = [rng.randrange(256) for _ in range(min(free - 2, reach - 2) * page)]
        a = live.client.complete(ids, 1)
        same.add(f"filler {k + 1} ({len(ids)} tokens)", ids, a.ids, r.oracle.run(ids, 1, rows))
        k += 1


def _prompt(name: str, pages: int, page: int) -> list[int]:
    """`pages` whole pages and 3 tokens, distinct from the others' from the first page on: a whole page
    is cached at once (A's and C's at their prefill, before B is sent; B's to be evicted or not)."""
    head = list(f"recency {name} ".encode())
    n = pages * page + 3
    return (head + [(i * 37 + ord(name)) % 256 for i in range(n)])[:n]


def _live_until(live, ok, over=lambda: False) -> bool:
    """/stats/live read every 5 ms until `ok(it)` (True), `over()` or WAIT_S (False)."""
    deadline = time.monotonic() + WAIT_S
    while time.monotonic() < deadline and not over():
        d = live.client.live() or {}
        if ok(d):
            return True
        time.sleep(0.005)
    return False


def _lines(log, ids: list[str]) -> tuple[list[tuple[str, str]], dict[str, int]]:
    """The named requests' `admitted` and `finished` lines in the server's order, and the step count
    each finished at."""
    order, ended = [], {}
    for line in log.text().splitlines():
        tag = next((t for t in (" admitted ", " finished ") if t in line), None)
        if tag is None:
            continue
        d = kv(line)
        q = d.get("request")
        if q in ids:
            order.append((tag.strip(), q))
            if tag == " finished " and "step" in d:
                ended[q] = int(d["step"])
    return order, ended


def _longs(live, ids: list[list[int]], m: int, stop: threading.Event) -> tuple[list, list[threading.Thread]]:
    """A and C streamed (`ignore_eos`, `m` tokens) on threads that read until `stop`, then hang up:
    per request [token ids read, its id or None]."""
    got: list = [[[], None] for _ in ids]

    def one(i: int) -> None:
        got[i][1] = live.client.hang_up(ids[i], max_tokens=m, ignore_eos=True, until=stop, ids=got[i][0])[0]

    threads = [threading.Thread(target=one, args=(i,), daemon=True) for i in range(len(ids))]
    for t in threads:
        t.start()
    return got, threads


def _ordered(log, b: str, longs: list[str | None], page: int) -> tuple[bool, list[int]]:
    """(whether the server's lines show each long request admitted before B finished and finishing more
    than a page of steps after it, the steps each finished after B)."""
    order, ended = _lines(log, [b, *(q for q in longs if q)])
    first_b_end = order.index(("finished", b)) if ("finished", b) in order else -1
    before_b = {q for e, q in order[:first_b_end] if e == "admitted"}
    after = [ended.get(q, 0) - ended.get(b, 0) for q in longs]
    return len(ended) == 3 and all(q in before_b for q in longs) and min(after) > page, after


def run(r) -> None:
    live = r.need("recency")
    r.serial_ends("recency's long requests run beside a short one")
    if live.client.live() is None or live.client.stats() is None:
        r.checks.add("recency_after_growth", None, "not gated: the server has no /stats or /stats/live")
        return
    facts = r.server_facts.get("recency") or r.facts["recency"]
    page, rows = int(facts["page"]), int(facts.get("rows", r.target.widest))
    same, problems = Same(r.oracle, rows), []
    a_ids, c_ids, b_ids, d_ids = (_prompt(n, k, page) for n, k in (("A", 1), ("C", 1), ("B", 2), ("D", 1)))
    long, _ = _pages(page, int(facts["reach"]))
    m = long * page - len(a_ids) - rows + 1  # A's and C's room: exactly `long` pages, a sequence's reach
    stop = threading.Event()
    got, threads = _longs(live, [a_ids, c_ids], m, stop)
    ended_early = lambda: any(not t.is_alive() for t in threads)  # noqa: E731
    both = _live_until(live, lambda d: d.get("running") == 2, ended_early)
    b = live.client.complete(b_ids, B_TOKENS)
    same.add("B", b_ids, b.ids, r.oracle.run(b_ids, B_TOKENS, rows))
    after_b = (live.client.live() or {}).get("steps", 0)
    _live_until(live, lambda d: d.get("steps", 0) > after_b + 2 * page, ended_early)  # each grows after B
    stop.set()  # hang up: the server aborts A and C
    for t in threads:
        t.join()
    _live_until(live, lambda d: d.get("running") == 0)
    for name, ids, (toks, _) in (("A", a_ids, got[0]), ("C", c_ids, got[1])):
        want = r.oracle.run(ids, m, rows)  # up to the first EOS: what is judged of an answer hung up on
        k = min(len(toks), len(want))
        same.add(f"{name} (its first {k} tokens)", ids, toks[:k], want[:k])
    ordered, after = _ordered(live.session.log, b.request, [q for _, q in got], page)
    ordered = ordered and both
    free = _fill(r, live, same, facts, rows)
    stats = live.client.stats() or {}
    gauges, counters = stats.get("gauges") or {}, stats.get("counters") or {}
    entries = gauges.get("resident_entries")
    m_d = (free + 1) * page - len(d_ids) - rows + 1  # D's room: one page more than is free
    d = live.client.complete(d_ids, m_d)
    same.add("D", d_ids, d.ids, r.oracle.run(d_ids, m_d, rows))
    evicted = int(((live.client.stats() or {}).get("counters") or {}).get("evictions", 0)) - int(counters.get("evictions", 0))
    probe = b_ids + b.fed
    again = live.client.complete(probe, 1)
    same.add("B's sequence again", probe, again.ids, r.oracle.run(probe, 1, rows))
    note = (f"pool {facts['pages']} pages; A and C hung up after {len(got[0][0])} and {len(got[1][0])} tokens "
            f"(rooms of {long} pages), B {B_TOKENS}; A and C ended {after} steps after B; then {entries} entries "
            f"resident, {free} pages free, D's room {free + 1} pages: {evicted} evicted; B's sequence again hit "
            f"{again.cached} of {len(probe)} tokens; {same}")
    if evicted < 1:
        problems.append("D evicted nothing: the flood did not reach the pool's end")
    if ordered and again.cached:
        problems.append("B, untouched since before A's and C's last growth, outlived them in the LRU: an entry grown "
                        "in place kept the recency of its first insert")
    ok = not problems and (same.ok or not r.oracle.exact)
    if ok and not ordered:  # answers right, the order not established: never a failure for a machine's speed
        ok = None
        problems.append("not judged: " + ("A and C were not seen running together" if not both else
                                          "A and C were not both admitted before B ended, or did not run on more "
                                          "than a page of steps after it (the server's `admitted` and `finished` "
                                          "lines)"))
    r.checks.add("recency_after_growth", ok, note + "".join(f"; {p}" for p in problems), same.excused)
