"""The prefix index: growth, recency, on- and off-path hits, tiers, eviction; and a brute-force model
it must equal (reference §3.4)."""

from __future__ import annotations

import pytest

from pool import Denied, Evicted, Host, Pool, Prefix, Tier
from test_pool_models import PAGED4, K, Rand

UNIT = 4


def toks(n: int) -> list[int]:
    return [7 * i + 3 for i in range(n)]


def test_one_entry_grows_a_page_at_a_time():
    ix = Prefix(UNIT)
    for n in (4, 8, 12):
        ix.insert(toks(n), K(n))
    assert ix.entries() == 1 and ix.items() == [(tuple(toks(12)), Tier.DEVICE)]
    ix.insert(toks(10), K(10))
    assert ix.entries() == 2
    hit = ix.lookup(toks(11))
    assert (hit.len, hit.tier, hit.key) == (10, Tier.DEVICE, tuple(toks(10)))
    hit.release()
    hit = ix.lookup(toks(13))
    assert hit.len == 12
    hit.release()
    ix.insert(toks(16), K(16))
    assert [len(k) for k, _ in ix.items()] == [10, 16]


def test_same_tokens_make_one_entry():
    ix = Prefix(UNIT)
    first, again = K(6, name="first"), K(6, name="again")
    ix.insert(toks(6), first)
    ix.insert(toks(6), again)
    assert ix.entries() == 1 and not again.live and first.live


def test_the_coldest_goes_first_and_a_hit_touches_its_path():
    ix = Prefix(UNIT)
    ix.insert(toks(8), K(8))
    ix.insert([99] * 8, K(8))
    ix.lookup(toks(9)).release()
    assert ix.evict() == Evicted((99,) * 8, False, 0)
    assert ix.evict() == Evicted(tuple(toks(8)), False, 0)
    assert ix.evict() is None and ix.entries() == 0


def test_restore_then_checkpoint_deeper():
    p, ix = Pool(PAGED4, 4, 16, 0), Prefix(UNIT)
    a = p.lease(12)
    cp, _ = p.checkpoint(a, 10)
    ix.insert(toks(10), cp)
    a.release()
    hit = ix.lookup(toks(14))
    assert hit.len == 10
    b, copies = p.restore(hit.store, hit.len, 16)
    hit.release()
    assert len(copies.pages) == 1 and b.pages[:2] == cp.page_ids()[:2]
    deeper, _ = p.checkpoint(b, 14)
    ix.insert(toks(14), deeper)
    hit = ix.lookup(toks(15))
    assert hit.len == 14 and hit.store.page_ids()[:2] == cp.page_ids()[:2]
    hit.release()
    b.release()
    while ix.evict():
        pass
    assert p.used == 0


def test_a_branch_is_its_own_entry_and_the_off_path_choice_is_stable():
    ix = Prefix(UNIT)
    ix.insert(toks(8) + [200] * 4, K(12, name="b"))
    ix.insert(toks(8) + [100] * 4, K(12, name="a"))
    assert ix.entries() == 2
    for _ in range(3):
        hit = ix.lookup(toks(10) + [5])
        assert (hit.len, hit.key) == (8, tuple(toks(8) + [100] * 4))
        hit.release()


def test_a_stateful_entry_is_usable_only_at_its_own_length():
    ix = Prefix(UNIT)
    ix.insert(toks(8), K(8, True))
    for prompt, want in ((toks(9), 8), (toks(12), 8), (toks(8), None), (toks(6) + [1, 1, 1], None)):
        hit = ix.lookup(prompt)
        assert (hit.len if hit else None) == want, prompt
        if hit:
            hit.release()


def accept(store):
    return K(store.tokens, store.has_slot, "host")


