"""The host tier: placement, sharing through twins, HostFull, restore; and a seeded property run
against device and host models (reference §3.3)."""

from __future__ import annotations

import pytest

from pool import Copies, Denied, Host, Lease, Parked, Pool, PoolError, runs
from test_pool_models import HYBRID4, PAGED4, Device, HostModel, Mapping, Rand, fold, hybrid_pool4, swap_remove


def host(n: int) -> Host:
    return Host(4 * n, 4, 4, 8)


def test_placement_pages_low_slot_high():
    p, h = hybrid_pool4(), host(16)
    cp = p.retire(p.lease(10), 10)
    q, copies = h.park(cp)
    assert q.offsets() == [0, 4, 8] and q.seq_slot() == 56
    assert copies == Copies(pages=[(0, 0), (1, 4), (2, 8)], slot=(1, 56))
    assert h.used() == 20
    q.release()
    assert h.used() == 0 and h.free_runs() == [(0, 64)]


def test_the_next_turn_copies_only_its_new_pages():
    p, h = Pool(PAGED4, 4, 16, 0), host(16)
    a = p.lease(16)
    cp1, _ = p.checkpoint(a, 8)
    q1, c1 = h.park(cp1)
    assert len(c1.pages) == 2
    cp2, _ = p.checkpoint(a, 16)
    q2, c2 = h.park(cp2)
    assert c2.pages == [(2, 8), (3, 12)] and q2.offsets() == [0, 4, 8, 12]
    # parking again copies nothing
    q3, c3 = h.park(cp2)
    assert not c3 and q3.offsets() == q2.offsets()
    for q in (q1, q2, q3):
        q.release()
    assert h.used() == 0
    # every holder gone: parking copies again
    q4, c4 = h.park(cp2)
    assert len(c4.pages) == 4
    for x in (q4, cp1, cp2, a):
        x.release()
    assert p.used == 0 and h.used() == 0


def test_a_wake_that_cuts_the_host_run_keeps_the_twins():
    """A running sequence's checkpoint parked, then a shorter prompt woken from it (the wake cuts the
    host run where its whole pages end), then the sequence's next checkpoint parked: only its new
    page is copied, its first pages shared with their twins (a cut host run once lost its device
    run's twin and every page was copied again: found by tests/test_core_machine.py)."""
    p, h = Pool(PAGED4, 4, 16, 0), host(16)
    a = p.lease(16)
    cp1, _ = p.checkpoint(a, 12)
    q1, c1 = h.park(cp1)
    assert len(c1.pages) == 3 and h.used() == 12
    cp1.release()  # the resident entry evicted; the lease runs on
    woken, plan = h.restore(q1, p, 8, 12)  # another request's 8-token prefix hit: two whole pages
    assert len(plan.pages) == 2
    woken.release()
    cp2, _ = p.checkpoint(a, 16)
    q2, c2 = h.park(cp2)
    assert c2.pages == [(a.pages[3], 12)] and q2.offsets() == [0, 4, 8, 12] and h.used() == 16
    for x in (q1, q2, cp2, a):
        x.release()
    assert p.used == 0 and h.used() == 0


def test_host_full_keeps_nothing():
    p, h = hybrid_pool4(), host(4)
    cp = p.retire(p.lease(12), 12)
    assert h.park(cp) == Denied.HostFull
    assert h.used() == 0 and h.free_runs() == [(0, 16)]
    # frees coalesce: a block-sized slot fits at 0
    only_slot = Host(8, 4, 4, 8)
    slot_cp = p.retire(p.lease_slot(), 3)
    q, copies = only_slot.park(slot_cp)
    assert q.seq_slot() == 0 and copies.slot == (slot_cp.seq_slot(), 0)
    # a 5-byte page takes 2 grains
    wide = Host(40, 4, 5, 8)
    plain = Pool(PAGED4, 4, 8, 0)
    q2, _ = wide.park(plain.retire(plain.lease(8), 8))
    assert q2.offsets() == [0, 8] and wide.used() == 16


