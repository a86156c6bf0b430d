"""The prefix-vs-SGLang trace (../shared/bench/prefix-vs-sglang/trace.py) through our pool and index.

Per request, as the server does it: look the prompt up; restore the hit into a lease for the whole
turn (or lease afresh); release the hit; retire the lease at the turn's whole pages (a paged target
checkpoints whole pages only) and insert that snapshot; in the pressure variant, when the snapshots
hold more than the budget, evict (drop) the coldest until the slack is freed.

The loop and the figures are trace.py's `replay()`, with one difference the README of that folder
asks for: as on SGLang's side, the clocks hold only the index's own work (look up and release,
insert, evict with the frees it causes); the pool's leasing, restoring and retiring around them run
with the clocks paused, and their seconds are printed apart as the CONTEXT figure `pool_s`.
`total_wall_s` is the loop less `pool_s`.

Lookup keys carry one extra token past the prompt, because our lookup considers `tokens[:-1]` (the
last token must still run) while SGLang's `match_prefix` considers the whole key.
"""

from __future__ import annotations

import gc
import importlib.util
import statistics
import sys
import time

from pool import Denied, Geometry, Lease, Pool, Prefix, Tokens

HEADLINE = ["total_wall_s", "lookups_per_s", "inserts_per_s", "evicted_tokens", "hit_ratio"]
CONTEXT = ["evict_s", "evict_calls", "hit_tokens", "queried_tokens", "held_tokens_end", "pool_s"]
PAST = 2**32 - 1  # the token after every lookup key


def load_trace_module(path: str):
    spec = importlib.util.spec_from_file_location("prefix_trace", path)
    mod = importlib.util.module_from_spec(spec)
    sys.modules["prefix_trace"] = mod  # dataclasses looks the module up
    spec.loader.exec_module(mod)
    return mod


class Served:
    """The pool and the index for one replay: pages of `page` tokens, room for the whole trace."""

    def __init__(self, page: int, capacity: int) -> None:
        geometry = Geometry(paged=(("kv", 1),), page_tables=(("block_table", "kv", 1 << 20, page),))
        chunk = 1 << 16
        self.unit = page
        self.pool = Pool(geometry, chunk, -(-capacity * 1 // chunk) + 1, 0, tokens=capacity)
        self.ix = Prefix(page)

    def held(self) -> int:
        return self.pool.used * self.unit


def replay(tr, page: int) -> dict:
    """trace.replay()'s loop over our pool and index (see the module docstring)."""
    unit = page
    n = len(tr.requests)
    looks, keys, rooms = _requests(tr, unit)
    s = Served(page, tr.stats["novel_tokens"] + max(rooms) + 64 * unit * n // 16)
    pool, ix = s.pool, s.ix
    lookup, insert, evict = ix.lookup, ix.insert, ix.evict
    budget = tr.budget_tokens
    slack = tr.evict_tokens
    queried = tr.stats["lookup_tokens"]
    pc = time.perf_counter
    t_lookup = t_insert = t_evict = t_pool = 0.0
    hit_tokens = evicted = evict_calls = 0

    gc.collect()
    t0 = pc()
    for i in range(n):
        a = pc()
        hit = lookup(looks[i])
        b = pc()
        if hit is None:
            got = pool.lease(rooms[i])
        else:
            hit_tokens += hit.len
            got = pool.restore(hit.store, hit.len, rooms[i])
        c = pc()
        if hit is not None:
            hit.release()
        d = pc()
        if isinstance(got, Denied):
            raise AssertionError(f"request {i}: the pool refused room ({got!r}); it is sized for the trace")
        lease = got if isinstance(got, Lease) else got[0]
        key = keys[i]
        if len(key):
            cp = pool.retire(lease, len(key))
        else:
            lease.release()
        e = pc()
        if len(key):
            insert(key, cp)
        f = pc()
        t_lookup += (b - a) + (d - c)
        t_insert += f - e
        t_pool += (c - b) + (e - d)
        if budget is not None:
            held = pool.used * unit
            if held > budget:
                g = pc()
                evicted += _evict(pool, evict, held, held - budget + slack, unit)
                t_evict += pc() - g
                evict_calls += 1
    total = pc() - t0 - t_pool
    out = dict(total_wall_s=total, lookups_per_s=n / t_lookup, inserts_per_s=n / t_insert, evicted_tokens=evicted,
               hit_ratio=hit_tokens / queried, evict_s=t_evict, evict_calls=evict_calls, hit_tokens=hit_tokens,
               queried_tokens=queried, held_tokens_end=s.held(), pool_s=t_pool)
    _check_emptied(s, budget, out["held_tokens_end"])
    return out


def _requests(tr, unit: int) -> tuple[list, list, list]:
    """Per request: the lookup key (its prompt and a token past it), the key it is inserted under
    (its whole pages), and the room it leases."""
    n = len(tr.requests)
    looks = [Tokens.of(tr.ops[2 * i][1] + [PAST]) for i in range(n)]
    fulls = [tr.ops[2 * i + 1][1] for i in range(n)]
    keys = [Tokens.of(f[: len(f) // unit * unit]) for f in fulls]
    rooms = [len(f) for f in fulls]
    return looks, keys, rooms


def _evict(pool, evict, held: int, want: int, unit: int) -> int:
    """Evict until `want` tokens are freed (or nothing is left to evict); the tokens freed."""
    freed = 0
    while freed < want and evict() is not None:
        freed = held - pool.used * unit
    return freed


def _check_emptied(s, budget: int | None, held_end: int) -> None:
    """Every snapshot is the index's: dropping them all leaves the pool empty; the budget held."""
    pool = s.pool
    s.ix.clear()
    if pool.used or pool.leases:
        raise AssertionError(f"after clearing the index the pool holds {pool.used} pages, {pool.leases} leases")
    if budget is not None and held_end > budget:
        raise AssertionError(f"held {held_end} > budget {budget}")


def fmt(x) -> str:
    if isinstance(x, int):
        return str(x)
    return f"{x:.6g}"


def main(args) -> None:
    mod = load_trace_module(args.sglang_trace)
    print(f"# index: kern pool.Prefix over pool.Pool, python {sys.version.split()[0]}")
    print(f"# date {time.strftime('%Y-%m-%d %H:%M:%S %Z')}")
    pages = [int(p) for p in args.pages.split(",")]
    for variant in args.variants.split(","):
        tr = mod.generate(args.trace_seed, variant)
        print(f"# trace {variant}: digest {tr.digest[:16]}, requests {tr.stats['requests']}, "
              f"budget {tr.budget_tokens}, slack {tr.evict_tokens}")
        for page in pages:
            for _ in range(args.warmup):
                replay(tr, page)
            runs = [replay(tr, page) for _ in range(args.repeat)]
            for k in HEADLINE + CONTEXT:
                vals = [x[k] for x in runs]
                med = statistics.median(vals)
                if all(isinstance(v, int) for v in vals) and med == int(med):
                    med = int(med)
                tag = "FIGURE" if k in HEADLINE else "CONTEXT"
                print(f"{tag} kern page={page} trace={variant} {k} {fmt(med)} runs={','.join(fmt(v) for v in vals)}")
            sys.stdout.flush()
