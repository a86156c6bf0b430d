"""The prefix index: a token-keyed radix tree of snapshots, with per-tier recency by a logical tick.

Edges are token runs; the tree only finds, so it may branch at any token while a page is never split
(restores share whole pages and copy the partial one). An entry holds a resident store (device tier),
a parked store (host tier), or both; its tier is resident while it has a device copy.

Stores are duck-typed: anything with `tokens`, `has_slot`, `clone()` and `release()`.
"""

from __future__ import annotations

import enum
import heapq
from dataclasses import dataclass
from typing import Any, Callable

from pool.denied import Denied, PoolError

__all__ = ["Evicted", "Hit", "Prefix", "Tier"]


class Tier(str, enum.Enum):
    """Where a hit's store lives."""

    DEVICE = "device"
    """Resident: a device checkpoint."""
    HOST = "host"
    """Parked: a host copy."""

    def __repr__(self) -> str:
        return f"Tier.{self.name}"


class Hit:
    """A usable prefix of `len` tokens and a held clone of the store it comes from.

    It stays valid whatever the index does later; `release()` lets go of the store.
    """

    __slots__ = ("len", "tier", "store", "key")

    def __init__(self, len: int, tier: Tier, store: Any, key: tuple[int, ...]) -> None:
        self.len = len
        self.tier = tier
        self.store = store
        self.key = key

    def __repr__(self) -> str:
        return f"Hit(len={self.len}, tier={self.tier!r}, key={self.key!r})"

    def release(self) -> None:
        self.store.release()


@dataclass(frozen=True, slots=True)
class Evicted:
    """Which entry `evict` took (parked, or dropped) and how many parked entries went for room."""

    key: tuple[int, ...]
    parked: bool
    dropped: int


class _Entry:
    __slots__ = ("key", "device", "host", "slot", "used", "node")

    def __init__(self, key: tuple[int, ...], device: Any, slot: bool, node: _Node) -> None:
        self.key = key
        self.device = device
        self.host: Any = None
        self.slot = slot
        self.used = 0
        self.node = node

    @property
    def tier(self) -> Tier:
        return Tier.DEVICE if self.device is not None else Tier.HOST


class _Node:
    __slots__ = ("edge", "children", "parent", "depth", "entry", "paged_below", "resident_below")

    def __init__(self, edge: tuple[int, ...], parent: _Node | None, depth: int) -> None:
        self.edge = edge
        self.children: dict[int, _Node] = {}
        self.parent = parent
        self.depth = depth
        self.entry: _Entry | None = None
        # stateless entries in this subtree, this node's included; and those of them resident
        self.paged_below = 0
        self.resident_below = 0

    def ordered(self) -> list[_Node]:
        return [self.children[t] for t in sorted(self.children)]


def _common(edge: tuple[int, ...], q: tuple[int, ...], at: int) -> int:
    n = min(len(edge), len(q) - at)
    i = 0
    while i < n and edge[i] == q[at + i]:
        i += 1
    return i


