"""Capacity planning without a model: a trace replayed through the pool, the index and the host tier.

`--policy engine` drives them exactly as the server's scheduler does for a paged target, one request
at a time: admission is `serve.core.admission.Admission` itself (look up; restore, wake or lease the whole
room; on Busy release the hit, evict once — park or drop the coldest — and ask again), the steps'
whole-page checkpoints are `Admission.checkpoint` at the positions the scheduler's steps reach (each
prefill chunk, then each decode step that completes a page, never the step that ends the request),
and the lease is released at the end. The runtime is a stand-in that moves no bytes.

`--policy lru` is the Mooncake paper's simulation: a per-block LRU of the inputs only, a request
hitting the blocks of its prefix that are cached.

Figures per capacity: requests, input tokens, hit tokens and ratio, resident and host hits (requests
and tokens), parks, evictions and host evictions, tokens left to compute per request (p50/p90/p99),
and the infinite-cache bound (the hit tokens of an index that never evicts).
"""

from __future__ import annotations

import collections
import contextlib
import gc
import time
from dataclasses import asdict, dataclass, field
from typing import Callable

import numpy as np

from pool import Geometry, Lease, Prefix, Tokens
from serve.core.admission import WAIT, Admission
from serve.core.engine import size
from serve.core.request import Request
from serve.core.stats import Counters
from replay.traces import Req, packed_fresh, packed_prompt

__all__ = ["Figures", "Setup", "replay_engine", "replay_lru", "setup_for"]


@dataclass(slots=True)
class Setup:
    """What is replayed against: the geometry, the device tier and the host tier, and the steps."""

    geometry: Geometry
    capacity: int  # device tokens
    host_bytes: int = 0
    chunk: int = 1 << 62  # prefill tokens per step
    emits: bool = True  # the prefill's last chunk emits the first answer token
    vocab: int | None = None  # token ids hashed into 0..vocab-1 (a server's vocabulary)