def test_parked_after_resident_a_hit_outlives_eviction_and_a_host_copy_is_reused():
    ix = Prefix(UNIT)
    ix.insert(toks(8) + [1], K(9, name="a"))
    assert ix.evict(accept) == Evicted(tuple(toks(8) + [1]), True, 0)
    hit = ix.lookup(toks(8) + [3, 0])
    assert (hit.len, hit.tier) == (8, Tier.HOST)
    hit.release()
    ix.insert(toks(8) + [2], K(9, name="b"))
    hit = ix.lookup(toks(8) + [3, 0])
    assert (hit.len, hit.tier, hit.key[-1]) == (8, Tier.DEVICE, 2)
    # the hit holds its store whatever is evicted
    while ix.evict() is not None:
        pass
    assert hit.store.live and hit.store.holders[0] == 1
    hit.release()
    assert hit.store.holders[0] == 0
    # parked, made resident again, evicted: no second copy
    ix.clear()
    calls = []
    ix.insert(toks(5), K(5))
    ix.evict(lambda s: calls.append(s) or accept(s))
    ix.insert(toks(5), K(5))
    assert ix.count(Tier.DEVICE) == 1 and ix.count(Tier.HOST) == 0
    assert ix.evict(lambda s: calls.append(s) or accept(s)) == Evicted(tuple(toks(5)), True, 0)
    assert len(calls) == 1


def test_a_stateful_park_keeps_its_slot():
    ix = Prefix(UNIT)
    ix.insert(toks(6), K(6, True))
    ix.evict(accept)
    hit = ix.lookup(toks(7))
    assert (hit.len, hit.tier, hit.store.has_slot) == (6, Tier.HOST, True)


def test_a_full_host_drops_its_coldest():
    p, h, ix = Pool(PAGED4, 4, 16, 0), Host(16, 4, 4, 8), Prefix(UNIT)

    def park(cp):
        got = h.park(cp)
        return got if isinstance(got, Denied) else got[0]

    def snap(key):
        cp = p.retire(p.lease(len(key)), len(key))
        ix.insert(key, cp)

    snap([1] * 8)
    assert ix.evict(park) == Evicted((1,) * 8, True, 0)
    snap([2] * 12)
    assert ix.evict(park) == Evicted((2,) * 12, True, 1)
    snap([3] * 20)
    assert ix.evict(park) == Evicted((3,) * 20, False, 1)
    assert ix.entries() == 0 and p.used == 0 and h.used() == 0


def test_a_failing_copy_removes_the_entry_and_propagates():
    ix = Prefix(UNIT)
    ix.insert(toks(4), K(4))

    def broken(store):
        raise OSError("copy failed")

    with pytest.raises(OSError, match="copy failed"):
        ix.evict(broken)
    assert ix.entries() == 0


def test_a_lookup_that_uses_nothing_touches_nothing():
    ix = Prefix(UNIT)
    ix.insert(toks(8), K(8))
    ix.insert([5] * 8, K(8))
    # shares 2 tokens with the older entry: less than a page, so not a hit, and not a touch
    assert ix.lookup(toks(2) + [99] * 6) is None
    assert ix.evict().key == tuple(toks(8))


# the brute-force model


class Model:
    """What the index should hold, learning tiers only from what `evict` reports."""

    def __init__(self, mode: str) -> None:
        self.mode = mode
        # key -> [resident, slot, has_host]
        self.entries: dict[tuple, list] = {}

    def insert(self, key: tuple, slot: bool) -> None:
        e = self.entries.get(key)
        if e is None:
            self.entries[key] = [True, slot, False]
        else:
            e[0] = True
        old = self.entries.get(key[:-UNIT])
        if not slot and len(key) > UNIT and len(key) % UNIT == 0 and old and not old[1] and old[0] and not old[2]:
            del self.entries[key[:-UNIT]]

    def lookup(self, prompt: tuple) -> tuple[int, Tier] | None:
        q = prompt[:-1]
        best = None
        for key, (resident, slot, _) in self.entries.items():
            if q[:len(key)] == key:
                n = len(key)
            elif slot:
                n = 0
            else:
                common = next((i for i, (a, b) in enumerate(zip(key, q)) if a != b), min(len(key), len(q)))
                n = common // UNIT * UNIT
            if n > 0 and (best is None or (n, resident) > best):
                best = (n, resident)
        return None if best is None else (best[0], Tier.DEVICE if best[1] else Tier.HOST)

    def evicted(self, got: Evicted | None, called: bool, gone: list) -> None:
        """`gone`: keys of host copies released during the call (the limited host's drops)."""
        resident = [k for k, e in self.entries.items() if e[0]]
        if got is None:
            assert not resident
            return
        e = self.entries[got.key]
        assert e[0], f"{got!r} of a parked entry"
        parked = [k for k, x in self.entries.items() if not x[0]]
        if self.mode == "limited":
            assert len(gone) == got.dropped and all(not self.entries[k][0] for k in gone), f"{got!r} {gone=}"
            for k in gone:
                del self.entries[k]
        if got.parked:
            assert self.mode in ("accept", "limited") or e[2], f"{got!r} without a host"
            assert self.mode == "limited" or got.dropped == 0
            assert called == (not e[2])
            e[0], e[2] = False, True
        else:
            if self.mode != "limited":
                assert got.dropped == (len(parked) if self.mode != "none" else 0), f"{got!r} {len(parked)=}"
                for k in parked if self.mode != "none" else ():
                    del self.entries[k]
            del self.entries[got.key]


