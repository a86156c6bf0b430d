"""Seeded property runs of the device tier against a device model and a mapping model (reference §3.2)."""

from __future__ import annotations

import pytest

from pool import Denied, Lease, Pool
from test_pool_models import HYBRID, HYBRID4, ODD, PAGED4, Device, Mapping, Rand, fold, swap_remove

STEPS = 4000


class Seq:
    __slots__ = ("lease", "content", "line")

    def __init__(self, lease: Lease, content: list[int], line: int) -> None:
        self.lease = lease
        self.content = content
        self.line = line


class World:
    """A pool, its handles, what each handle should read, and the models the plans land on."""

    def __init__(self, geometry, chunk: int, chunks: int, first_slots: int, seed: int) -> None:
        self.pool, plan = Pool.new(geometry, chunk, chunks, first_slots)
        self.map = Mapping(geometry, chunk, chunks, self.pool)
        self.map.land(plan)
        self.dev = Device(self.pool.unit)
        self.stateful = geometry.has_slots
        self.rand = Rand(seed)
        self.seqs: list[Seq] = []
        # (store, content, line)
        self.cps: list[tuple] = []
        self.stamp = 0
        self.trace: list = []

    def ask(self, fn):
        got = fn()
        if got == Denied.Remapping:
            self.map.land_pending()
            got = fn()
        if got == Denied.Busy:
            # make room the way the server does: let a snapshot go, else a sequence (no retry)
            bag = self.cps or self.seqs
            if bag:
                gone = swap_remove(bag, self.rand.next(len(bag)))
                (gone.lease if isinstance(gone, Seq) else gone[0]).release()
        self.trace.append(got if isinstance(got, Denied) else type(got).__name__)
        return got

    def fill(self, s: Seq, upto: int) -> None:
        for pos in range(len(s.content), upto):
            self.stamp += 1
            self.dev.tokens[s.lease.slot_of(pos)] = self.stamp
            s.content.append(self.stamp)
            s.line = fold(s.line, self.stamp)
        if s.lease.slot is not None:
            self.dev.lines[s.lease.slot] = s.line

    def cut(self, s: Seq) -> int:
        n = len(s.content)
        return n if self.stateful else 1 + self.rand.next(n)

    def step(self) -> None:
        r, p = self.rand, self.pool
        top = p.max_seq_tokens
        roll = r.next(9)
        if roll in (0, 1):
            n = 1 + r.next(top)
            got = self.ask(lambda: p.lease(n))
            if isinstance(got, Lease):
                s = Seq(got, [], 0)
                if got.slot is not None:
                    self.dev.lines[got.slot] = 0
                self.seqs.append(s)
                self.fill(s, r.next(n + 1))
        elif roll == 2 and self.seqs:
            s = r.pick(self.seqs)
            self.fill(s, len(s.content) + r.next(s.lease.tokens - len(s.content) + 1))
        elif roll == 3 and self.seqs:
            s = r.pick(self.seqs)
            if s.content:
                cut = self.cut(s)
                got = self.ask(lambda: p.checkpoint(s.lease, cut))
                if not isinstance(got, Denied):
                    cp, copies = got
                    self.dev.copy(copies)
                    self.cps.append((cp, s.content[:cut], s.line))
                    self.trace.append((cp.page_ids(), cp.seq_slot()))
        elif roll == 4 and self.cps:
            cp, content, line = r.pick(self.cps)
            n = cp.tokens
            if not cp.has_slot and n > p.unit:
                k = r.next(n // p.unit + 1) * p.unit
                if 1 <= k < n:
                    n = k
            if n < top:
                tokens = n + 1 + r.next(top - n)
                got = self.ask(lambda: p.restore(cp, n, tokens))
                if not isinstance(got, Denied):
                    lease, copies = got
                    self.dev.copy(copies)
                    self.seqs.append(Seq(lease, content[:n], line))
                    self.trace.append((lease.pages, lease.slot))
        elif roll == 5 and self.seqs:
            s = r.pick(self.seqs)
            if s.content and len(s.content) < top:
                cut = self.cut(s)
                tokens = cut + 1 + r.next(top - cut)
                got = self.ask(lambda: p.fork(s.lease, cut, tokens))
                if not isinstance(got, Denied):
                    lease, copies = got
                    self.dev.copy(copies)
                    self.seqs.append(Seq(lease, s.content[:cut], s.line))
                    self.trace.append((lease.pages, lease.slot))
        elif roll == 6 and self.seqs:
            i = r.next(len(self.seqs))
            if self.seqs[i].content:
                s = swap_remove(self.seqs, i)
                cut = self.cut(s)
                cp = p.retire(s.lease, cut)
                self.cps.append((cp, s.content[:cut], s.line))
                self.trace.append((cp.page_ids(), cp.seq_slot()))
        elif roll == 7 and self.seqs:
            swap_remove(self.seqs, r.next(len(self.seqs))).lease.release()
        elif roll == 8 and self.cps:
            swap_remove(self.cps, r.next(len(self.cps)))[0].release()

    def check(self) -> None:
        p, u, dev = self.pool, self.pool.unit, self.dev
        pages: set[int] = set()
        slots: set[int] = set()
        for s in self.seqs:
            ids = s.lease.pages
            pages.update(ids)
            for pos, want in enumerate(s.content):
                assert dev.tokens.get(ids[pos // u] * u + pos % u) == want, f"lease {s.lease!r} at {pos}"
            if s.lease.slot is not None:
                slots.add(s.lease.slot)
                assert dev.lines.get(s.lease.slot) == s.line, f"lease {s.lease!r} line"
        for cp, content, line in self.cps:
            ids = cp.page_ids()
            assert len(ids) == -(-cp.tokens // u)
            pages.update(ids)
            for pos, want in enumerate(content):
                assert dev.tokens.get(ids[pos // u] * u + pos % u) == want, f"{cp!r} at {pos}"
            if cp.has_slot:
                slots.add(cp.seq_slot())
                assert dev.lines.get(cp.seq_slot()) == line, f"{cp!r} line"
        assert p.used == len(pages), f"{p.used=} {len(pages)=}"
        assert p.slots_used == len(slots), f"{p.slots_used=} {len(slots)=}"
        for i in pages:
            self.map.check_mapped("page", i)
        for i in slots:
            self.map.check_mapped("slot", i)

    def finish(self) -> None:
        for s in self.seqs:
            s.lease.release()
        for cp, _, _ in self.cps:
            cp.release()
        assert (self.pool.used, self.pool.slots_used, self.pool.sealed_pages) == (0, 0, 0)


CONFIGS = [
    pytest.param(PAGED4, 4, 24, 0, 0x9E3779B97F4A7C15, id="paged4"),
    pytest.param(HYBRID4, 4, 18, 3, 0x2545F4914F6CDD1D, id="hybrid4"),
    pytest.param(HYBRID, 8, 26, 3, 0x123456789ABCDEF1, id="hybrid"),
    pytest.param(ODD, 8, 40, 2, 0x0DDB1A5E5BAD5EED, id="odd-boundaries"),
]


def run(geometry, chunk, chunks, first_slots, seed, steps=STEPS) -> World:
    w = World(geometry, chunk, chunks, first_slots, seed)
    for _ in range(steps):
        w.step()
        w.check()
    return w


@pytest.mark.parametrize("geometry, chunk, chunks, first_slots, seed", CONFIGS)
def test_handles_read_what_their_writer_wrote(geometry, chunk, chunks, first_slots, seed):
    """Every position and line of every live lease and checkpoint reads its writer's stamp (the
    device model applying each copy plan); every remap plan lands on the mapping model; pages and
    slots held are exactly those the handles name, each made and mapped; releasing all leaves 0."""
    w = run(geometry, chunk, chunks, first_slots, seed)
    if geometry.has_slots:
        assert w.map.landed > 1, "a stateful run lands a remap beyond the initial layout"
    assert any(isinstance(t, tuple) for t in w.trace)
    w.finish()


def test_same_calls_same_ids():
    """Determinism: the same seed gives the same trace of denials, page ids and slot ids."""
    a = run(HYBRID4, 4, 18, 3, 0xABCDEF, steps=1500)
    b = run(HYBRID4, 4, 18, 3, 0xABCDEF, steps=1500)
    assert a.trace == b.trace