def test_a_parked_checkpoint_restores_into_one_lease():
    p, h = hybrid_pool4(), host(16)
    cp = p.retire(p.lease(10), 10)
    q, _ = h.park(cp)
    cp.release()
    lease, plan = h.restore(q, p, 10, 20)
    assert lease.prefix == 10 and len(lease.pages) == 5 and lease.shared == 2
    assert plan.pages == list(zip(q.offsets(), lease.pages[:3])) and plan.slot == (56, lease.slot)
    # the next checkpoint at 10 copies only the half page; parking it copies 1 page, shares 2
    cp2, c2 = p.checkpoint(lease, 10)
    assert c2.pages == [(lease.pages[2], cp2.page_ids()[2])]
    q2, c3 = h.park(cp2)
    assert len(c3.pages) == 1 and q2.offsets()[:2] == q.offsets()[:2]
    for x in (q, q2, cp2, lease):
        x.release()
    assert (p.used, p.slots_used, h.used()) == (0, 0, 0)
    # stateless at a whole page
    plain = Pool(PAGED4, 4, 8, 0)
    cp3 = plain.retire(plain.lease(10), 10)
    q3, _ = h.park(cp3)
    cp3.release()
    lease, plan = h.restore(q3, plain, 4, 8)
    assert len(lease.pages) == 2 and len(plan.pages) == 1 and lease.prefix == 4
    lease.release()
    q3.release()
    assert plain.used == 0 and h.used() == 0


def test_restoring_short_of_a_stateful_parked_checkpoint():
    p, h = hybrid_pool4(), host(16)
    q, _ = h.park(p.retire(p.lease(10), 10))
    with pytest.raises(PoolError, match=r"restoring 4 tokens of a parked checkpoint of 10 \(with a slot\)"):
        h.restore(q, p, 4, 20)


def test_runs_fold_consecutive_pairs():
    assert runs([(3, 0), (4, 4), (5, 8), (9, 12), (10, 20)], 1, 4) == [(3, 0, 3), (9, 12, 1), (10, 20, 1)]
    assert runs([]) == []


# property