class Prefix:
    """The radix index over snapshots of `unit`-token pages."""

    def __init__(self, unit: int) -> None:
        self.unit = unit
        self._root = _Node((), None, 0)
        self._entries: dict[tuple[int, ...], _Entry] = {}
        self._clock = 0
        self._lru: dict[Tier, list[tuple[int, tuple[int, ...]]]] = {Tier.DEVICE: [], Tier.HOST: []}
        self._count = {Tier.DEVICE: 0, Tier.HOST: 0}

    def __repr__(self) -> str:
        return f"Prefix(unit={self.unit}, resident={self.count(Tier.DEVICE)}, parked={self.count(Tier.HOST)})"

    # queries

    def entries(self) -> int:
        return len(self._entries)

    def count(self, tier: Tier) -> int:
        return self._count[tier]

    def items(self) -> list[tuple[tuple[int, ...], Tier]]:
        """Every entry's key and tier, in key order (a scan: for tests and /stats)."""
        return sorted((k, e.tier) for k, e in self._entries.items())

    def resident_stores(self) -> list:
        """The device stores the entries hold, in key order (a scan: for /stats' snapshot gauges)."""
        return [self._entries[k].device for k in sorted(self._entries) if self._entries[k].device is not None]

    def parked_lengths(self) -> list[int]:
        return sorted(len(k) for k, e in self._entries.items() if e.device is None)

    # recency

    def _stamp(self, e: _Entry, tick: int) -> None:
        e.used = tick
        heap = self._lru[e.tier]
        heapq.heappush(heap, (tick, e.key))
        if len(heap) > 4 * self._count[e.tier] + 64:
            tier = e.tier
            self._lru[tier] = [(x.used, k) for k, x in self._entries.items() if x.tier == tier]
            heapq.heapify(self._lru[tier])

    def _coldest(self, tier: Tier) -> tuple[int, ...] | None:
        heap = self._lru[tier]
        while heap:
            tick, key = heap[0]
            e = self._entries.get(key)
            if e is not None and e.used == tick and e.tier == tier:
                return key
            heapq.heappop(heap)
        return None

    # tree

    def _bump(self, node: _Node | None, paged: int, resident: int) -> None:
        while node is not None:
            node.paged_below += paged
            node.resident_below += resident
            node = node.parent

    def _node_for(self, key: tuple[int, ...]) -> _Node:
        node, d = self._root, 0
        while d < len(key):
            child = node.children.get(key[d])
            if child is None:
                leaf = _Node(key[d:], node, len(key))
                node.children[key[d]] = leaf
                return leaf
            c = _common(child.edge, key, d)
            if c < len(child.edge):
                # split: the head keeps the subtree's counts
                mid = _Node(child.edge[:c], node, node.depth + c)
                mid.paged_below, mid.resident_below = child.paged_below, child.resident_below
                child.edge = child.edge[c:]
                child.parent = mid
                mid.children[child.edge[0]] = child
                node.children[key[d]] = mid
                child = mid
            node, d = child, d + c
        return node

    def _remove(self, e: _Entry) -> None:
        del self._entries[e.key]
        self._count[e.tier] -= 1
        stateless = not e.slot
        self._bump(e.node, -stateless, -(stateless and e.device is not None))
        for store in (e.device, e.host):
            if store is not None:
                store.release()
        node = e.node
        node.entry = None
        # prune an empty leaf, merge a pass-through node into its only child
        while node.parent is not None and node.entry is None:
            parent = node.parent
            if not node.children:
                del parent.children[node.edge[0]]
                node = parent
                continue
            if len(node.children) == 1:
                (child,) = node.children.values()
                child.edge = node.edge + child.edge
                child.parent = parent
                parent.children[child.edge[0]] = child
            break

    def clear(self) -> None:
        """Remove every entry, releasing what the index holds."""
        for e in list(self._entries.values()):
            self._remove(e)

    # operations

    def insert(self, key, store: Any) -> None:
        """Index `store` under `key`; the index takes over the caller's hold on `store`.

        Internal updates: an existing entry is refreshed (and becomes resident if it was parked;
        the new store is released if it was resident already). A stateless whole-page key removes
        the entry one page shorter when that is stateless, resident and has no host copy, so a
        sequence checkpointed every page keeps one growing entry.
        """
        key = tuple(key)
        if not 1 <= len(key) == store.tokens:
            raise PoolError(f"inserting a store of {store.tokens} tokens under a key of {len(key)}")
        self._clock += 1
        e = self._entries.get(key)
        if e is not None:
            if e.slot != store.has_slot:
                raise PoolError(f"entry of {len(key)} tokens: has_slot {e.slot}, store {store.has_slot}")
            if e.device is None:
                e.device = store
                self._count[Tier.HOST] -= 1
                self._count[Tier.DEVICE] += 1
                self._bump(e.node, 0, int(not e.slot))
            else:
                store.release()
            self._stamp(e, self._clock)
        else:
            node = self._node_for(key)
            e = _Entry(key, store, store.has_slot, node)
            node.entry = e
            self._entries[key] = e
            self._count[Tier.DEVICE] += 1
            self._bump(node, int(not e.slot), int(not e.slot))
            self._stamp(e, self._clock)
        unit = self.unit
        if not e.slot and len(key) > unit and len(key) % unit == 0:
            old = self._entries.get(key[:-unit])
            if old is not None and not old.slot and old.device is not None and old.host is None:
                self._remove(old)

    def lookup(self, tokens) -> Hit | None:
        """The longest usable prefix of `tokens[:-1]` (the last token must still run).

        Internal updates: every entry offered is restamped (entries nearer the root warmer); a
        lookup that finds nothing touches nothing.
        """
        if len(tokens) == 0:
            return None
        q = tuple(tokens[:-1])
        node, d, nxt, c = self._root, 0, None, 0
        path = [node]
        while d < len(q):
            child = node.children.get(q[d])
            if child is None:
                break
            c = _common(child.edge, q, d)
            if c < len(child.edge):
                nxt = child
                break
            node, d = child, d + c
            path.append(node)
        matched = d + c if nxt is not None else d
        base = self._clock + len(q) + 2
        self._clock = base
        touched = 0
        # (len, resident, entry)
        offers: list[tuple[int, bool, _Entry]] = []
        for n in path:
            if n.entry is not None:
                self._stamp(n.entry, base - touched)
                touched += 1
                offers.append((n.depth, n.entry.device is not None, n.entry))
        pick = self._off_path(path, nxt, matched)
        if pick is not None:
            length, child, resident = pick
            e = self._descend(child, resident)
            self._stamp(e, base - touched)
            offers.append((length, resident, e))
        best = None
        for offer in offers:
            if offer[0] > 0 and (best is None or offer[:2] >= best[:2]):
                best = offer
        if best is None:
            return None
        length, resident, e = best
        store = (e.device if resident else e.host).clone()
        return Hit(length, Tier.DEVICE if resident else Tier.HOST, store, e.key)

    def _off_path(self, path: list[_Node], nxt: _Node | None, matched: int) -> tuple[int, _Node, bool] | None:
        """The off-path candidate sharing the most whole pages (resident at equal length, last wins)."""
        unit = self.unit
        cands: list[tuple[int, _Node, bool]] = []
        for i, n in enumerate(path):
            if n.depth < unit:
                continue
            avoid = path[i + 1] if i + 1 < len(path) else nxt
            kids = [k for k in n.ordered() if k is not avoid]
            pick = next((k for k in kids if k.resident_below > 0), None)
            if pick is None:
                pick = next((k for k in kids if k.paged_below > 0), None)
            if pick is not None:
                cands.append((n.depth, pick, pick.resident_below > 0))
        if nxt is not None and nxt.paged_below > 0 and matched >= unit:
            cands.append((matched, nxt, nxt.resident_below > 0))
        best = None
        for shared, child, resident in cands:
            k = (shared // unit * unit, resident)
            if best is None or k >= best[:2]:
                best = (k[0], resident, child)
        return None if best is None else (best[0], best[2], best[1])

    def _descend(self, node: _Node, resident: bool) -> _Entry:
        while True:
            e = node.entry
            if e is not None and not e.slot and (not resident or e.device is not None):
                return e
            node = next(k for k in node.ordered() if (k.resident_below if resident else k.paged_below) > 0)

    def evict(self, park: Callable[[Any], Any] | None = None) -> Evicted | None:
        """Take the coldest resident entry: park it (dropping the coldest parked entries while the
        host is full) or drop it. Returns None when nothing is resident.

        `park(store)` borrows the entry's device store and returns the host store it made (the
        index takes it over), or a `Denied` (or None) when the host is full. An exception from
        `park` removes the entry and propagates.
        """
        key = self._coldest(Tier.DEVICE)
        if key is None:
            return None
        e = self._entries[key]
        dropped = 0
        while park is not None:
            if e.host is None:
                try:
                    got = park(e.device)
                except BaseException:
                    self._remove(e)
                    raise
                if got is not None and not isinstance(got, Denied):
                    assert got.tokens == len(key), f"{got.tokens=} {len(key)=}"
                    e.host = got
            if e.host is not None:
                e.device.release()
                e.device = None
                self._count[Tier.DEVICE] -= 1
                self._count[Tier.HOST] += 1
                self._bump(e.node, 0, -int(not e.slot))
                # the same tick moves to the parked tier
                self._stamp(e, e.used)
                return Evicted(key, True, dropped)
            victim = self._coldest(Tier.HOST)
            if victim is None:
                break
            self._remove(self._entries[victim])
            dropped += 1
        self._remove(e)
        return Evicted(key, False, dropped)