def setup_for(page: int, capacity: int, host_tokens: int = 0, bytes_per_token: int = 1, reach: int = 1 << 22,
              chunk: int = 1 << 62, emits: bool = True, vocab: int | None = None) -> Setup:
    """A paged geometry of `page`-token pages whose rows reach `reach` tokens (the rest: `Setup`'s)."""
    width = -(-reach // page)
    g = Geometry(paged=(("kv", bytes_per_token),), page_tables=(("block_table", "kv", width, page),))
    return Setup(g, capacity, host_tokens * bytes_per_token, chunk=chunk, emits=emits, vocab=vocab)


@dataclass(slots=True)
class Figures:
    capacity: int
    host_tokens: int
    policy: str
    page: int
    requests: int = 0
    rejected: int = 0
    input_tokens: int = 0
    hit_tokens: int = 0
    hit_ratio: float = 0.0
    resident_hits: int = 0
    resident_hit_tokens: int = 0
    host_hits: int = 0
    host_hit_tokens: int = 0
    parks: int = 0
    evictions: int = 0
    host_evictions: int = 0
    left_p50: float = 0.0
    left_p90: float = 0.0
    left_p99: float = 0.0
    bound_tokens: int = 0
    bound_ratio: float = 0.0
    seconds: float = 0.0
    # per request: (hit tokens, tier) — for checking against a server; not printed
    per_request: list = field(default_factory=list, repr=False)

    def as_dict(self) -> dict:
        d = asdict(self)
        d.pop("per_request")
        return d


class _Protocol:
    def __init__(self, emits: bool) -> None:
        self.prefill_emits = emits


class _Runtime:
    """The runtime's side of admission and checkpoints, moving nothing: a `serve.core.device.Device` whose
    steps emit nothing (the replay runs no step) and whose plans are no-ops."""

    def __init__(self, emits: bool) -> None:
        self.protocol = _Protocol(emits)
        self.timing = None
        self.epoch = 0
        self.broken = None
        self.while_waiting = None

    def step(self, program: str, cells: list) -> list:
        return [[] for _ in cells]  # plans only: nothing emitted

    def logits(self, groups: int) -> None:
        return None

    def hold_partial(self) -> bool:
        return False

    def trouble(self) -> None:
        return None

    def copy(self, copies) -> None:
        pass

    def wake(self, copies) -> None:
        pass

    def park(self, copies) -> None:
        pass

    def land(self, plan) -> None:
        pass

    def zero_slot(self, slot) -> None:
        pass


@dataclass(slots=True)
class _Engine:
    """The fields of `serve.core.engine.Engine` that admission and checkpoints read."""

    runtime: _Runtime
    pool: object
    host: object
    prefix: Prefix
    unit: int
    context: int | None = None  # no context bound past the pool's own

    @property
    def pages(self) -> int:
        return self.pool.pages_max

    @property
    def max_request_tokens(self) -> int:
        return self.pool.max_seq_tokens


@dataclass(eq=False, slots=True)
class _Request(Request):
    """A request whose prompt and answer are one packed run: `fed` slices it, no lists."""

    seq: Tokens | None = None

    def fed(self, start: int, stop: int) -> Tokens:
        assert start == 0
        return self.seq.prefix(stop)

    def key_to(self, n: int) -> Tokens:
        """A checkpoint's key: a prefix view of the one packed run (the index grows its entry in place)."""
        return self.seq.prefix(n)


def _no_log(name: str, level: str = "INFO", **fields) -> None:
    """The admission's log (`serve.common.logs.event`'s signature), silenced: a replay writes no log lines."""


def _no_send(update) -> None:
    """A replayed request's updates go nowhere (the figures are read from the core's counters)."""


def _percentiles(left: list[int]) -> tuple[float, float, float]:
    if not left:
        return 0.0, 0.0, 0.0
    p = np.percentile(np.asarray(left, dtype=np.float64), [50, 90, 99])
    return float(p[0]), float(p[1]), float(p[2])


def _last_checkpoint(cached: int, end: int, m: int, emits: int, chunk: int) -> int:
    """The furthest position a step that does not end the request reaches (0: none does)."""
    last = end + m - emits - 1
    if last > end:
        return last
    if not (emits and m == 1):
        return end
    # the prefill chunk that ends the prompt ends the request: the chunk before it is the last
    before = cached + (end - cached - 1) // chunk * chunk
    return before if before > cached else 0


class _Kept:
    """A snapshot of the bound's index: its length only."""

    __slots__ = ("tokens",)
    has_slot = False

    def __init__(self, tokens: int) -> None:
        self.tokens = tokens

    def clone(self):
        return self

    def release(self) -> None:
        pass


def _bound_one(ix: Prefix, toks: Tokens, m: int, unit: int, emits: int, chunk: int) -> int:
    """One request of `_bound`: its hit, then its last snapshot kept."""
    hit = ix.lookup(toks)
    cached = hit.len if hit is not None else 0
    end = len(toks) if emits else len(toks) - 1
    # answer tokens are fresh, so only the prompt's part of the snapshot can ever be hit
    n = min(_last_checkpoint(cached, end, m, emits, chunk), len(toks)) // unit * unit
    if n > cached:
        ix.insert(toks.prefix(n), _Kept(n))
    return cached


def _bound(reqs: list[Req], unit: int, setup: Setup) -> int:
    """Hit tokens of an index that never evicts and holds every snapshot the policy makes (each
    request's last checkpoint: whole pages of what its steps fed), each request looking up first.
    (`replay_engine` runs the same steps beside its own, on the prompts it builds anyway.)"""
    ix = Prefix(unit)
    emits = 1 if setup.emits else 0
    return sum(_bound_one(ix, Tokens(packed_prompt(r, setup.vocab)), r.output_length, unit, emits, setup.chunk)
               for r in reqs)


@contextlib.contextmanager
def _collector_paused():
    """The cyclic garbage collector off for a replay, as it was after. A replay makes no reference
    cycles that die before its end (its trees are whole until then), while it keeps hundreds of
    thousands of runs, entries and tree nodes alive and allocates millions of copy plans' pairs:
    each collection that this sets off rescans what is live and frees nothing."""
    was = gc.isenabled()
    gc.disable()
    try:
        yield
    finally:
        if was:
            gc.enable()


def replay_engine(reqs: list[Req], setup: Setup, tick: Callable[[int], None] | None = None,
                  bound: int | None = None) -> Figures:
    """Replay `reqs` one at a time through a server's pool, index and host tier (module docstring)."""
    with _collector_paused():
        return _replay_engine(reqs, setup, tick, bound)


def _replay_engine(reqs: list[Req], setup: Setup, tick: Callable[[int], None] | None, bound: int | None) -> Figures:
    t0 = time.perf_counter()
    pool, host = size(setup.geometry, setup.capacity, 0, setup.host_bytes)
    pad = pool.lease_pad()
    if not isinstance(pad, Lease):
        raise ValueError(f"a device tier of {setup.capacity} tokens cannot hold the pad page ({pad!r})")
    unit = pool.unit
    engine = _Engine(_Runtime(setup.emits), pool, host, Prefix(unit), unit)
    counters = Counters()
    adm = Admission(engine, counters, log=_no_log)
    emits = 1 if setup.emits else 0
    fig = Figures(setup.capacity, setup.host_bytes // max(sum(b for _, b in setup.geometry.paged), 1),
                  "engine", unit)
    left: list[int] = []
    fresh = 0
    vocab, chunk = setup.vocab, setup.chunk
    # the infinite-cache bound, unless given: its own index, fed the same prompts in the same order
    bix = Prefix(unit) if bound is None else None
    bound_tokens = 0
    for i, r in enumerate(reqs):
        prompt = packed_prompt(r, vocab)
        n = len(prompt) >> 2
        m = r.output_length
        seq = Tokens(prompt + packed_fresh(fresh, m, vocab))
        fresh += m
        ids = seq.prefix(n)
        if bix is not None:
            bound_tokens += _bound_one(bix, ids, m, unit, emits, chunk)
        req = _Request(f"r{i}", ids, m, 1, _no_send, seq=seq)
        fig.requests += 1
        fig.input_tokens += n
        got = adm.admit(req)
        if got == WAIT:
            raise AssertionError("a request waits with nothing else running: the pool is held by no one")
        if got is not None:
            fig.rejected += 1
            fig.per_request.append(None)
            if tick:
                tick(1)
            continue
        fig.per_request.append((req.cached, req.tier))
        left.append(n - req.cached)
        _run(adm, req, chunk, emits, m, unit)
        req.lease.release()
        req.lease = None
        if tick:
            tick(1)
    c = counters
    fig.hit_tokens = c["prefix_hit_tokens"]
    fig.resident_hits, fig.resident_hit_tokens = c["resident_hits"], c["resident_hit_tokens"]
    fig.host_hits, fig.host_hit_tokens = c["host_hits"], c["host_hit_tokens"]
    fig.parks, fig.evictions, fig.host_evictions = c["parks"], c["evictions"], c["host_evictions"]
    _finish(fig, left, bound if bound is not None else bound_tokens)
    engine.prefix.clear()
    pad.release()
    assert pool.used == 0 and pool.leases == 0, f"the replay leaked: {pool!r}"
    fig.seconds = time.perf_counter() - t0
    return fig


def _run(adm: Admission, req: _Request, chunk: int, emits: int, m: int, unit: int) -> None:
    """The checkpoints the scheduler's steps make for one admitted request, in order."""
    end = req.fed_end
    pos = req.pos
    # prefill chunks; the one that ends the prompt emits the first token when the program emits
    while pos < end:
        pos += min(chunk, end - pos)
        final = emits and pos == end and m == 1
        if not final and pos // unit > req.page_mark:
            adm.checkpoint(req, pos // unit)
    # decode steps: step s feeds one token (pos end+s) and emits token s+emits; the last ends it
    last = end + m - emits - 1  # the last position a step that does not end the request reaches
    if last <= end:
        return
    first = end + 1
    p = first if (first // unit) > req.page_mark else (req.page_mark + 1) * unit
    while p <= last:
        adm.checkpoint(req, p // unit)
        p = (p // unit + 1) * unit


def _finish(fig: Figures, left: list[int], bound: int) -> None:
    fig.hit_ratio = fig.hit_tokens / fig.input_tokens if fig.input_tokens else 0.0
    fig.left_p50, fig.left_p90, fig.left_p99 = _percentiles(left)
    fig.bound_tokens = bound
    fig.bound_ratio = bound / fig.input_tokens if fig.input_tokens else 0.0


def _blocks(r: Req, page: int) -> list[tuple]:
    """A request's blocks as (key, tokens): hash ids as they are, token pages by their prefix. A
    page smaller than a hash id's block (it must divide it) splits each id's block into pages
    (id, j): the same id at the same position holds the same tokens, so page j of it does too."""
    if r.hash_ids is not None:
        b = r.block
        if page < b:
            if b % page:
                raise ValueError(f"a page of {page} tokens does not divide the trace's block of {b}")
            n = r.input_length
            return [((h, j), min(page, n - at)) for i, h in enumerate(r.hash_ids)
                    for j, at in enumerate(range(i * b, min((i + 1) * b, n), page))]
        return [(h, min(b, r.input_length - i * b)) for i, h in enumerate(r.hash_ids) if r.input_length > i * b]
    toks = r.tokens
    out, key = [], None
    for at in range(0, len(toks), page):
        key = hash((key, tuple(toks[at:at + page])))
        out.append((key, min(page, len(toks) - at)))
    return out


def replay_lru(reqs: list[Req], capacity: int, page: int | None = None,
               tick: Callable[[int], None] | None = None) -> Figures:
    """The paper's simulation: blocks in one LRU of `capacity` tokens (a block holds its block's
    tokens, 512 for a Mooncake id); a request hits its leading blocks that are cached, then every
    block it reads is refreshed or added, the least recently used leaving first. `page`: the
    block's tokens (default: a hash id's block, 512 for token traces); for hash ids it must divide
    their block (each id's block is split into pages), a larger one is refused (ValueError)."""
    t0 = time.perf_counter()
    ids = bool(reqs) and reqs[0].hash_ids is not None
    if page is None:
        page = reqs[0].block if ids else 512
    elif ids and (page > reqs[0].block or reqs[0].block % page):
        raise ValueError(f"a page of {page} tokens does not divide the trace's block of {reqs[0].block} tokens")
    fig = Figures(capacity, 0, "lru", page)
    cache: collections.OrderedDict = collections.OrderedDict()
    held = 0
    seen: set = set()
    bound = 0
    left: list[int] = []
    for r in reqs:
        blocks = _blocks(r, page)
        fig.requests += 1
        fig.input_tokens += r.input_length
        hit = 0
        for key, n in blocks:
            if key not in cache:
                break
            hit += n
        for key, n in blocks:
            if key not in seen:
                break
            bound += n
        for key, n in blocks:
            seen.add(key)
            if key in cache:
                cache.move_to_end(key)
            else:
                cache[key] = n
                held += n
        while held > capacity and cache:
            _, n = cache.popitem(last=False)
            held -= n
            fig.evictions += 1  # a block (the policy's unit) left the cache
        fig.hit_tokens += hit
        if hit:
            fig.resident_hits += 1
            fig.resident_hit_tokens += hit
        left.append(r.input_length - hit)
        fig.per_request.append((hit, "device" if hit else None))
        if tick:
            tick(1)
    _finish(fig, left, bound)
    fig.seconds = time.perf_counter() - t0
    return fig
