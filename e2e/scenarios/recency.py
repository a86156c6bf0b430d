"""recency: an entry that grew while other sequences ran is as recent as its last growth (issue 39).

A sequence is checkpointed every page it fills, and kern's index grows its entry in place (one entry
per sequence, `pool/prefix.py` `_grow`, `_grow_found`); the entry's recency must follow each growth,
or the LRU evicts a sequence still being extended ahead of one untouched since. One request at a time
never shows it: nothing is stamped between a sequence's checkpoints. So, on a small pool (`_pages`)
with no host tier:

1. two long streamed requests, A and C (``ignore_eos``, `LONG_TOKENS` tokens each), run together, so
   their checkpoints interleave (each one's growth follows the other's insert);
2. while both run, a short request B is answered (its entry inserted, then never touched again);
3. A and C run on, each at least a page further (the server's own ``finished`` lines give the step
   each request ended at: A's and C's must come more than a page of steps after B's, else the order
   is reported, not judged);
4. then, idle, one request D whose reservation is one page more than the pool has free (its
   ``/stats``): exactly one entry must go, the least recently used, which is B's;
5. B's sequence (prompt and answer) is sent again: `recency_after_growth` holds its ``cached_tokens``
   to 0. A B still cached means A's or C's entry, stamped at its first insert and grown since, was
   taken instead (mutant `grown-entry-keeps-its-recency`: SGLang's radix cache / vLLM's block pool,
   a prefix extended in place that keeps its old last-access time).

Every answer is held to the reference (A and C past EOS, as ``ignore_eos`` serves them). Judged on a
server with ``/stats`` and ``/stats/live`` and its debug lines (this project's kern); a lined target
(its snapshots are not grown) and a pipeline do not run it.
"""

from __future__ import annotations

import threading
import time

from e2e.log import kv
from e2e.scenarios.params import eos_of
from verdicts import Same
from verdicts.params import continuation

__all__ = ["flags", "run"]

LONG_TOKENS = 2048  # A's and C's rooms, about (whole pages): some 2,000 steps, so B comes in the middle even
# when the gate's client is slow to react (at 36 pages, 557 steps, a whole gate's load on 16 cores let A end first)
B_TOKENS = 4
WAIT_S = 60.0  # for A and C to be seen running


