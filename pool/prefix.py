"""The prefix index: a token-keyed radix tree of snapshots, with per-tier recency by a logical tick.

Edges are token runs; the tree only finds, so it may branch at any token while a page is never split
(restores share whole pages and copy the partial one). An entry holds a resident store (device tier),
a parked store (host tier), or both; its tier is resident while it has a device copy.

Keys are packed (`pool.tokens.Tokens`, 4 big-endian bytes a token): a walk compares a whole edge
with one `bytes.startswith`, and finds where an edge and a prompt part by galloping over prefixes of
the edge (a logarithmic number of C-level compares), never a token at a time in Python. Entries are
found through the tree, never by hashing a whole key.

Stores are duck-typed: anything with `tokens`, `has_slot`, `clone()` and `release()`.
"""

from __future__ import annotations

import bisect
import enum
import heapq
from typing import Any, Callable

from pool.denied import Denied, PoolError
from pool.tokens import WIDTH, Tokens

__all__ = ["Evicted", "Hit", "Prefix", "Tier", "Tokens"]


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

    It stays valid whatever the index does later; `release()` lets go of the store. `key` (a tuple)
    names the entry the store comes from.
    """

    __slots__ = ("len", "tier", "store", "_key")

    def __init__(self, len: int, tier: Tier, store: Any, key) -> None:
        self.len = len
        self.tier = tier
        self.store = store
        self._key = key

    @property
    def key(self) -> tuple[int, ...]:
        k = self._key
        return k.totuple() if isinstance(k, Tokens) else tuple(k)

    def __repr__(self) -> str:
        return f"Hit(len={self.len}, tier={self.tier!r}, key={self.key!r})"

    def release(self) -> None:
        self.store.release()


class Evicted:
    """Which entry `evict` took (parked, or dropped) and how many parked entries went for room.

    `key` is the entry's key as a tuple (made on first use); `tokens` its length."""

    __slots__ = ("_key", "parked", "dropped")

    def __init__(self, key, parked: bool, dropped: int) -> None:
        self._key = key
        self.parked = parked
        self.dropped = dropped

    @property
    def key(self) -> tuple[int, ...]:
        k = self._key
        return k.totuple() if isinstance(k, Tokens) else tuple(k)

    @property
    def tokens(self) -> int:
        return len(self._key)

    def __eq__(self, other: object) -> bool:
        return (isinstance(other, Evicted) and (self.parked, self.dropped) == (other.parked, other.dropped)
                and self.key == other.key)

    def __hash__(self) -> int:
        return hash((self.key, self.parked, self.dropped))

    def __repr__(self) -> str:
        return f"Evicted(key={self.key!r}, parked={self.parked}, dropped={self.dropped})"


class _Entry:
    __slots__ = ("key", "device", "host", "slot", "used", "node")

    def __init__(self, key: Tokens, device: Any, slot: bool, node: _Node) -> None:
        self.key = key
        self.device = device
        self.host: Any = None
        self.slot = slot
        self.used = 0
        # None once removed
        self.node: _Node | None = node

    @property
    def tier(self) -> Tier:
        return Tier.DEVICE if self.device is not None else Tier.HOST


class _Node:
    """A node of the tree. Its edge is bytes `lo:hi` of `buf`, a key's packed buffer (zero-copy: the
    keys of one growing sequence share one buffer, and merging two nodes cut from it copies nothing)."""

    __slots__ = ("buf", "lo", "hi", "edge", "children", "parent", "depth", "entry", "paged_below",
                 "resident_below", "_keys")

    def __init__(self, buf: bytes, lo: int, hi: int, parent: _Node | None, depth: int) -> None:
        self.buf, self.lo, self.hi = buf, lo, hi
        self.edge = memoryview(buf)[lo:hi]
        # children keyed by their edge's first packed token
        self.children: dict[bytes, _Node] = {}
        self.parent = parent
        self.depth = depth
        self.entry: _Entry | None = None
        # stateless entries in this subtree, this node's included; and those of them resident
        self.paged_below = 0
        self.resident_below = 0
        # the children's keys in token order (packed keys sort as their tokens)
        self._keys: list[bytes] = []

    def first(self) -> bytes:
        return self.buf[self.lo:self.lo + WIDTH]

    def set_edge(self, buf: bytes, lo: int, hi: int) -> None:
        self.buf, self.lo, self.hi = buf, lo, hi
        self.edge = memoryview(buf)[lo:hi]

    def ordered(self) -> list[_Node]:
        kids = self.children
        return [kids[t] for t in self._keys]

    def put(self, child: _Node) -> None:
        t = child.first()
        if t not in self.children:
            bisect.insort(self._keys, t)
        self.children[t] = child

    def drop(self, child: _Node) -> None:
        t = child.first()
        del self.children[t]
        del self._keys[bisect.bisect_left(self._keys, t)]


