"""The prefix index's tree (`pool.prefix.Prefix` walks it): nodes whose edges are views of packed
token buffers, their entries (a resident and/or a parked store), and `common`, how far an edge and a
query agree. Nothing here is copied per token: see `Node`."""

from __future__ import annotations

import bisect
from typing import Any

from pool.hits import _DEVICE, _HOST, Tier
from pool.tokens import WIDTH, Tokens

__all__ = ["Entry", "Node", "bump", "common", "first_entry"]


class Entry:
    __slots__ = ("key", "device", "host", "slot", "used", "node", "in_device", "in_host")

    def __init__(self, key: Tokens, device: Any, slot: bool, node: Node) -> None:
        self.key = key
        self.device = device
        self.host: Any = None
        self.slot = slot
        # the tick of the last use: it only grows (see `Prefix._stamp`)
        self.used = 0
        # None once removed
        self.node: Node | None = node
        # whether the tier's recency heap holds an item for this entry
        self.in_device = False
        self.in_host = False

    @property
    def tier(self) -> Tier:
        return _DEVICE if self.device is not None else _HOST


class Node:
    """A node of the tree. Its edge is bytes `lo:hi` of `buf`, the packed buffer of a key that spells
    the whole path from the root to this node: `lo` and `hi` are absolute (4 times the parent's depth
    and this node's). So nothing is copied: the keys of one growing sequence share one buffer, a
    split cuts a buffer in two views, and a node merged into its only child widens the child's view
    of its own buffer."""

    __slots__ = ("buf", "lo", "hi", "edge", "children", "parent", "depth", "entry", "paged_below",
                 "resident_below", "_keys")

    def __init__(self, buf: bytes, lo: int, hi: int, parent: Node | None, depth: int) -> None:
        self.buf, self.lo, self.hi = buf, lo, hi
        self.edge = memoryview(buf)[lo:hi]
        # children keyed by their edge's first packed token
        self.children: dict[bytes, Node] = {}
        self.parent = parent
        self.depth = depth
        self.entry: Entry | None = None
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

    def ordered(self) -> list[Node]:
        kids = self.children
        return [kids[t] for t in self._keys]

    def put(self, child: Node) -> None:
        t = child.buf[child.lo:child.lo + WIDTH]
        if t not in self.children:
            bisect.insort(self._keys, t)
        self.children[t] = child

    def drop(self, child: Node) -> None:
        t = child.buf[child.lo:child.lo + WIDTH]
        del self.children[t]
        del self._keys[bisect.bisect_left(self._keys, t)]


def common(edge, q: bytes, at: int, end: int) -> int:
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


def first_entry(node: Node, resident: bool) -> Entry:
    """The first stateless entry (resident if asked) of `node`'s subtree in token order, which
    its counts say is there."""
    while True:
        e = node.entry
        if e is not None and not e.slot and (not resident or e.device is not None):
            return e
        kids = node.children
        for t in node._keys:
            k = kids[t]
            if (k.resident_below if resident else k.paged_below) > 0:
                node = k
                break
        else:
            raise AssertionError(f"no {'resident' if resident else 'stateless'} entry below a node that counts one")


def bump(node: Node | None, paged: int, resident: int) -> None:
    """Add to the stateless-entry counts of `node` and every node above it."""
    while node is not None:
        node.paged_below += paged
        node.resident_below += resident
        node = node.parent
