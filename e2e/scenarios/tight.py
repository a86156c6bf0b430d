"""Session tight: a KV cache of about three requests (`cache`: kern's ``--capacity``, an engine's
``{cache_tokens}``), so blocks are freed, evicted and reused all the time (issue 39).

- `eviction_proven` (serial): a probe P, its next turn T (T = P + answer + 4 tokens) and T again
  (its hit h1), then unrelated prompts of twice the cache's tokens one at a time, then T again (h2).
  Gated: every answer identical, h1 > 0 and h2 < h1 (something the cache held was evicted and the
  answer recomputed). An engine whose cache size the gate cannot set (no ``{cache_tokens}``) skips
  the session (`skipped (engine lacks cache-size; eviction not exercised)`).
- `refcount_stress`: a shared warm prefix (a prompt and its answer), then at once six readers of
  it with staggered ``max_tokens`` (2 to 16) and six unrelated prompts that allocate while the
  readers run and finish one by one (three times, each a fresh draw and order), then two readers
  alone. A block freed while a reader still reads it (a refcount one short), and taken by an
  unrelated prompt, changes that reader's answer.
- `preempt_recompute`: eight requests at once (four on the shared prefix, four fresh), 32 answer
  tokens each, about twice what the cache holds: an engine preempts and recomputes (vLLM) or queues
  (kern); either way every answer identical. The note gives the engine's preemptions (its /metrics).

Every hit is held within what could have been cached (`e2e/scenarios/wild.py`).
"""

from __future__ import annotations

import random

from e2e.scenarios.prefix import _preemptions
from e2e.scenarios.wild import Judge, block, counted, draw, segment

__all__ = ["cache", "evict_proof", "flags", "preempt", "refcount"]

M = 16
READERS = 6
UNRELATED = 6
BURSTS = 3  # each a fresh draw and order: a free-while-read needs a reader and an allocation to meet
PREEMPT = 8
FLOOD_M = 8


def _shape(b: int, rows: int) -> tuple[int, int]:
    """(the shared prefix's length, the largest room any request of the session asks)."""
    w = 2 * segment(b)
    return w, w + b + 2 * M + 8 + rows


def cache(r) -> int:
    """The session's cache in tokens: three of its largest rooms and a page (kern's pad), whole pages."""
    b = r.page
    _, room = _shape(b, r.rows)
    return (3 * -(-room // b) + 1) * b


def flags(r) -> list[str]:
    """No host tier (whatever --server-flags say): an evicted block is gone, not parked and woken."""
    return ["--host-gib", "0"]


def _evictions(before: int | None, after: int | None, say: str) -> str:
    """What /stats told of the evictions in between (`say` with the count), or nothing without /stats."""
    return say.format(after - before) if before is not None and after is not None else ""


def _rng(r, what: str) -> random.Random:
    return random.Random(f"tight-{what}-{r.opts.seed}")


def _shared(r, j: Judge, rng: random.Random) -> list[int]:
    """The warm shared prefix: a prompt answered (twice) and its answer fed back."""
    w, _ = _shape(block(r), r.rows)
    warm = draw(rng, w)
    a = j.serial("the shared prefix", warm, min(r.m, M))
    j.serial("the shared prefix again", warm, min(r.m, M))
    return warm + a.fed


def evict_proof(r) -> None:
    b = block(r)
    w, _ = _shape(b, r.rows)
    m = min(r.m, M)
    rng = _rng(r, "evict")
    size = cache(r)
    j = Judge(r, "eviction_proven")
    before = counted(r)
    p = draw(rng, w + b)
    a = j.serial("probe", p, m)
    t = p + a.fed + draw(rng, 4)
    j.serial("next turn", t, m)
    h1 = j.serial("next turn again", t, m).cached
    flooded = 0
    while flooded < 2 * size:
        ids = draw(rng, w + b)
        flooded += len(ids) + len(j.serial(f"flood {flooded}", ids, FLOOD_M).fed)
    h2 = j.serial("next turn after the flood", t, m).cached
    after = counted(r)
    why = (f"the probe's next turn hit {h1} tokens before and {h2} after {flooded} tokens of unrelated prompts "
           f"through a cache of {size}" + _evictions(before, after, " (/stats: {} evictions)"))
    if h1 == 0:
        j.add(False, why + ": it was never served from the cache, so no eviction could show")
    elif h2 >= h1:
        j.add(False, why + ": nothing it held was evicted (is the cache larger than the gate asked?)")
    else:
        j.add(True, why + ": evicted and recomputed")


def refcount(r) -> None:
    b = block(r)
    w, _ = _shape(b, r.rows)
    m = min(r.m, M)
    rng = _rng(r, "refcount")
    j = Judge(r, "refcount_stress")
    shared = _shared(r, j, rng)
    r.serial_ends("refcount_stress (a burst)")
    before = counted(r)
    for k in range(BURSTS):
        calls = [(shared + draw(rng, rng.randint(1, b)), 2 + i * (m - 2) // (READERS - 1)) for i in range(READERS)]
        calls += [(draw(rng, w + b), m) for _ in range(UNRELATED)]
        rng.shuffle(calls)
        j.burst(f"burst {k + 1}", calls)
    for k in range(2):
        j.serial(f"reader {k + 1} after the burst", shared + draw(rng, rng.randint(1, b)), m)
    after = counted(r)
    j.add(True, _evictions(before, after, "/stats: {} evictions meanwhile"))


def preempt(r) -> None:
    b = block(r)
    w, _ = _shape(b, r.rows)
    rng = _rng(r, "preempt")
    j = Judge(r, "preempt_recompute")
    shared = _shared(r, j, rng)
    r.serial_ends("preempt_recompute (a burst)")
    live = r.need_any()
    before = _preemptions(live.client)
    calls = [(shared + draw(rng, rng.randint(1, b)), 2 * M) for _ in range(PREEMPT // 2)]
    calls += [(draw(rng, w + b), 2 * M) for _ in range(PREEMPT - PREEMPT // 2)]
    j.burst("burst", calls)
    after = _preemptions(live.client)
    j.add(True, f"preemptions {after - (before or 0):.0f} (the engine's /metrics)" if after is not None else "")