class HostWorld:
    def __init__(self, geometry, chunk: int, chunks: int, first_slots: int, host_pages: int, seed: int) -> None:
        self.pool, plan = Pool.new(geometry, chunk, chunks, first_slots)
        self.map = Mapping(geometry, chunk, chunks, self.pool)
        self.map.land(plan)
        self.unit = self.pool.unit
        self.host = Host(host_pages * geometry.page_size + 2 * geometry.slot_size, 4,
                         geometry.page_size, geometry.slot_size)
        self.dev, self.hm = Device(self.unit), HostModel(self.unit)
        self.stateful = geometry.has_slots
        self.rand = Rand(seed)
        # [handle, content, line]
        self.seqs: list[list] = []
        self.cps: list[list] = []
        self.parked: list[list] = []
        self.stamp = 0
        self.parks = 0
        self.wakes = 0

    def ask(self, fn):
        got = fn()
        if got == Denied.Remapping:
            self.map.land_pending()
            got = fn()
        if got == Denied.Busy:
            # make room the way the server does: let a snapshot go, else a sequence (no retry)
            bag = self.cps or self.seqs
            if bag:
                swap_remove(bag, self.rand.next(len(bag)))[0].release()
        return got

    def fill(self, s: list) -> None:
        lease, content = s[0], s[1]
        for pos in range(len(content), lease.tokens):
            self.stamp += 1
            self.dev.tokens[lease.slot_of(pos)] = self.stamp
            content.append(self.stamp)
            s[2] = fold(s[2], self.stamp)
        if lease.slot is not None:
            self.dev.lines[lease.slot] = s[2]

    def length(self, store) -> int:
        n = store.tokens
        if not store.has_slot and n > self.unit:
            k = self.rand.next(n // self.unit + 1) * self.unit
            if 1 <= k < n:
                return k
        return n

    def step(self) -> None:
        r, p = self.rand, self.pool
        top = p.max_seq_tokens
        roll = r.next(9)
        if roll == 0:
            got = self.ask(lambda: p.lease(1 + r.next(top)))
            if isinstance(got, Lease):
                if got.slot is not None:
                    self.dev.lines[got.slot] = 0
                s = [got, [], 0]
                self.seqs.append(s)
                self.fill(s)
        elif roll in (1, 2) and self.seqs:
            lease, content, line = r.pick(self.seqs)
            cut = len(content) if self.stateful else 1 + r.next(len(content))
            got = self.ask(lambda: p.checkpoint(lease, cut))
            if not isinstance(got, Denied):
                self.dev.copy(got[1])
                self.cps.append([got[0], content[:cut], line])
        elif roll in (3, 4) and self.cps:
            cp, content, line = r.pick(self.cps)
            got = self.host.park(cp)
            if not isinstance(got, Denied):
                q, copies = got
                assert len(copies.pages) <= cp.pages
                self.hm.park(self.dev, copies)
                self.parked.append([q, content, line])
                self.parks += 1
        elif roll == 5 and self.parked:
            q, content, line = r.pick(self.parked)
            n = self.length(q)
            if n < top:
                got = self.ask(lambda: self.host.restore(q, p, n, n + 1 + r.next(top - n)))
                if not isinstance(got, Denied):
                    lease, copies = got
                    self.hm.wake(self.dev, copies)
                    s = [lease, content[:n], line]
                    self.seqs.append(s)
                    self.fill(s)
                    self.wakes += 1
        elif roll == 6 and self.cps:
            cp, content, line = r.pick(self.cps)
            n = self.length(cp)
            if n < top:
                got = self.ask(lambda: p.restore(cp, n, n + 1 + r.next(top - n)))
                if not isinstance(got, Denied):
                    self.dev.copy(got[1])
                    s = [got[0], content[:n], line]
                    self.seqs.append(s)
                    self.fill(s)
        elif roll == 7:
            kinds = [k for k in (self.seqs, self.cps, self.parked) if k]
            if kinds:
                bag = r.pick(kinds)
                swap_remove(bag, r.next(len(bag)))[0].release()

    def check(self) -> None:
        u, dev, hm = self.unit, self.dev, self.hm
        pages: set[int] = set()
        for handle, content, line in self.seqs + self.cps:
            ids = handle.page_ids()
            pages.update(ids)
            for pos, want in enumerate(content):
                assert dev.tokens.get(ids[pos // u] * u + pos % u) == want, f"{handle!r} at {pos}"
            if handle.seq_slot() is not None:
                assert dev.lines.get(handle.seq_slot()) == line, f"{handle!r} line"
        offsets: set[int] = set()
        slots: set[int] = set()
        for q, content, line in self.parked:
            offs = q.offsets()
            offsets.update(offs)
            for pos, want in enumerate(content):
                assert hm.tokens.get((offs[pos // u], pos % u)) == want, f"{q!r} at {pos}"
            if q.has_slot:
                slots.add(q.seq_slot())
                assert hm.lines.get(q.seq_slot()) == line, f"{q!r} line"
        assert self.pool.used == len(pages)
        assert self.host.used() == len(offsets) * self.host.page_stride + len(slots) * self.host.slot_bytes


@pytest.mark.parametrize("geometry, chunk, chunks, first_slots, seed", [
    pytest.param(PAGED4, 4, 24, 0, 0x9E3779B97F4A7C15, id="paged4"),
    pytest.param(HYBRID4, 4, 30, 3, 0x2545F4914F6CDD1D, id="hybrid4"),
])
def test_parked_bytes_come_back_and_partition_the_block(geometry, chunk, chunks, first_slots, seed):
    """Device stamps read back through leases and checkpoints, host stamps through `offsets()`
    (a device and a host model applying every park and wake plan); `pool.used` equals the distinct
    pages named; the host's used bytes are exactly partitioned by the parked stores."""
    w = HostWorld(geometry, chunk, chunks, first_slots, 12, seed)
    for _ in range(4000):
        w.step()
        w.check()
    assert w.parks > 100 and w.wakes > 40
    for bag in (w.seqs, w.cps, w.parked):
        for x in bag:
            x[0].release()
    assert (w.pool.used, w.pool.slots_used, w.host.used()) == (0, 0, 0)