class HostK(K):
    """A host copy that logs its key when released."""

    __slots__ = ("log",)

    def __init__(self, store: K, log: list) -> None:
        super().__init__(store.tokens, store.has_slot, store.name, store.holders)
        self.log = log

    def release(self) -> None:
        super().release()
        self.log.append(self.name)


def brute_force_run(mode: str, seed: int, steps: int) -> list:
    ix, model, r = Prefix(UNIT), Model(mode), Rand(seed)
    holders = [0]
    trace = []
    calls = []

    released: list = []

    def park(store):
        calls.append(store.tokens)
        if mode == "accept" or (mode == "limited" and store.tokens <= 8 and ix.count(Tier.HOST) < 3):
            return HostK(store, released)
        return Denied.HostFull

    for step in range(steps):
        roll = r.next(6)
        if roll in (0, 1):
            key = tuple(r.next(2) for _ in range(1 + r.next(12)))
            slot = sum(key) % 3 == 0
            if key in model.entries and model.entries[key][1] != slot:
                continue
            ix.insert(key, K(len(key), slot, key, holders))
            model.insert(key, slot)
            trace.append(("insert", key))
        elif roll in (2, 3):
            prompt = tuple(r.next(2) for _ in range(1 + r.next(14)))
            hit = ix.lookup(prompt)
            got = None if hit is None else (hit.len, hit.tier)
            assert got == model.lookup(prompt), f"{prompt=} {got=} {model.lookup(prompt)=}"
            if hit is not None:
                trace.append(("hit", hit.len, hit.tier, hit.key))
                hit.release()
        else:
            before = len(calls)
            released.clear()
            got = ix.evict(None if mode == "none" else park)
            model.evicted(got, len(calls) > before, [k for k in released if k != (got and got.key)])
            trace.append(("evict", got))
        assert ix.entries() == len(model.entries)
        assert ix.count(Tier.HOST) == sum(1 for e in model.entries.values() if not e[0])
        assert step % 8 or ix.items() == sorted((k, Tier.DEVICE if e[0] else Tier.HOST) for k, e in model.entries.items())
    ix.clear()
    assert holders[0] == 0, "every store the index held is released"
    return trace


@pytest.mark.parametrize("mode, seed", [
    ("accept", 0x9E3779B97F4A7C15), ("refuse", 0x2545F4914F6CDD1D), ("none", 0x123456789ABCDEF1),
    ("limited", 0x0DDB1A5E5BAD5EED),
])
def test_lookup_matches_the_brute_force_model(mode, seed):
    """`lookup` equals the brute-force maximum over entries of (usable length, resident first),
    entries and tiers as the model learns them only from `evict`'s reports (parked: resident and
    a host that accepts or a host copy already, nothing dropped; dropped: every parked entry went
    first when a host refused; with a host of three entries of at most 8 tokens, the drops are the host copies released
    during the call and are counted on both paths); counts agree after every step and every store
    is released."""
    brute_force_run(mode, seed, 4000)


def test_same_seed_same_trace():
    """Determinism: two runs with the same seed give identical traces."""
    assert brute_force_run("accept", 7, 1500) == brute_force_run("accept", 7, 1500)


