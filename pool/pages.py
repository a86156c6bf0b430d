"""The device tier: pages and slots drawn from one budget of chunks, handed out as leases.

Whole pages are shared, a partial page is copied for its new holder, and only a lease writes.
`take` is the only allocator: all or nothing, lowest free ids first, and when the kind asked for is
short it plans a `Remap` (unmake free objects of the other kind, make the missing ones) and answers
`Remapping` until the runtime has landed the plan.
"""

from __future__ import annotations

from pool.chunks import PAGE, SLOT, Arena, Chunks, Remap
from pool.denied import Denied, PoolError
from pool.geometry import Geometry
from pool.lease import Checkpoint, Lease
from pool.objects import ABSENT, ARRIVING, FREE, HELD, LEAVING, Objects
from pool.store import Copies, Node, Slot

__all__ = ["Pool"]

_len = len  # `checkpoint` and `restore` take a parameter named len


class Pool:
    """Pages and slots over `chunks` chunks of `chunk` bytes.

    `Pool(geometry, chunk, chunks, first_slots, tokens=None)` lays out slots 0..first_slots (slot 0
    is the null line, never leased) and then pages while chunks remain, at most `tokens // unit` of
    them when `tokens` is given. The initial plan is `pool.initial`, already counted as landed.
    """

    def __init__(self, geometry: Geometry, chunk: int, chunks: int, first_slots: int, tokens: int | None = None) -> None:
        self.geometry = geometry
        self.unit = geometry.unit
        self._row_pages = geometry.row_tokens // self.unit  # the geometry is frozen
        self.chunk = chunk
        self.chunks = chunks
        budget = chunk * chunks
        page_size, slot_size = geometry.page_size, geometry.slot_size
        self.pages_max = budget // page_size if page_size else 0
        if tokens is not None:
            self.pages_max = min(self.pages_max, tokens // self.unit)
        self.slots_max = budget // slot_size if slot_size else 0
        self.has_slots = geometry.has_slots
        arenas = [Arena(s, PAGE, b, self.pages_max, chunk) for s, b in sorted(geometry.page_bytes.items())]
        arenas += [Arena(s, SLOT, b, self.slots_max, chunk) for s, b in sorted(geometry.slot_bytes.items())]
        self.arenas = arenas
        self._chunks = Chunks(arenas, chunks)
        self._pages = Objects(self.pages_max)
        self._slots = Objects(self.slots_max)
        self._pending: Remap | None = None
        self._in_flight: Remap | None = None
        self.remapped = False
        self.remaps = 0
        self.pad: Lease | None = None
        self._pad_pages = 0
        self._pad_slots = 0
        # tallies for stats, never scans
        self._leases = 0
        self._sealed = 0
        self._stored_slots = 0
        self.initial = self._lay_out(first_slots)

    @classmethod
    def new(cls, geometry: Geometry, chunk: int, chunks: int, first_slots: int,
            tokens: int | None = None) -> tuple[Pool, Remap]:
        pool = cls(geometry, chunk, chunks, first_slots, tokens)
        return pool, pool.initial

    def __repr__(self) -> str:
        return (f"Pool(unit={self.unit}, total={self.total}, used={self.used}, "
                f"slots={self.slots}, slots_used={self.slots_used})")

    def _lay_out(self, first_slots: int) -> Remap:
        plan = Remap()
        table = self._chunks
        if self.has_slots:
            n = max(first_slots, 1)
            for s in range(n):
                if s >= self.slots_max or table.cost(SLOT, s) > len(table.free):
                    raise PoolError(f"{self.chunks} chunks of {self.chunk} bytes cannot hold {n} sequence slots")
                table.make(SLOT, s, plan)
                self._slots.set(s, HELD if s == 0 else FREE)
        # pages 0..k-1 at once: k is the most whose new positions the free chunks cover
        k = table.fit_first(PAGE, self.pages_max)
        if k:
            table.make_first(PAGE, k, plan)
            self._pages.make_free(0, k)
        return plan

    # queries

    @property
    def total(self) -> int:
        """Pages made."""
        return self._pages.live

    @property
    def used(self) -> int:
        """Pages held."""
        return self._pages.held

    @property
    def slots(self) -> int:
        """Slots made, the null slot included."""
        return self._slots.live

    @property
    def slots_used(self) -> int:
        """Slots held, the null slot excluded."""
        return max(self._slots.held - 1, 0)

    @property
    def max_pages(self) -> int:
        """Pages one sequence may hold: a row, within the pool less the pad."""
        return min(self._row_pages, self.pages_max - self._pad_pages)

    @property
    def max_seq_tokens(self) -> int:
        return self.max_pages * self.unit

    @property
    def leases(self) -> int:
        """Live leases, the pad included."""
        return self._leases

    @property
    def sealed_pages(self) -> int:
        """Pages frozen in nodes: when no lease is live, exactly the snapshots' pages."""
        return self._sealed

    @property
    def stored_slots(self) -> int:
        """Slots held by stores (snapshots), not by leases."""
        return self._stored_slots

    def pages_for(self, tokens: int) -> int | Denied:
        n = -(-tokens // self.unit)
        return n if n <= self.max_pages else Denied.ExceedsRow(self.max_pages * self.unit)

    def _anything_held(self) -> bool:
        return self._pages.held > self._pad_pages or self._slots.held > 1 + self._pad_slots

    # remap hand-off

    def take_pending(self) -> Remap | None:
        """The planned remap, now in flight; the runtime executes it and calls `complete`."""
        plan, self._pending = self._pending, None
        if plan is not None:
            self._in_flight = plan
        return plan

    def complete(self, plan: Remap) -> None:
        assert plan is self._in_flight, "completing a remap that is not in flight"
        for kind, i in plan.made:
            (self._pages if kind == PAGE else self._slots).set(i, FREE)
        for kind, i in plan.unmade:
            (self._pages if kind == PAGE else self._slots).set(i, ABSENT)
        self._in_flight = None

    # the allocator

    def _take(self, pages: int, slot: bool) -> tuple[list[int], Slot | None] | Denied:
        need_s = 1 if slot else 0
        if pages <= self._pages.idle and need_s <= self._slots.idle:
            got = self._pages.pop(pages)
            s = Slot(self._slots.pop(1)[0], self) if slot else None
            return got, s
        if self._pending is not None or self._in_flight is not None:
            return Denied.Remapping
        return self._rebalance(pages, need_s)

    def _rebalance(self, need_p: int, need_s: int) -> Denied:
        no_room = Denied.Busy if self._anything_held() else Denied.ExceedsPool
        short_p = max(0, need_p - self._pages.idle)
        short_s = max(0, need_s - self._slots.idle)
        targets = [(PAGE, i) for i in self._pages.absent(short_p, 0)]
        targets += [(SLOT, i) for i in self._slots.absent(short_s, 1)]
        if len(targets) < short_p + short_s:
            return no_room
        table = self._chunks.clone()
        cost = sum(table.cost(kind, i) for kind, i in targets)
        scratch = Remap()
        sources: list[tuple[str, int]] = []
        if short_p and not short_s:
            sources_kind, objs, spare = SLOT, self._slots, need_s
        elif short_s and not short_p:
            sources_kind, objs, spare = PAGE, self._pages, need_p
        else:
            sources_kind, objs, spare = None, None, 0
        if objs is not None:
            for i in objs.idle_desc()[:max(objs.idle - spare, 0)]:
                if len(table.free) >= cost:
                    break
                table.unmake(sources_kind, i, scratch)
                sources.append((sources_kind, i))
        if len(table.free) < cost:
            return no_room
        plan = Remap()
        for kind, i in sources:
            self._chunks.unmake(kind, i, plan)
            (self._pages if kind == PAGE else self._slots).set(i, LEAVING)
        for kind, i in targets:
            self._chunks.make(kind, i, plan)
            (self._pages if kind == PAGE else self._slots).set(i, ARRIVING)
        self._pending = plan
        self.remapped = True
        self.remaps += 1
        return Denied.Remapping

    # storage protocol: the last holder gives back

    def _give_page(self, page: int) -> None:
        self._pages.give(page)

    # what a lease tells its pool (pool/lease.py's Owner)

    def lease_made(self) -> None:
        self._leases += 1

    def sealed_more(self, pages: int) -> None:
        self._sealed += pages

    def lease_released(self, own: list[int]) -> None:
        """A lease let go: its own (unsealed) pages come back."""
        self._leases -= 1
        if own:
            self._give_pages(own)

    def _give_pages(self, pages: list[int]) -> None:
        self._pages.give_many(pages)

    def _give_node(self, node: Node) -> None:
        self._sealed -= len(node.pages)
        self._pages.give_many(node.pages)

    def _give_slot(self, slot: Slot) -> None:
        if slot.stored:
            self._stored_slots -= 1
        self._slots.give(slot.id)

    def _stored(self, slot: Slot | None) -> Slot | None:
        if slot is not None and not slot.stored:
            slot.stored = True
            self._stored_slots += 1
        return slot

    # operations

    def lease(self, tokens: int) -> Lease | Denied:
        """Fresh pages for `tokens` tokens and a slot; the runtime zeroes the slot."""
        if tokens < 1:
            raise PoolError(f"leasing {tokens} tokens")
        need = self.pages_for(tokens)
        if isinstance(need, Denied):
            return need
        got = self._take(need, self.has_slots)
        if isinstance(got, Denied):
            return got
        pages, slot = got
        return Lease(self, None, pages, slot, 0)

    def lease_slot(self) -> Lease | Denied:
        """A slot and no pages (a peer rank's share of a sequence)."""
        assert self.has_slots, "lease_slot without per-sequence states"
        got = self._take(0, True)
        if isinstance(got, Denied):
            return got
        return Lease(self, None, [], got[1], 0)

    def lease_pad(self) -> Lease | Denied:
        """The padding cell's page and slot, leased once; `max_seq_tokens` is net of it."""
        assert self.pad is None, "the pad is leased once"
        pad = self.lease(self.unit)
        if isinstance(pad, Lease):
            self.pad = pad
            self._pad_pages = 1
            self._pad_slots = 1 if self.has_slots else 0
        return pad

    def checkpoint(self, lease: Lease, len: int) -> tuple[Checkpoint, Copies] | Denied:
        """Freeze the first `len` tokens: whole pages sealed and shared, the partial page and the
        slot copied. The lease keeps writing its own partial page."""
        if not lease._live:
            lease._check()
        unit, pages = self.unit, lease.pages
        if pages and not 1 <= len <= _len(pages) * unit:
            raise PoolError(f"checkpoint at {len} is past the lease ({lease.tokens} tokens)")
        if len < 1:
            raise PoolError(f"checkpoint at {len}")
        full = len // unit if pages else 0
        partial = bool(pages) and len % unit != 0
        if partial or lease._slot is not None:
            got = self._take(1 if partial else 0, lease._slot is not None)
            if isinstance(got, Denied):
                return got
            fresh, slot = got
        else:
            fresh, slot = None, None  # what _take(0, False) gives: nothing, never refused
        copies = Copies()
        lease._share(full)
        tip = lease._held_at(full)
        if partial:
            tip = Node([fresh[0]], tip, self)
            self._sealed += 1
            copies.pages.append((lease.pages[full], fresh[0]))
        if slot is not None:
            copies.slot = (lease._slot.id, slot.id)
            slot = self._stored(slot)
        return Checkpoint(len, tip, slot), copies

    def retire(self, lease: Lease, len: int) -> Checkpoint:
        """Seal the first `len` tokens in place (the partial page too: its writer is gone), move the
        slot, and give back the pages past them. Never fails."""
        lease._check()
        if lease.pages and not 1 <= len <= lease.tokens:
            raise PoolError(f"retiring at {len}, past the lease ({lease.tokens} tokens)")
        if len < 1:
            raise PoolError(f"retiring at {len}")
        n = -(-len // self.unit) if lease.pages else 0
        lease._share(n)
        tip = lease._held_at(n)
        slot, lease._slot = lease._slot, None
        lease.release()
        return Checkpoint(len, tip, self._stored(slot))

    def _check_restore(self, what: str, tokens_of: int, has_slot: bool, paged: bool, len: int, tokens: int) -> None:
        ok = len == tokens_of or (paged and not has_slot and 1 <= len < tokens_of and len % self.unit == 0)
        if not ok:
            with_slot = " (with a slot)" if has_slot else ""
            raise PoolError(f"restoring {len} tokens of a {what}of {tokens_of}{with_slot}")
        if paged and tokens <= len:
            raise PoolError(f"restoring {len} tokens into a lease of {tokens}")

    def restore(self, cp: Checkpoint, len: int, tokens: int) -> tuple[Lease, Copies] | Denied:
        """A new lease of `tokens` tokens whose first `len` are `cp`'s: whole pages shared, the
        partial page and the slot copied."""
        if not cp.live:
            raise PoolError("restoring a released checkpoint")
        paged = cp.pages > 0
        self._check_restore("checkpoint ", cp.tokens, cp.has_slot, paged, len, tokens)
        if not paged:
            got = self._take(0, True)
            if isinstance(got, Denied):
                return got
            return Lease(self, None, [], got[1], len), Copies(slot=(cp.seq_slot(), got[1].id))
        need = self.pages_for(tokens)
        if isinstance(need, Denied):
            return need
        full = len // self.unit
        got = self._take(need - full, cp.has_slot)
        if isinstance(got, Denied):
            return got
        fresh, slot = got
        chain = cp._tip.ancestor(full)
        chain = chain.hold() if chain is not None else None
        copies = Copies()
        if len % self.unit:
            copies.pages.append((cp._tip.page, fresh[0]))
        if slot is not None:
            copies.slot = (cp.seq_slot(), slot.id)
        lease = Lease(self, chain, [], slot, len)
        lease.pages = lease._chain_pages() + fresh
        return lease, copies

    def fork(self, parent: Lease, len: int, tokens: int) -> tuple[Lease, Copies] | Denied:
        """A new lease of `tokens` tokens starting from the parent's first `len` (sealing the
        parent's whole pages below `len`)."""
        parent._check()
        if not parent.pages:
            got = self._take(0, True)
            if isinstance(got, Denied):
                return got
            return Lease(self, None, [], got[1], len), Copies(slot=(parent.slot, got[1].id))
        if not 1 <= len <= parent.tokens:
            raise PoolError(f"forking at {len}, past the lease ({parent.tokens} tokens)")
        if tokens <= len:
            raise PoolError(f"forking {len} tokens into a lease of {tokens}")
        need = self.pages_for(tokens)
        if isinstance(need, Denied):
            return need
        full = len // self.unit
        got = self._take(need - full, parent._slot is not None)
        if isinstance(got, Denied):
            return got
        fresh, slot = got
        parent._share(full)
        copies = Copies()
        if len % self.unit:
            copies.pages.append((parent.pages[full], fresh[0]))
        if slot is not None:
            copies.slot = (parent.slot, slot.id)
        lease = Lease(self, parent._held_at(full), parent.pages[:full] + fresh, slot, len)
        return lease, copies
