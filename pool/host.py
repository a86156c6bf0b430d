"""The host tier: a byte allocator over pinned memory, `park` and `restore`.

Pages come from the low end (first fit), slots from the high end, and frees coalesce with both
neighbours. `park` copies only device nodes without a live twin (a twin holds the same bytes because
pages are frozen); `restore` wakes a parked store straight into a new lease with one allocation,
its whole pages born twinned, so parking the same session again copies only its new pages.
"""

from __future__ import annotations

import bisect

from pool.denied import Denied, PoolError
from pool.lease import Checkpoint, Lease
from pool.pages import Pool
from pool.store import Copies, Node, Slot, Store, chain_pages, release_chain

__all__ = ["Host", "Parked", "runs"]

_len = len  # `restore` takes a parameter named len


class Parked(Store):
    """A host-tier `Store`: pages and maybe a slot at host byte offsets."""

    __slots__ = ()

    def offsets(self) -> list[int]:
        """Host byte offsets of the pages, from the root."""
        return self.page_ids()


class Host:
    """`bytes` of host memory in `grain`-byte units; a page takes `page_bytes`, a slot `slot_bytes`."""

    def __init__(self, bytes: int, grain: int, page_bytes: int, slot_bytes: int) -> None:
        assert grain > 0, f"{grain=}"
        self.grain = grain
        self.units = bytes // grain
        self.page_bytes = page_bytes
        self.slot_bytes = slot_bytes
        self._page_units = max(1, -(-page_bytes // grain))
        self._slot_units = max(1, -(-slot_bytes // grain))
        # free runs: start -> length, in grains; starts kept sorted
        self._runs: dict[int, int] = {0: self.units} if self.units else {}
        self._starts: list[int] = [0] if self.units else []
        self._free = self.units
        self.parks = 0

    def __repr__(self) -> str:
        return f"Host(bytes={self.units * self.grain}, grain={self.grain}, used={self.used()})"

    @property
    def page_stride(self) -> int:
        """Bytes between consecutive host pages: a page rounded up to whole grains."""
        return self._page_units * self.grain

    def used(self) -> int:
        """Bytes held by parked stores."""
        return (self.units - self._free) * self.grain

    def free_runs(self) -> list[tuple[int, int]]:
        """(offset, bytes) of every free run, lowest first."""
        return [(s * self.grain, self._runs[s] * self.grain) for s in self._starts]

    # allocator

    def _cut(self, start: int, at: int, n: int) -> None:
        length = self._runs.pop(start)
        i = bisect.bisect_left(self._starts, start)
        del self._starts[i]
        if at > start:
            self._put(start, at - start)
        if at + n < start + length:
            self._put(at + n, start + length - at - n)
        self._free -= n

    def _put(self, start: int, length: int) -> None:
        self._runs[start] = length
        bisect.insort(self._starts, start)

    def _low(self, n: int) -> int | None:
        for s in self._starts:
            if self._runs[s] >= n:
                self._cut(s, s, n)
                return s * self.grain
        return None

    def _low_pages(self, k: int) -> list[int] | None:
        """Offsets of `k` pages, each where `_low` would put it one after another (first fit,
        consecutive in a run while it lasts); None, taking nothing, if they do not all fit."""
        pu = self._page_units
        plan: list[tuple[int, int]] = []
        left = k
        for s in self._starts:
            fit = self._runs[s] // pu
            if fit:
                take = min(fit, left)
                plan.append((s, take))
                left -= take
                if not left:
                    break
        if left:
            return None
        out: list[int] = []
        for s, take in plan:
            self._cut(s, s, take * pu)
            out.extend(range(s * self.grain, (s + take * pu) * self.grain, pu * self.grain))
        return out

    def _high(self, n: int) -> int | None:
        for s in reversed(self._starts):
            length = self._runs[s]
            if length >= n:
                self._cut(s, s + length - n, n)
                return (s + length - n) * self.grain
        return None

    def _give(self, offset: int, n: int) -> None:
        start = offset // self.grain
        self._free += n
        i = bisect.bisect_left(self._starts, start)
        # coalesce with the run after, then the run before
        if i < len(self._starts) and self._starts[i] == start + n:
            n += self._runs.pop(self._starts[i])
            del self._starts[i]
        if i > 0 and self._starts[i - 1] + self._runs[self._starts[i - 1]] == start:
            self._runs[self._starts[i - 1]] += n
        else:
            self._put(start, n)
        assert self._free <= self.units, f"{self._free=} {self.units=}"

    def _give_node(self, node: Node) -> None:
        pages, stride = node.pages, self._page_units * self.grain
        lo, hi = min(pages), max(pages)
        if hi - lo == (len(pages) - 1) * stride:
            # distinct offsets one page apart filling [lo, hi]: one block
            self._give(lo, len(pages) * self._page_units)
        else:
            # one give per run of consecutive offsets
            start = prev = pages[0]
            for offset in pages[1:]:
                if offset != prev + stride:
                    self._give(start, (prev - start) // stride * self._page_units + self._page_units)
                    start = offset
                prev = offset
            self._give(start, (prev - start) // stride * self._page_units + self._page_units)

    def _give_slot(self, slot: Slot) -> None:
        self._give(slot.id, self._slot_units)

    # operations

    def park(self, cp: Checkpoint) -> tuple[Parked, Copies] | Denied:
        """A host copy of `cp`. Nodes with a live twin cost nothing; HostFull keeps nothing."""
        if not cp.live:
            raise PoolError("parking a released checkpoint")
        copies = Copies()
        tip: Node | None = None
        fresh = False
        node = cp._tip
        while node is not None:  # runs whose host twin a wake cut since are cut alike (`Node.match_twin`)
            node.match_twin()
            node = node.parent
        for node in cp._nodes():
            twin = None if fresh else node.live_twin()
            if twin is not None:
                assert twin.parent is tip, "live twins form a prefix of the chain"
                twin.hold()
                release_chain(tip)
                tip = twin
                continue
            fresh = True
            offsets = self._low_pages(len(node.pages))
            if offsets is None:
                release_chain(tip)
                return Denied.HostFull
            tip = Node(offsets, tip, self)
            node.twin = tip
            copies.pages.extend(zip(node.pages, offsets))
        slot = None
        if cp.has_slot:
            offset = self._high(self._slot_units)
            if offset is None:
                release_chain(tip)
                return Denied.HostFull
            slot = Slot(offset, self, stored=True)
            copies.slot = (cp.seq_slot(), offset)
        self.parks += 1
        return Parked(cp.tokens, tip, slot), copies

    def restore(self, parked: Parked, pool: Pool, len: int, tokens: int) -> tuple[Lease, Copies] | Denied:
        """Wake the first `len` tokens of `parked` into a new lease of `tokens` tokens, with one
        `pool` allocation. The parked store stays where it is."""
        if not parked.live:
            raise PoolError("restoring a released parked checkpoint")
        paged = parked.pages > 0
        pool._check_restore("parked checkpoint ", parked.tokens, parked.has_slot, paged, len, tokens)
        if not paged:
            got = pool._take(0, True)
            if isinstance(got, Denied):
                return got
            return Lease(pool, None, [], got[1], len), Copies(slot=(parked.seq_slot(), got[1].id))
        need = pool.pages_for(tokens)
        if isinstance(need, Denied):
            return need
        got = pool._take(need, parked.has_slot)
        if isinstance(got, Denied):
            return got
        fresh, slot = got
        nodes = parked._nodes()
        unit = pool.unit
        offsets = chain_pages(parked._tip)
        copies = Copies(pages=list(zip(offsets[:-(-len // unit)], fresh)))
        if slot is not None:
            copies.slot = (parked.seq_slot(), slot.id)
        # whole pages woken run for run, each twinned to the host run it copies
        chain: Node | None = None
        whole, at = len // unit, 0
        for node in nodes:
            if at >= whole:
                break
            n = min(_len(node.pages), whole - at)
            if n < _len(node.pages):
                # the woken part ends inside this host run: cut it there, so the twin is exact
                node._split(n)
                node = node.parent
            chain = Node(fresh[at:at + n], chain, pool)
            chain.twin = node
            at += n
        pool._sealed += whole
        return Lease(pool, chain, fresh, slot, len), copies


def runs(pairs: list[tuple[int, int]], src_step: int = 1, dst_step: int = 1) -> list[tuple[int, int, int]]:
    """Fold consecutive (src, dst) pairs into (first_src, first_dst, count) runs.

    A pair continues a run when both src and dst advance by one step: 1 for page ids, the page's
    bytes for host offsets (e.g. `runs(copies.pages, 1, page_bytes)` for a park).
    """
    out: list[tuple[int, int, int]] = []
    for src, dst in pairs:
        if out:
            s0, d0, n = out[-1]
            if src == s0 + n * src_step and dst == d0 + n * dst_step:
                out[-1] = (s0, d0, n + 1)
                continue
        out.append((src, dst, 1))
    return out
