"""One test per bug behind the design (reference §4, issue 3); each was seen to fail with its bug."""

from pool import Denied, Evicted, Host, Lease, Pool, Prefix, Tier
from test_pool_models import PAGED4, Device, HostModel, K, pool4


def test_a_mid_page_checkpoints_host_copy_is_never_reused_after_the_lease_writes_on():
    """Review P1: a mid-page checkpoint shared the page its lease kept writing, and parking reused
    the host copy of that page by id."""
    p, h = Pool(PAGED4, 4, 16, 0), Host(64, 4, 4, 8)
    dev, hm = Device(4), HostModel(4)
    a = p.lease(16)
    for pos in range(10):
        dev.tokens[a.slot_of(pos)] = 100 + pos
    cp1, c = p.checkpoint(a, 10)
    dev.copy(c)
    q1, c = h.park(cp1)
    hm.park(dev, c)
    # the lease writes on into the page the first checkpoint ended inside
    for pos in range(10, 12):
        dev.tokens[a.slot_of(pos)] = 100 + pos
    cp2, c = p.checkpoint(a, 12)
    dev.copy(c)
    q2, c = h.park(cp2)
    assert c.pages == [(a.pages[2], q2.offsets()[2])], "the written page is copied again"
    hm.park(dev, c)
    assert [hm.tokens.get((q2.offsets()[pos // 4], pos % 4)) for pos in range(12)] == list(range(100, 112))
    assert q2.offsets()[:2] == q1.offsets()[:2]


def test_reparking_a_woken_session_copies_only_its_new_pages():
    """Lessons 2026-09-03: a woken session parked again re-copied everything (no twins at wake)."""
    p, h = Pool(PAGED4, 4, 16, 0), Host(64, 4, 4, 8)
    q, _ = h.park(cp := p.retire(p.lease(8), 8))
    cp.release()
    lease, wake = h.restore(q, p, 8, 16)
    assert len(wake.pages) == 2
    cp2 = p.retire(lease, 16)
    q2, c = h.park(cp2)
    assert c.pages == [(cp2.page_ids()[2], q2.offsets()[2]), (cp2.page_ids()[3], q2.offsets()[3])]
    assert q2.offsets()[:2] == q.offsets()


def test_a_hit_stays_valid_after_its_entry_is_evicted():
    """Lessons 2026-09-04: a retry after making room used a stale resident id and panicked."""
    p, ix = pool4(), Prefix(4)
    a = p.lease(8)
    ix.insert([1] * 8, p.retire(a, 8))
    hit = ix.lookup([1] * 9)
    assert ix.evict() == Evicted((1,) * 8, False, 0) and ix.entries() == 0
    lease, copies = p.restore(hit.store, hit.len, 12)
    assert lease.pages[:2] == hit.store.page_ids() and not copies
    hit.release()
    lease.release()
    assert p.used == 0


def test_the_dropped_parked_count_is_reported_on_the_successful_park_path():
    """host_evictions undercounted: evict discarded the dropped count when the park succeeded."""
    ix = Prefix(4)
    room = [1]

    def park(store):
        if room[0] == 0:
            return Denied.HostFull
        room[0] -= 1
        return K(store.tokens, store.has_slot, "host")

    ix.insert([1] * 4, K(4))
    assert ix.evict(park) == Evicted((1,) * 4, True, 0)
    ix.insert([2] * 4, K(4))

    def park_after_drop(store):
        # the parked entry has gone for room: the host has room again
        if ix.count(Tier.HOST) == 0:
            room[0] = 1
        return park(store)

    assert ix.evict(park_after_drop) == Evicted((2,) * 4, True, 1)


def test_a_lookup_that_finds_nothing_touches_nothing():
    """Restamping an off-path candidate that shared no whole page warmed the coldest entry, and
    the wrong entry was evicted."""
    ix = Prefix(4)
    ix.insert([1, 2, 3, 4, 5, 6, 7, 8], K(8))
    ix.insert([9] * 8, K(8))
    assert ix.lookup([1, 2, 0, 0, 0, 0]) is None
    assert ix.evict().key == (1, 2, 3, 4, 5, 6, 7, 8)


def test_a_wake_into_a_pool_that_fits_exactly_one_worst_case_turn_succeeds():
    """Wake/park livelock: waking made a checkpoint and then restored it (two allocations, the
    partial page twice), so a pool that fit exactly one turn was one page short: Busy, park the
    just-woken entry, wake it again, forever."""
    p, h = Pool(PAGED4, 4, 6, 0), Host(64, 4, 4, 8)  # 6 pages: the pad and one 5-page turn
    pad = p.lease_pad()
    assert isinstance(pad, Lease) and p.max_seq_tokens == 20
    q, _ = h.park(cp := p.retire(p.lease(10), 10))
    cp.release()
    assert p.used == 1
    got = h.restore(q, p, 10, p.max_seq_tokens)
    assert not isinstance(got, Denied), got
    lease, copies = got
    assert len(lease.pages) == 5 and len(copies.pages) == 3 and p.used == p.total
    assert p.take_pending() is None


def test_a_request_that_needs_the_pad_page_is_exceeds_row_before_any_lease():
    """The request limit had not subtracted the pad page: a request that filled the pool exactly
    was never admitted (Busy forever) instead of being refused as too long."""
    p = pool4()
    p.lease_pad()
    assert p.max_seq_tokens == 28
    assert p.lease(29) == Denied.ExceedsRow(28)
    assert p.used == 1 and p.take_pending() is None
    assert isinstance(p.lease(28), Lease)