def test_resident_stores_lists_exactly_the_device_copies():
    ix = Prefix(UNIT)
    a, b = K(8, name="a"), K(6, name="b")
    ix.insert(toks(8), a)
    ix.insert([5] * 6, b)
    assert ix.resident_stores() == [a, b]  # key order: toks(8) = [3, 10, ...] sorts before [5] * 6
    assert ix.evict(accept) == Evicted(tuple(toks(8)), True, 0)  # a is the colder: parked
    assert ix.resident_stores() == [b]
    assert ix.evict() == Evicted((5,) * 6, False, 0)
    assert ix.resident_stores() == []


def test_growth_in_place_equals_the_general_path():
    """Keys that are views of one buffer (a sequence checkpointed every page) take the in-place
    growth path; the same keys as fresh lists take the general one (leaf, growth removal, merge).
    Both indexes end with the same entries and tiers, answer every lookup the same, and evict in
    the same order."""
    from pool import Tokens

    r = Rand(0x51CE)
    fast, slow = Prefix(UNIT), General(UNIT)
    holders = [0]
    for _ in range(60):
        seq = [r.next(3) for _ in range(4 * UNIT + r.next(24))]
        packed = Tokens.of(seq)
        start = UNIT * (1 + r.next(3))
        for n in range(start, len(seq) // UNIT * UNIT + 1, UNIT):
            fast.insert(packed.prefix(n), K(n, holders=holders))
            slow.insert(seq[:n], K(n, holders=holders))
        probe = [r.next(3) for _ in range(1 + r.next(30))]
        _same_lookup(fast, slow, probe)
        if r.next(4) == 0:
            assert fast.evict(accept) == slow.evict(accept)
        assert fast.items() == slow.items()
    _drain_equal(fast, slow, holders)


def _same_lookup(fast, slow, probe) -> None:
    """Both indexes find the same hit (length, tier, key) for `probe`; the hits are released."""
    a, b = fast.lookup(probe), slow.lookup(probe)
    assert (a and (a.len, a.tier, a.key)) == (b and (b.len, b.tier, b.key)), probe
    for h in (a, b):
        if h:
            h.release()


def _drain_equal(fast, slow, holders) -> None:
    """Both indexes evict the same entries in the same order to the end, and every holder is let go."""
    while True:
        x, y = fast.evict(), slow.evict()
        assert x == y
        if x is None:
            break
    fast.clear()
    slow.clear()
    assert holders[0] == 0


class General(Prefix):
    """The index with both in-place growth paths off: every insert takes the general path (a leaf,
    the growth rule's removal, the merge)."""

    def _grow(self, key, store) -> bool:
        return False

    def _grow_found(self, key, store) -> bool:
        return False


def test_interleaved_sequences_grown_in_place_equal_the_general_path():
    """Several sequences checkpointed a page at a time in turns, each key packed afresh (as a server's
    checkpoints are), some sharing their first pages (so a shorter entry may have children), some
    checkpointing a partial length or skipping a page, with lookups, evictions and parks between:
    the index that grows entries in place ends with the same entries and tiers, answers every
    lookup the same and evicts in the same order as the general path."""
    from pool import Tokens

    r = Rand(0x1EAF)
    fast, slow = Prefix(UNIT), General(UNIT)
    holders = [0]
    for _ in range(30):
        shared = [r.next(3) for _ in range(UNIT * r.next(3))]
        seqs = [shared + [r.next(3) for _ in range(6 * UNIT)] for _ in range(2 + r.next(4))]
        marks = [UNIT * (1 + r.next(2)) for _ in seqs]
        for _ in range(8 * len(seqs)):
            i = r.next(len(seqs))
            n = marks[i] + (UNIT if r.next(5) else 2 * UNIT)  # now and then a page skipped
            if r.next(9) == 0:
                n -= 1  # a partial length: never grown in place
            if n > len(seqs[i]):
                continue
            marks[i] = max(marks[i], n // UNIT * UNIT)
            fast.insert(Tokens.of(seqs[i][:n]), K(n, holders=holders))
            slow.insert(seqs[i][:n], K(n, holders=holders))
            if r.next(6) == 0:
                probe = seqs[r.next(len(seqs))][: 1 + r.next(6 * UNIT)] + [r.next(3)]
                _same_lookup(fast, slow, probe)
            if r.next(7) == 0:
                assert fast.evict(accept) == slow.evict(accept)
            assert fast.items() == slow.items()
    _drain_equal(fast, slow, holders)
