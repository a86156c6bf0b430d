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

import heapq
from typing import Any, Callable

from pool.denied import Denied, PoolError
from pool.hits import _DEVICE, _HOST, Evicted, Hit, Tier
from pool.radix import Entry, Node, bump, common, first_entry
from pool.tokens import WIDTH, Tokens

__all__ = ["Evicted", "Hit", "Prefix", "Tier", "Tokens"]


class Prefix:
    """The radix index over snapshots of `unit`-token pages."""

    def __init__(self, unit: int) -> None:
        self.unit = unit
        self._root = Node(b"", 0, 0, None, 0)
        # insertion-ordered, so a rebuilt heap's order among equal ticks (and all it decides) is the same
        # every run: a set ordered them by address, and a mutant whose rebuild ties every tick was caught
        # in some runs only (CI on c8594c3: compaction-forgets-recency survived)
        self._entries: dict[Entry, None] = {}
        self._clock = 0
        self._seq = 0
        # per tier, a heap of (tick, seq, entry): at most one item an entry, whose tick is at most
        # the entry's (`_stamp`); an item of an entry removed or in the other tier is stale
        self._lru_device: list[tuple[int, int, Entry]] = []
        self._lru_host: list[tuple[int, int, Entry]] = []
        self._resident = 0
        self._parked = 0
        # the entry inserted last (a growing sequence's, usually)
        self._last: Entry | None = None

    def __repr__(self) -> str:
        return f"Prefix(unit={self.unit}, resident={self.count(Tier.DEVICE)}, parked={self.count(Tier.HOST)})"

    # queries

    def entries(self) -> int:
        return len(self._entries)

    def count(self, tier: Tier) -> int:
        return self._resident if tier is _DEVICE else self._parked

    def _sorted(self) -> list[Entry]:
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

    # An entry's tick only grows (every stamp but a park's is past the clock; a park keeps the
    # tick), and ticks are distinct (each stamp takes a fresh one). So a stamp only sets `used`
    # while the entry's tier heap holds an item for it, whose tick is then a lower bound; the
    # coldest is found by lifting the top item to its entry's tick until the top is current: no
    # item below it can hide a colder entry. A tier change (insert of a parked entry, park) then
    # stamps, which gives the new tier its item.

    def _stamp(self, e: Entry, tick: int) -> None:
        e.used = tick
        if e.device is not None:
            if not e.in_device:
                e.in_device = True
                self._seq += 1
                heapq.heappush(self._lru_device, (tick, self._seq, e))
                if len(self._lru_device) > 2 * self._resident + 64:
                    self._compact(True)
        elif not e.in_host:
            e.in_host = True
            self._seq += 1
            heapq.heappush(self._lru_host, (tick, self._seq, e))
            if len(self._lru_host) > 2 * self._parked + 64:
                self._compact(False)

    def _compact(self, device: bool) -> None:
        """Rebuild a tier's heap from its entries: the items of removed entries and of entries now
        in the other tier go (amortised: a heap is rebuilt once it holds twice its tier and more)."""
        fresh = []
        for x in self._entries:
            if (x.device is not None) == device:
                self._seq += 1
                fresh.append((x.used, self._seq, x))
                mine = True
            else:
                mine = False
            if device:
                x.in_device = mine
            else:
                x.in_host = mine
        heapq.heapify(fresh)
        if device:
            self._lru_device = fresh
        else:
            self._lru_host = fresh

    def _coldest(self, tier: Tier) -> Entry | None:
        device = tier is _DEVICE
        heap = self._lru_device if device else self._lru_host
        while heap:
            tick, _, e = heap[0]
            if e.node is None or (e.device is not None) != device:
                heapq.heappop(heap)
                if device:
                    e.in_device = False
                else:
                    e.in_host = False
            elif e.used == tick:
                return e
            else:
                self._seq += 1
                heapq.heapreplace(heap, (e.used, self._seq, e))
        return None

    # tree

    def _node_for(self, key: bytes, end: int) -> Node:
        """The node spelling `key[:end]` (bytes), made (and an edge split) if need be."""
        node, at = self._root, 0
        while at < end:
            child = node.children.get(key[at:at + WIDTH])
            if child is None:
                leaf = Node(key, at, end, node, end >> 2)
                node.put(leaf)
                return leaf
            edge = child.edge
            if key.startswith(edge, at, end):
                node = child
                at += len(edge)
                continue
            c = common(edge, key, at, end)
            if c * WIDTH < len(child.edge):
                # split: the head keeps the subtree's counts
                cut = child.lo + c * WIDTH
                mid = Node(child.buf, child.lo, cut, node, node.depth + c)
                mid.paged_below, mid.resident_below = child.paged_below, child.resident_below
                node.drop(child)
                child.set_edge(child.buf, cut, child.hi)
                child.parent = mid
                mid.put(child)
                node.put(mid)
                child = mid
            node, at = child, at + c * WIDTH
        return node

    def _remove(self, e: Entry) -> None:
        self._entries.pop(e, None)
        device = e.device
        if device is not None:
            self._resident -= 1
        else:
            self._parked -= 1
        node = e.node
        if not e.slot:
            # bump(node, -1, -resident), inline
            resident = device is not None
            up = node
            while up is not None:
                up.paged_below -= 1
                up.resident_below -= resident
                up = up.parent
        e.node = None
        if device is not None:
            device.release()
        if e.host is not None:
            e.host.release()
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
                # the child's buffer spells its whole path, node's edge included: a wider view
                child.set_edge(child.buf, node.lo, child.hi)
                child.parent = parent
                # the merged child starts with node's first token: it takes node's place
                parent.children[node.buf[node.lo:node.lo + WIDTH]] = child
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
        if type(key) is not Tokens:
            key = Tokens.of(key)
        n = key.n
        if not 1 <= n == store.tokens:
            raise PoolError(f"inserting a store of {store.tokens} tokens under a key of {n}")
        self._clock += 1
        last = self._last
        if last is not None and key.data is last.key.data and self._grow(key, store):
            return
        if self._grow_found(key, store):
            return
        node = self._node_for(key.data, n * WIDTH)
        e = node.entry
        if e is not None:
            if e.slot != store.has_slot:
                raise PoolError(f"entry of {n} tokens: has_slot {e.slot}, store {store.has_slot}")
            if e.device is None:
                e.device = store
                self._parked -= 1
                self._resident += 1
                bump(node, 0, int(not e.slot))
            else:
                store.release()
            self._stamp(e, self._clock)
        else:
            e = Entry(key, store, store.has_slot, node)
            node.entry = e
            self._entries[e] = None
            self._resident += 1
            if not e.slot:
                up = node
                while up is not None:
                    up.paged_below += 1
                    up.resident_below += 1
                    up = up.parent
            # _stamp, inline: a new entry is resident and in no heap yet
            e.used = self._clock
            e.in_device = True
            self._seq += 1
            heapq.heappush(self._lru_device, (self._clock, self._seq, e))
            if len(self._lru_device) > 2 * self._resident + 64:
                self._compact(True)
        self._last = e
        unit = self.unit
        if not e.slot and n > unit and n % unit == 0:
            up, want = node.parent, n - unit
            while up is not None and up.depth > want:
                up = up.parent
            old = up.entry if up is not None and up.depth == want else None
            if old is not None and self._outgrown(old):
                self._remove(old)

    @staticmethod
    def _outgrown(e: Entry) -> bool:
        """The growth rule's test (kern-pool §1.9), in one place for its three paths (the general one
        above, `_grow`, `_grow_found`): the entry a page shorter than a new stateless whole-page key
        gives way to it when it is stateless, resident and has no host copy."""
        return not e.slot and e.device is not None and e.host is None

    def _grow(self, key: Tokens, store: Any) -> bool:
        """The common case of a sequence checkpointed every page, done in place: `key` is the last
        entry's key a page longer (the same buffer), that entry is a leaf, stateless, resident and
        without a host copy, and the store is stateless. The general path would hang a one-page
        leaf below it, remove it by the growth rule and merge the two nodes; this leaves the same
        tree, counts and ticks. The entry itself grows (nothing outside the index holds it): it keeps
        its heap item, whose tick stays a lower bound of its own."""
        last, unit = self._last, self.unit
        if (last is None or last.node is None or key.data is not last.key.data or key.n != last.key.n + unit
                or key.n % unit or store.has_slot or not self._outgrown(last)):
            return False
        node = last.node
        if node.children or node.buf is not key.data or node.hi != last.key.n * WIDTH:
            return False
        node.set_edge(node.buf, node.lo, key.n * WIDTH)
        node.depth = key.n
        old = last.device
        last.key = key
        last.device = store
        # _stamp: resident already, so its item is in the device heap
        last.used = self._clock
        old.release()
        return True

    def _grow_found(self, key: Tokens, store: Any) -> bool:
        """`_grow`'s case for a key packed afresh (a server packs each checkpoint's key anew, and its
        sequences interleave, so `_last` is usually another sequence's): the entry one page shorter is
        found by walking the tree along the key, which also shows the key extends it; then it grows in
        place as in `_grow`, its node taking the new key's buffer (equal bytes over the old edge)."""
        unit, n = self.unit, key.n
        if n <= unit or n % unit or store.has_slot:
            return False
        data, want = key.data, (n - unit) * WIDTH
        node, at = self._root, 0
        while at < want:
            node = node.children.get(data[at:at + WIDTH])
            if node is None or not data.startswith(node.edge, at, want):
                return False  # no node ends exactly one page short of the key: no entry there
            at = node.hi
        last = node.entry
        if last is None or node.children or not self._outgrown(last) or last.key.n * WIDTH != want:
            return False
        node.set_edge(data, node.lo, n * WIDTH)
        node.depth = n
        old = last.device
        last.key = key
        last.device = store
        last.used = self._clock  # resident already, so its item is in the device heap (as in _grow)
        old.release()
        self._last = last
        return True

    def lookup(self, tokens) -> Hit | None:
        """The longest usable prefix of `tokens[:-1]` (the last token must still run).

        Internal updates: every entry offered is restamped (entries nearer the root warmer); a
        lookup that finds nothing touches nothing.
        """
        t = tokens if type(tokens) is Tokens else Tokens.of(tokens)
        if not t.n:
            return None
        q = t.data
        end = t.n * WIDTH - WIDTH
        # the ticks of this lookup: base for the on-path entry nearest the root, one less for each
        # deeper one, then one less for the off-path candidate; all past the clock (`_stamp`: an
        # entry with a tick already has its heap item, so a stamp here is the assignment)
        base = self._clock + (end >> 2) + 2
        self._clock = base
        # The off-path candidate, found on the way down: a node of the path with stateless entries
        # off it (under a child other than `avoid`, the one the walk takes), sharing `far` whole-page
        # tokens, `warm` if one of them is resident. The best shares the most pages, resident at equal
        # length, the deepest among equals: (far, warm) only grows root-first, so a tie goes deeper.
        node, at, nxt, c, e, on, cand, avoid, far, warm, touched = self._walk(q, end, base)
        pick, far = self._pick(node, at, nxt, c, e, cand, avoid, far, warm)
        # on-path offers: (len, resident, entry); the deepest is the longest
        best: tuple[int, bool, Entry] | None = None
        if on is not None:
            e = on.entry
            best = (on.depth, e.device is not None, e)
        if pick is not None:
            resident = pick.resident_below > 0
            e = first_entry(pick, resident)
            e.used = base - touched
            offer = (far, resident, e)
            if offer[0] > 0 and (best is None or offer[:2] >= best[:2]):
                best = offer
        if best is None:
            return None
        length, resident, e = best
        store = (e.device if resident else e.host).clone()
        return Hit(length, _DEVICE if resident else _HOST, store, e.key)

    def _walk(self, q: bytes, end: int, base: int):
        """`lookup`'s walk down the path of `q[:end]`, restamping each on-path entry (ticks from `base`
        down): (the last node reached, the bytes matched to it, the child it stopped inside or None,
        the tokens shared with that child's edge, the node's entry, the deepest on-path node with an
        entry, the off-path candidate node and the child it avoids, the pages it shares, whether one
        of them is resident, the entries stamped)."""
        touched = 0
        unit = self.unit
        cand = avoid = None
        far, warm = -1, False
        node, at, nxt, c = self._root, 0, None, 0
        e = None  # node.entry
        on = None  # the deepest on-path node with an entry: the longest on-path offer
        children = node.children
        while at < end:
            child = children.get(q[at:at + WIDTH])
            if child is None:
                break
            if node.paged_below > child.paged_below + (e is not None and not e.slot) and node.depth >= unit:
                shared = node.depth // unit * unit
                res = node.resident_below > child.resident_below + (e is not None and not e.slot and e.device is not None)
                if shared > far or res or not warm:
                    cand, avoid, far, warm = node, child, shared, res
            edge = child.edge
            if q.startswith(edge, at, end):
                node = child
                at += len(edge)
                e = node.entry
                if e is not None:
                    e.used = base - touched
                    touched += 1
                    on = node
                children = node.children
                continue
            c = common(edge, q, at, end)
            nxt = child
            break
        return node, at, nxt, c, e, on, cand, avoid, far, warm, touched

    def _pick(self, node: Node, at: int, nxt: Node | None, c: int, e: Entry | None, cand: Node | None,
              avoid: Node | None, far: int, warm: bool) -> tuple[Node | None, int]:
        """(`lookup`'s off-path subtree to offer from, or None; the pages it shares): inside the child
        the walk stopped in, else under the candidate (its first child in token order holding what
        made it the candidate)."""
        unit = self.unit
        pick = None
        if nxt is not None:
            # the walk left inside nxt's edge: nxt's subtree shares the pages matched
            matched = (at >> 2) + c
            if nxt.paged_below > 0 and matched >= unit:
                shared = matched // unit * unit
                res = nxt.resident_below > 0
                if shared > far or res or not warm:
                    pick, far, warm = nxt, shared, res
        elif node.paged_below > (e is not None and not e.slot) and node.depth >= unit:
            shared = node.depth // unit * unit
            res = node.resident_below > (e is not None and not e.slot and e.device is not None)
            if shared > far or res or not warm:
                cand, avoid, far, warm = node, None, shared, res
        if pick is None and cand is not None:
            # its first child in token order holding what made it the candidate
            kids = cand.children
            if warm:
                for t in cand._keys:
                    k = kids[t]
                    if k is not avoid and k.resident_below > 0:
                        pick = k
                        break
            if pick is None:
                for t in cand._keys:
                    k = kids[t]
                    if k is not avoid and k.paged_below > 0:
                        pick = k
                        break
        return pick, far

    def evict(self, park: Callable[[Any], Any] | None = None) -> Evicted | None:
        """Take the coldest resident entry: park it (dropping the coldest parked entries while the
        host is full) or drop it. Returns None when nothing is resident.

        `park(store)` borrows the entry's device store and returns the host store it made (the
        index takes it over), or a `Denied` (or None) when the host is full. An exception from
        `park` removes the entry and propagates.
        """
        # _coldest(_DEVICE), inline
        heap = self._lru_device
        while heap:
            tick, _, e = heap[0]
            if e.node is None or e.device is None:
                heapq.heappop(heap)
                e.in_device = False
            elif e.used == tick:
                break
            else:
                self._seq += 1
                heapq.heapreplace(heap, (e.used, self._seq, e))
        else:
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
                self._resident -= 1
                self._parked += 1
                bump(e.node, 0, -int(not e.slot))
                # the same tick moves to the parked tier
                self._stamp(e, e.used)
                return Evicted(key, True, dropped)
            victim = self._coldest(_HOST)
            if victim is None:
                break
            self._remove(victim)
            dropped += 1
        self._remove(e)
        return Evicted(key, False, dropped)
