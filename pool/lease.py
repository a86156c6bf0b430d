"""The lease: the only writer of any page, into its own pages past what it has sealed."""

from __future__ import annotations

from typing import Any, Protocol

from pool.denied import PoolError
from pool.store import Node, Slot, Store, chain_pages, release_chain


class Owner(Protocol):
    """What a lease needs of the pool that made it (`pool.pages.Pool`, which imports this module: the
    lease names the seam instead of importing back)."""

    unit: int
    geometry: Any

    def lease_made(self) -> None: ...

    def sealed_more(self, pages: int) -> None: ...

    def lease_released(self, own: list[int]) -> None: ...

__all__ = ["Checkpoint", "Lease"]


class Checkpoint(Store):
    """A device-tier `Store`: frozen pages in the pool and maybe a slot."""

    __slots__ = ()


class Lease:
    """Pages in position order (sealed chain pages first, then its own) and a slot.

    Positions below `prefix` were restored, not written; pages below `shared` are sealed (frozen
    nodes others may hold). The lease writes only at or past both.
    """

    __slots__ = ("_pool", "_chain", "shared", "pages", "_slot", "prefix", "_live")

    def __init__(self, pool: Owner, chain: Node | None, pages: list[int], slot: Slot | None, prefix: int) -> None:
        self._pool = pool
        # held; its depth is `shared`
        self._chain = chain
        self.shared = chain.depth if chain is not None else 0
        self.pages = pages
        self._slot = slot
        self.prefix = prefix
        self._live = True
        pool.lease_made()

    def __repr__(self) -> str:
        return f"Lease(pages={self.pages}, slot={self.slot}, prefix={self.prefix}, shared={self.shared})"

    @property
    def unit(self) -> int:
        return self._pool.unit

    @property
    def tokens(self) -> int:
        return len(self.pages) * self._pool.unit

    @property
    def slot(self) -> int | None:
        """The sequence slot id, or None without per-sequence states."""
        return self._slot.id if self._slot is not None else None

    @property
    def shared_node(self) -> Node | None:
        """The tip of the shared chain this lease holds (None: it shares nothing): what a fault or a test
        reads to see the chain's holders (`Node.refs`)."""
        return self._chain

    @property
    def live(self) -> bool:
        return self._live

    def seq_slot(self) -> int | None:
        return self.slot

    def page_ids(self) -> list[int]:
        return list(self.pages)

    def slot_of(self, pos: int) -> int:
        """The token slot of position `pos`: page*unit + pos%unit, where the lease may write."""
        unit = self._pool.unit
        if pos < self.prefix:
            raise PoolError(f"position {pos} is inside the shared prefix ({self.prefix} tokens)")
        if pos < self.shared * unit:
            raise PoolError(f"position {pos} is inside a sealed page (sealed up to {self.shared * unit})")
        if pos >= len(self.pages) * unit:
            raise PoolError(f"position {pos} is past the lease ({len(self.pages) * unit} tokens)")
        return self.pages[pos // unit] * unit + pos % unit

    def slots(self, start: int, stop: int) -> list[int]:
        return [self.slot_of(p) for p in range(start, stop)]

    def row(self, table: str) -> list[int]:
        """The page-table row: unit/stride entries p*per_page+k per page, padded with the first."""
        try:
            _, width, stride = self._pool.geometry.page_table(table)
        except KeyError:
            raise PoolError(f"unknown page table {table!r}") from None
        per = self._pool.unit // stride
        out = [p * per + k for p in self.pages for k in range(per)]
        assert len(out) <= width, f"{len(out)=} {width=}"
        return out + [out[0] if out else 0] * (width - len(out))

    def seq_line(self, table: str, row: int) -> int:
        """Line `row` of this lease's slot in a line table: slot*per_slot + row."""
        try:
            _, lines, per_slot = self._pool.geometry.line_table(table)
        except KeyError:
            raise PoolError(f"unknown line table {table!r}") from None
        if row >= lines:
            raise PoolError(f"line {row} is past the table's {lines} lines")
        if self._slot is None:
            raise PoolError("the lease has no slot")
        return self._slot.id * per_slot + row

    # the pool's side

    def _check(self) -> None:
        if not self._live:
            raise PoolError("the lease is released")

    def _share(self, keep: int) -> None:
        """Seal own pages into one chain run until `shared >= keep`; they are never written again."""
        if self.shared < keep:
            tip = self._chain
            if tip is not None and tip.parent is not None:
                tip.absorb_parent()
            self._chain = Node(self.pages[self.shared:keep], tip, self._pool)
            self._pool.sealed_more(keep - self.shared)
            self.shared = keep

    def _held_at(self, depth: int) -> Node | None:
        """A new hold on the chain node at `depth` (already sealed)."""
        assert depth <= self.shared, f"{depth=} {self.shared=}"
        if depth == 0:
            return None
        node = self._chain
        if node.depth != depth:
            node = node.ancestor(depth)
        assert node.refs > 0, f"{node!r} is already released"
        node.refs += 1  # node.hold()
        return node

    def release(self) -> None:
        """Give back the own pages and let go of the chain and the slot."""
        self._check()
        self._live = False
        self._pool.lease_released(self.pages[self.shared:])
        release_chain(self._chain)
        self._chain = None
        if self._slot is not None:
            self._slot.release()
            self._slot = None

    def _chain_pages(self) -> list[int]:
        return chain_pages(self._chain)