def _pages(page: int) -> tuple[int, int]:
    """(A's and C's room each, the session's pool) in pages: the pool holds both, B, the pad and a
    quarter more, the free part D's reservation reaches past by one page."""
    long = -(-LONG_TOKENS // page)
    return long, 2 * long + long // 2 + 4


def flags(r) -> list[str]:
    """A small pool (`_pages`) with no host tier: an entry evicted is gone, not parked."""
    return ["--capacity", str(_pages(r.page)[1] * r.page), "--host-gib", "0", "--max-seqs", "4"]


def _prompt(name: str, pages: int, page: int) -> list[int]:
    """`pages` whole pages and 3 tokens, distinct from the others' from the first page on: a whole page
    is cached at once (A's and C's at their prefill, before B is sent; B's to be evicted or not)."""
    head = list(f"recency {name} ".encode())
    n = pages * page + 3
    return (head + [(i * 37 + ord(name)) % 256 for i in range(n)])[:n]


def _running(live, n: int, over) -> bool:
    """/stats/live shows `n` requests running within WAIT_S; False at once when `over()`."""
    deadline = time.monotonic() + WAIT_S
    while time.monotonic() < deadline and not over():
        d = live.client.live() or {}
        if d.get("running") == n:
            return True
        time.sleep(0.005)
    return False


def _ended_at(log, ids: list[str]) -> dict[str, int]:
    """Each named request's step count when it finished (its server's `finished` line)."""
    out: dict[str, int] = {}
    for line in log.text().splitlines():
        if " finished " in line:
            d = kv(line)
            if d.get("request") in ids and "step" in d:
                out[d["request"]] = int(d["step"])
    return out


def _stream(live, ids: list[int], m: int, out: list, i: int) -> None:
    body = {"model": live.client.model, "prompt": ids, "max_tokens": m, "ignore_eos": True, "stream": True,
            "return_token_ids": True}
    try:
        out[i] = live.client.request(body)[0]
    except BaseException as exc:  # reported with the check
        out[i] = exc


def _long(r, same: Same, problems: list[str], name: str, ids: list[int], m: int, data, rows: int) -> str | None:
    """Judge a long stream; its request id."""
    if isinstance(data, BaseException):
        problems.append(f"{name}: {type(data).__name__}: {data}")
        return None
    chunks = data.get("chunks") or []
    got = [t for c in chunks for t in (c["choices"][0].get("token_ids") or [])]
    if len(got) != m or not data.get("done"):
        problems.append(f"{name}: {len(got)} tokens of {m}, [DONE] {data.get('done')}")
    elif not r.target.floats:  # past a float target's EOS its near-ties are not judged (as params_ids)
        same.add(name, ids, got, continuation(r.oracle, rows, ids, m, eos_of(r), True))
    return str((data.get("kern") or {}).get("request_id") or "") or None


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
    long, _ = _pages(page)
    m = long * page - len(a_ids) - rows + 1  # A's and C's room: exactly `long` pages
    got: list = [None, None]
    threads = [threading.Thread(target=_stream, args=(live, ids, m, got, i), daemon=True)
               for i, ids in enumerate((a_ids, c_ids))]
    for t in threads:
        t.start()
    both = _running(live, 2, lambda: any(g is not None for g in got))
    b = live.client.complete(b_ids, B_TOKENS)
    same.add("B", b_ids, b.ids, r.oracle.run(b_ids, B_TOKENS, rows))
    for t in threads:
        t.join()
    a_req = _long(r, same, problems, "A", a_ids, m, got[0], rows)
    c_req = _long(r, same, problems, "C", c_ids, m, got[1], rows)
    ended = _ended_at(live.session.log, [q for q in (b.request, a_req, c_req) if q])
    after = [ended.get(q, 0) - ended.get(b.request, 0) for q in (a_req, c_req)]
    stats = live.client.stats() or {}
    gauges, counters = stats.get("gauges") or {}, stats.get("counters") or {}
    free = int(facts["pages"]) - int(gauges.get("pages_used", 0))
    entries = gauges.get("resident_entries")
    m_d = (free + 1) * page - len(d_ids) - rows + 1  # D's room: one page more than is free
    d = live.client.complete(d_ids, m_d)
    same.add("D", d_ids, d.ids, r.oracle.run(d_ids, m_d, rows))
    evicted = int(((live.client.stats() or {}).get("counters") or {}).get("evictions", 0)) - int(counters.get("evictions", 0))
    probe = b_ids + b.fed
    again = live.client.complete(probe, 1)
    same.add("B's sequence again", probe, again.ids, r.oracle.run(probe, 1, rows))
    ordered = both and len(ended) == 3 and min(after) > page
    note = (f"pool {facts['pages']} pages; A and C {m} tokens each ({long} pages), B {B_TOKENS}, ended "
            f"{after} steps after B; then {entries} entries resident, {free} pages free, D's room {free + 1} pages: "
            f"{evicted} evicted; B's sequence again hit {again.cached} of {len(probe)} tokens; {same}")
    if evicted < 1:
        problems.append("D evicted nothing: the flood did not reach the pool's end")
    if ordered and again.cached:
        problems.append("B, untouched since before A's and C's last growth, outlived them in the LRU: an entry grown "
                        "in place kept the recency of its first insert")
    ok = not problems and (same.ok or not r.oracle.exact)
    if ok and not ordered:  # answers right, the order not established: never a failure for a machine's speed
        ok = None
        problems.append("not judged: " + ("A and C were not seen running together" if not both else
                                          "B did not end more than a page of steps before A and C (a loaded machine), "
                                          "or the server wrote no `finished` lines with their step"))
    r.checks.add("recency_after_growth", ok, note + "".join(f"; {p}" for p in problems), same.excused)