def _common(edge, q: bytes, at: int, end: int) -> int:
    """Tokens `edge` shares with `q[at:end]`, given that the first token is shared: one compare
    when the whole edge matches, else a binary search over the edge's prefixes."""
    if q.startswith(edge, at, end):
        return len(edge) >> 2
    lo, hi = 1, min(len(edge), end - at) >> 2  # lo tokens shared; the answer is < hi+1
    if q.startswith(edge[: hi * WIDTH], at, end):
        return hi
    while hi - lo > 1:
        mid = (lo + hi) >> 1
        if q.startswith(edge[: mid * WIDTH], at, end):
            lo = mid
        else:
            hi = mid
    return lo


class Prefix:
    """The radix index over snapshots of `unit`-token pages."""

    def __init__(self, unit: int) -> None:
        self.unit = unit
        self._root = _Node(b"", 0, 0, None, 0)
        self._entries: set[_Entry] = set()
        self._clock = 0
        self._seq = 0
        # (tick, seq, entry): an entry counts only while its tick and tier are current
        self._lru: dict[Tier, list[tuple[int, int, _Entry]]] = {Tier.DEVICE: [], Tier.HOST: []}
        self._count = {Tier.DEVICE: 0, Tier.HOST: 0}
        # the entry inserted last (a growing sequence's, usually)
        self._last: _Entry | None = None

    def __repr__(self) -> str:
        return f"Prefix(unit={self.unit}, resident={self.count(Tier.DEVICE)}, parked={self.count(Tier.HOST)})"

    # queries

    def entries(self) -> int:
        return len(self._entries)

    def count(self, tier: Tier) -> int:
        return self._count[tier]

    def _sorted(self) -> list[_Entry]:
        return sorted(self._entries, key=lambda e: e.key.packed())

    def items(self) -> list[tuple[tuple[int, ...], Tier]]:
        """Every entry's key and tier, in key order (a scan: for tests and /stats)."""
        return [(e.key.totuple(), e.tier) for e in self._sorted()]

    def resident_stores(self) -> list:
        """The device stores the entries hold, in key order (a scan: for /stats' snapshot gauges)."""
        return [e.device for e in self._sorted() if e.device is not None]

    def parked_lengths(self) -> list[int]:
        return sorted(len(e.key) for e in self._entries if e.device is None)

    # recency

    def _stamp(self, e: _Entry, tick: int) -> None:
        e.used = tick
        tier = Tier.DEVICE if e.device is not None else Tier.HOST
        heap = self._lru[tier]
        seq = self._seq = self._seq + 1
        heapq.heappush(heap, (tick, seq, e))
        if len(heap) > 4 * self._count[tier] + 64:
            fresh = []
            for x in self._entries:
                if x.tier == tier:
                    self._seq += 1
                    fresh.append((x.used, self._seq, x))
            heapq.heapify(fresh)
            self._lru[tier] = fresh

    def _coldest(self, tier: Tier) -> _Entry | None:
        heap = self._lru[tier]
        device = tier is Tier.DEVICE
        while heap:
            tick, _, e = heap[0]
            if e.node is not None and e.used == tick and (e.device is not None) == device:
                return e
            heapq.heappop(heap)
        return None

    # tree

    @staticmethod
    def _bump(node: _Node | None, paged: int, resident: int) -> None:
        while node is not None:
            node.paged_below += paged
            node.resident_below += resident
            node = node.parent

    def _node_for(self, key: bytes, end: int) -> _Node:
        """The node spelling `key[:end]` (bytes), made (and an edge split) if need be."""
        node, at = self._root, 0
        while at < end:
            child = node.children.get(key[at:at + WIDTH])
            if child is None:
                leaf = _Node(key, at, end, node, end >> 2)
                node.put(leaf)
                return leaf
            c = _common(child.edge, key, at, end)
            if c * WIDTH < len(child.edge):
                # split: the head keeps the subtree's counts
                cut = child.lo + c * WIDTH
                mid = _Node(child.buf, child.lo, cut, node, node.depth + c)
                mid.paged_below, mid.resident_below = child.paged_below, child.resident_below
                node.drop(child)
                child.set_edge(child.buf, cut, child.hi)
                child.parent = mid
                mid.put(child)
                node.put(mid)
                child = mid
            node, at = child, at + c * WIDTH
        return node

    def _remove(self, e: _Entry) -> None:
        self._entries.discard(e)
        self._count[e.tier] -= 1
        stateless = not e.slot
        node = e.node
        self._bump(node, -stateless, -(stateless and e.device is not None))
        e.node = None
        for store in (e.device, e.host):
            if store is not None:
                store.release()
        node.entry = None
        # prune an empty leaf, merge a pass-through node into its only child
        while node.parent is not None and node.entry is None:
            parent = node.parent
            if not node.children:
                parent.drop(node)
                node = parent
                continue
            if len(node.children) == 1:
                (child,) = node.children.values()
                parent.drop(node)
                if child.buf is node.buf and child.lo == node.hi:
                    child.set_edge(node.buf, node.lo, child.hi)
                else:
                    child.set_edge(bytes(node.edge) + bytes(child.edge), 0, len(node.edge) + len(child.edge))
                child.parent = parent
                parent.put(child)
            break

    def clear(self) -> None:
        """Remove every entry, releasing what the index holds."""
        for e in list(self._entries):
            self._remove(e)

    # operations

    def insert(self, key, store: Any) -> None:
        """Index `store` under `key` (token ids, or `Tokens`); the index takes over the caller's
        hold on `store`.

        Internal updates: an existing entry is refreshed (and becomes resident if it was parked;
        the new store is released if it was resident already). A stateless whole-page key removes
        the entry one page shorter when that is stateless, resident and has no host copy, so a
        sequence checkpointed every page keeps one growing entry.
        """
        key = Tokens.of(key)
        n = len(key)
        if not 1 <= n == store.tokens:
            raise PoolError(f"inserting a store of {store.tokens} tokens under a key of {n}")
        self._clock += 1
        if self._grow(key, store):
            return
        node = self._node_for(key.data, n * WIDTH)
        e = node.entry
        if e is not None:
            if e.slot != store.has_slot:
                raise PoolError(f"entry of {n} tokens: has_slot {e.slot}, store {store.has_slot}")
            if e.device is None:
                e.device = store
                self._count[Tier.HOST] -= 1
                self._count[Tier.DEVICE] += 1
                self._bump(node, 0, int(not e.slot))
            else:
                store.release()
            self._stamp(e, self._clock)
        else:
            e = _Entry(key, store, store.has_slot, node)
            node.entry = e
            self._entries.add(e)
            self._count[Tier.DEVICE] += 1
            self._bump(node, int(not e.slot), int(not e.slot))
            self._stamp(e, self._clock)
        self._last = e
        unit = self.unit
        if not e.slot and n > unit and n % unit == 0:
            up, want = node.parent, n - unit
            while up is not None and up.depth > want:
                up = up.parent
            old = up.entry if up is not None and up.depth == want else None
            if old is not None and not old.slot and old.device is not None and old.host is None:
                self._remove(old)

    def _grow(self, key: Tokens, store: Any) -> bool:
        """The common case of a sequence checkpointed every page, done in place: `key` is the last
        entry's key a page longer (the same buffer), that entry is a leaf, stateless, resident and
        without a host copy, and the store is stateless. The general path would hang a one-page
        leaf below it, remove it by the growth rule and merge the two nodes; this leaves the same
        tree, counts and ticks."""
        last, unit = self._last, self.unit
        if (last is None or last.node is None or key.data is not last.key.data or key.n != last.key.n + unit
                or key.n % unit or store.has_slot or last.slot or last.device is None or last.host is not None):
            return False
        node = last.node
        if node.children or node.buf is not key.data or node.hi != last.key.n * WIDTH:
            return False
        node.set_edge(node.buf, node.lo, key.n * WIDTH)
        node.depth = key.n
        e = _Entry(key, store, False, node)
        node.entry = e
        self._entries.add(e)
        self._stamp(e, self._clock)
        self._entries.discard(last)
        last.node = None
        last.device.release()
        self._last = e
        return True

    def lookup(self, tokens) -> Hit | None:
        """The longest usable prefix of `tokens[:-1]` (the last token must still run).

        Internal updates: every entry offered is restamped (entries nearer the root warmer); a
        lookup that finds nothing touches nothing.
        """
        t = Tokens.of(tokens)
        if not t.n:
            return None
        q = t.data
        end = t.n * WIDTH - WIDTH
        qlen = end >> 2
        node, at, nxt, c = self._root, 0, None, 0
        path = [node]
        ons = []
        children = node.children
        while at < end:
            child = children.get(q[at:at + WIDTH])
            if child is None:
                break
            edge = child.edge
            if q.startswith(edge, at, end):
                node, at = child, at + len(edge)
                path.append(node)
                if node.entry is not None:
                    ons.append(node)
                children = node.children
                continue
            c = _common(edge, q, at, end)
            nxt = child
            break
        d = at >> 2
        matched = d + c if nxt is not None else d
        base = self._clock + qlen + 2
        self._clock = base
        touched = 0
        # on-path offers: (len, resident, entry); the deepest is the longest
        best: tuple[int, bool, _Entry] | None = None
        stamp = self._stamp
        for n in ons:
            e = n.entry
            stamp(e, base - touched)
            touched += 1
            best = (n.depth, e.device is not None, e)
        pick = self._off_path(path, nxt, matched)
        if pick is not None:
            length, child, resident = pick
            e = self._descend(child, resident)
            self._stamp(e, base - touched)
            offer = (length, resident, e)
            if offer[0] > 0 and (best is None or offer[:2] >= best[:2]):
                best = offer
        if best is None:
            return None
        length, resident, e = best
        store = (e.device if resident else e.host).clone()
        return Hit(length, Tier.DEVICE if resident else Tier.HOST, store, e.key)

    def _off_path(self, path: list[_Node], nxt: _Node | None, matched: int) -> tuple[int, _Node, bool] | None:
        """The off-path candidate sharing the most whole pages (resident at equal length; among
        equals the deepest, as the last maximum of a root-first scan).

        Scans from the deepest candidate up and stops once no shallower node can do better."""
        unit = self.unit
        best: tuple[int, bool, _Node] | None = None
        if nxt is not None and nxt.paged_below > 0 and matched >= unit:
            best = (matched // unit * unit, nxt.resident_below > 0, nxt)
        avoid = nxt
        for i in range(len(path) - 1, -1, -1):
            n = path[i]
            if n.depth < unit:
                break
            shared = n.depth // unit * unit
            if best is not None and (shared < best[0] or best[1]):
                break
            if n.paged_below > (n.entry is not None and not n.entry.slot) + (avoid.paged_below if avoid else 0):
                pick = None
                kids = n.children
                for t in n._keys:
                    k = kids[t]
                    if k is not avoid and k.resident_below > 0:
                        pick = k
                        break
                if pick is None:
                    for t in n._keys:
                        k = kids[t]
                        if k is not avoid and k.paged_below > 0:
                            pick = k
                            break
                if pick is not None:
                    key = (shared, pick.resident_below > 0)
                    if best is None or key > best[:2]:
                        best = (key[0], key[1], pick)
            avoid = n
        return None if best is None else (best[0], best[2], best[1])

    @staticmethod
    def _descend(node: _Node, resident: bool) -> _Entry:
        while True:
            e = node.entry
            if e is not None and not e.slot and (not resident or e.device is not None):
                return e
            kids = node.children
            node = next(k for k in map(kids.__getitem__, node._keys)
                        if (k.resident_below if resident else k.paged_below) > 0)

    def evict(self, park: Callable[[Any], Any] | None = None) -> Evicted | None:
        """Take the coldest resident entry: park it (dropping the coldest parked entries while the
        host is full) or drop it. Returns None when nothing is resident.

        `park(store)` borrows the entry's device store and returns the host store it made (the
        index takes it over), or a `Denied` (or None) when the host is full. An exception from
        `park` removes the entry and propagates.
        """
        e = self._coldest(Tier.DEVICE)
        if e is None:
            return None
        key = e.key
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
            self._remove(victim)
            dropped += 1
        self._remove(e)
        return Evicted(key, False, dropped)
