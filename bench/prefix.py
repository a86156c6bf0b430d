"""Prefix index and pool rates on a synthetic multi-turn trace.

Sessions branch from a few shared system prompts; each turn appends a user message and an answer.
Every turn looks its prompt up, restores the hit (or leases afresh), checkpoints the whole turn and
inserts it; when the pool is busy the coldest snapshot is parked in the host tier (or dropped).
Prints insert, lookup and evict rates, then the pool's lease/checkpoint/release rate, then how long
a pool of `--build-pages` (10 million) pages takes to build beside numpy filling arrays of that size.

    python bench/prefix.py [--sessions 200] [--turns 6] [--systems 4] [--seed 1]
    python bench/prefix.py --sglang-trace ../shared/bench/prefix-vs-sglang/trace.py [--repeat N] [--warmup N]

With `--sglang-trace`, replays that file's seeded trace (page 1 and 16, base and pressure) through
the pool and the index as the server uses them and prints its FIGURE/CONTEXT lines with the index
name `kern` (bench/sglang_trace.py).
"""

from __future__ import annotations

import argparse
import os
import random
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from pool import Denied, Geometry, Host, Lease, Pool, Prefix, Tier  # noqa: E402

TOY_PAGED = Geometry(paged=(("kv", 4096),), page_tables=(("block_table", "kv", 512, 16),))


class Clock:
    def __init__(self) -> None:
        self.ops: dict[str, int] = {}
        self.secs: dict[str, float] = {}

    def time(self, name: str, fn, *args):
        t = time.perf_counter()
        out = fn(*args)
        self.secs[name] = self.secs.get(name, 0.0) + time.perf_counter() - t
        self.ops[name] = self.ops.get(name, 0) + 1
        return out

    def rate(self, name: str) -> str:
        n, s = self.ops.get(name, 0), self.secs.get(name, 0.0)
        return f"{name:<8} {n:>8} ops  {n / s if s else 0:>12,.0f} ops/s"


def trace(args) -> list[list[int]]:
    """The prompts, turn by turn, sessions interleaved."""
    rng = random.Random(args.seed)
    systems = [[rng.randrange(256) for _ in range(args.system_tokens)] for _ in range(args.systems)]
    histories = [list(rng.choice(systems)) for _ in range(args.sessions)]
    prompts = []
    for _ in range(args.turns):
        for h in histories:
            h.extend(rng.randrange(256) for _ in range(rng.randrange(8, 64)))
            prompts.append(list(h))
            h.extend(rng.randrange(256) for _ in range(rng.randrange(16, 128)))
    return prompts


def run_index(args, prompts: list[list[int]]) -> Clock:
    pool = Pool(TOY_PAGED, 2 << 20, args.capacity * 4096 // (2 << 20), 0)
    pool.lease_pad()
    host = Host(args.host_pages * pool.geometry.page_size, 4096, pool.geometry.page_size, 0)
    ix, clock = Prefix(pool.unit), Clock()

    def park(cp):
        got = host.park(cp)
        return got if isinstance(got, Denied) else got[0]

    for prompt in prompts:
        room = len(prompt) + 128
        while True:
            hit = clock.time("lookup", ix.lookup, prompt)
            if hit is None:
                got = pool.lease(room)
            elif hit.tier is Tier.DEVICE:
                got = pool.restore(hit.store, hit.len, room)
            else:
                got = host.restore(hit.store, pool, hit.len, room)
            if hit is not None:
                hit.release()
            if got != Denied.Busy or clock.time("evict", ix.evict, park) is None:
                break
        if isinstance(got, Denied):
            continue
        lease = got if isinstance(got, Lease) else got[0]
        snap = pool.checkpoint(lease, len(prompt))
        if isinstance(snap, Denied):
            # the partial page needs room: seal it in place instead (the request ends here)
            snap = (pool.retire(lease, len(prompt)), None)
        else:
            lease.release()
        clock.time("insert", ix.insert, prompt, snap[0])
    ix.clear()
    return clock


def run_pool(args) -> tuple[int, float]:
    pool = Pool(TOY_PAGED, 2 << 20, args.capacity * 4096 // (2 << 20), 0)
    rng = random.Random(args.seed)
    n, t = 0, time.perf_counter()
    for _ in range(args.pool_ops):
        tokens = rng.randrange(1, 2048)
        lease = pool.lease(tokens)
        cp, _ = pool.checkpoint(lease, rng.randrange(1, tokens + 1))
        lease.release()
        cp.release()
        n += 1
    return n, time.perf_counter() - t


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--sessions", type=int, default=200, help="concurrent sessions (default 200)")
    ap.add_argument("--turns", type=int, default=6, help="turns per session (default 6)")
    ap.add_argument("--systems", type=int, default=4, help="shared system prompts (default 4)")
    ap.add_argument("--system-tokens", type=int, default=512, help="tokens per system prompt (default 512)")
    ap.add_argument("--capacity", type=int, default=65536, help="pool capacity in tokens (default 65536)")
    ap.add_argument("--host-pages", type=int, default=4096, help="host tier size in pages (default 4096)")
    ap.add_argument("--pool-ops", type=int, default=20000, help="lease/checkpoint/release rounds (default 20000)")
    ap.add_argument("--seed", type=int, default=1)
    ap.add_argument("--build-pages", type=int, default=10_000_000, help="pages of the pool whose build is timed (default 10M)")
    ap.add_argument("--sglang-trace", metavar="PATH", help="replay this trace.py's trace instead (see bench/sglang_trace.py)")
    ap.add_argument("--repeat", type=int, default=3, help="with --sglang-trace: timed replays per configuration")
    ap.add_argument("--warmup", type=int, default=1, help="with --sglang-trace: untimed replays first")
    ap.add_argument("--pages", default="1,16", help="with --sglang-trace: page sizes")
    ap.add_argument("--trace-seed", type=int, default=0, help="with --sglang-trace: the trace seed (default 0)")
    ap.add_argument("--variants", default="base,pressure", help="with --sglang-trace: trace variants")
    args = ap.parse_args(argv)
    if args.sglang_trace:
        from bench.sglang_trace import main as replay_main

        replay_main(args)
        return
    prompts = trace(args)
    clock = run_index(args, prompts)
    print(f"trace: {len(prompts)} turns, {args.sessions} sessions from {args.systems} system prompts")
    for name in ("insert", "lookup", "evict"):
        print(clock.rate(name))
    n, secs = run_pool(args)
    print(f"pool     {n:>8} lease+checkpoint+release  {n / secs:>12,.0f} rounds/s")
    built, ceiling = build_pool(args.build_pages)
    print(f"build    {args.build_pages:>8} pages  {built:.3f} s (the goal: under 1 s); numpy filling "
          f"arrays of that size: {ceiling:.3f} s, ratio {built / ceiling:.1f}")


def build_pool(pages: int) -> tuple[float, float]:
    """Seconds to build a pool of `pages` 16-token pages, and to fill the arrays such a pool needs
    (a status byte and a free-list entry per page) with numpy: the ceiling."""
    import numpy as np

    t = time.perf_counter()
    Pool(TOY_PAGED, 2 << 20, pages * 16 * 4096 // (2 << 20), 0, tokens=pages * 16)
    built = time.perf_counter() - t
    t = time.perf_counter()
    np.zeros(pages, np.uint8).fill(1)
    np.arange(pages, dtype=np.int64)
    ceiling = time.perf_counter() - t
    return built, ceiling


if __name__ == "__main__":
    main()
