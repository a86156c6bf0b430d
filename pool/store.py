"""Frozen pages as chains of runs, slots with holders, and the `Store` that holds both.

A node is a run of frozen pages (never written after the node exists), sealed together. Holding a
node holds its pages and every page up to the root; the last holder of a node gives its whole run
back to the node's owner (the device `Pool` or the `Host`) at once and lets go of its parent,
iteratively, so a long chain releases without recursion. A hold at a depth inside a run splits the
run there first, so a run is always held whole.
"""

from __future__ import annotations

from array import array
from dataclasses import dataclass, field
from typing import Protocol

__all__ = ["Copies", "Node", "Slot", "Store", "chain_pages", "release_chain"]


class Owner(Protocol):
    def _give_node(self, node: "Node") -> None: ...

    def _give_slot(self, slot: "Slot") -> None: ...


_NONE = array("q")


class Node:
    """A run of frozen pages, its parent, and its holders (children, stores, leases).

    `Node(pages, parent, owner)` takes over the caller's hold on `parent` and is born with one holder:
    the caller. `depth` is the depth of its last page. `twin` is a device run's weak link to its host
    copy: live while the host run is, and the copy of exactly this run.

    `pages` is an `array('q')` (page ids or host offsets): it slices and concatenates like a list,
    numpy reads it without a copy, and the garbage collector never walks it (a pool of millions of
    pages in lists made every full collection visit every id).
    """

    __slots__ = ("pages", "parent", "refs", "depth", "twin", "owner")

    def __init__(self, pages, parent: Node | None, owner: Owner) -> None:
        assert pages, "a run of no pages"
        self.pages = pages if type(pages) is array else array("q", pages)
        self.parent = parent
        self.refs = 1
        self.depth = (parent.depth if parent is not None else 0) + len(pages)
        self.twin: Node | None = None
        self.owner = owner

    def __repr__(self) -> str:
        return f"Node(pages={self.pages.tolist()}, depth={self.depth}, refs={self.refs})"

    @property
    def page(self) -> int:
        """The run's last page."""
        return self.pages[-1]

    @property
    def base(self) -> int:
        """The depth just above the run."""
        return self.depth - len(self.pages)

    def hold(self) -> Node:
        assert self.refs > 0, f"{self!r} is already released"
        self.refs += 1
        return self

    def ancestor(self, depth: int) -> Node | None:
        """The node ending at `depth` on this chain (None for depth 0), splitting the run that
        `depth` falls inside; not held."""
        assert 0 <= depth <= self.depth, f"{depth=} {self.depth=}"
        if depth == 0:
            return None
        node = self
        while node.depth - len(node.pages) >= depth:
            node = node.parent
        if node.depth != depth:
            node._split(depth - (node.depth - len(node.pages)))
            node = node.parent
        return node

    def _split(self, k: int) -> None:
        """Cut the run after its first `k` pages: a new head node (held by this one) takes them."""
        twin = self.live_twin()
        head = Node(self.pages[:k], self.parent, self.owner)
        self.pages = self.pages[k:]
        self.parent = head
        if twin is not None:
            twin._split(k)
            head.twin = twin.parent

    def absorb_parent(self) -> None:
        """Merge the parent run into this one when this run is its only holder and neither has a
        twin: the pages and what holds them are the same, in fewer runs (a sequence checkpointed
        every page, its older checkpoints gone, keeps one run instead of one per page)."""
        parent = self.parent
        if parent is not None and parent.refs == 1 and parent.twin is None and self.twin is None:
            self.pages = parent.pages + self.pages
            self.parent = parent.parent
            parent.refs = 0
            parent.pages = _NONE

    def live_twin(self) -> Node | None:
        twin = self.twin
        if twin is not None and twin.refs > 0 and twin.depth == self.depth and len(twin.pages) == len(self.pages):
            return twin
        return None

    def match_twin(self) -> None:
        """A wake cuts a host run where its woken part ends (`Host.restore`), and the device run twinned
        to it no longer matched it run for run: its twin was lost and a later park copied its pages
        again. Cut this run at the same place, each part twinned to its own host run."""
        twin = self.twin
        if twin is None or twin.refs == 0 or twin.depth != self.depth or len(twin.pages) >= len(self.pages):
            return
        k = len(self.pages) - len(twin.pages)
        head = Node(self.pages[:k], self.parent, self.owner)
        self.pages = self.pages[k:]
        self.parent = head
        head.twin = twin.parent


def release_chain(node: Node | None) -> None:
    """Drop one hold on `node`; free every node whose last holder this was, walking up."""
    while node is not None:
        node.refs -= 1
        assert node.refs >= 0, f"{node!r} released twice"
        if node.refs:
            return
        node.owner._give_node(node)
        node = node.parent


def chain_of(node: Node | None) -> list[Node]:
    """The nodes from the root down to `node`."""
    out: list[Node] = []
    while node is not None:
        out.append(node)
        node = node.parent
    out.reverse()
    return out


def chain_pages(node: Node | None) -> list[int]:
    """The pages from the root down to `node`'s last."""
    out: list[int] = []
    for n in chain_of(node):
        out += n.pages
    return out


class Slot:
    """One sequence slot (a device slot id or a host offset) and its holders."""

    __slots__ = ("id", "owner", "refs", "stored")

    def __init__(self, id: int, owner: Owner, stored: bool = False) -> None:
        self.id = id
        self.owner = owner
        self.refs = 1
        # held by stores (a snapshot), not by a writing lease
        self.stored = stored

    def __repr__(self) -> str:
        return f"Slot({self.id}, refs={self.refs})"

    def hold(self) -> Slot:
        assert self.refs > 0, f"{self!r} is already released"
        self.refs += 1
        return self

    def release(self) -> None:
        self.refs -= 1
        assert self.refs >= 0, f"{self!r} released twice"
        if self.refs == 0:
            self.owner._give_slot(self)


@dataclass(slots=True)
class Copies:
    """A byte-move plan, executed at once while its handles are alive, never stored.

    Attributes:
        pages: (src, dst) page moves: device ids, or (device id, host offset) for a park, or
               (host offset, device id) for a restore from the host.
        slot:  (src, dst) of the sequence slot, or None.
    """

    pages: list[tuple[int, int]] = field(default_factory=list)
    slot: tuple[int, int] | None = None

    def __bool__(self) -> bool:
        return bool(self.pages) or self.slot is not None


class Store:
    """`tokens` tokens of frozen state: a chain of `ceil(tokens/unit)` pages (none if slot-only) and
    maybe a slot. A store with a slot holds the recurrent state just after exactly `tokens` tokens.

    Value semantics with explicit holders: `clone()` is another holder of the same bytes, `release()`
    lets go of this one; the last release frees them.
    """

    __slots__ = ("tokens", "_tip", "_slot", "_live")

    def __init__(self, tokens: int, tip: Node | None, slot: Slot | None) -> None:
        assert tokens >= 1, f"{tokens=}"
        assert tip is not None or slot is not None, "a store holds pages or a slot"
        self.tokens = tokens
        self._tip = tip
        self._slot = slot
        self._live = True

    def __repr__(self) -> str:
        return f"{type(self).__name__}(tokens={self.tokens}, pages={self.page_ids()}, slot={self.seq_slot()})"

    @property
    def has_slot(self) -> bool:
        return self._slot is not None

    @property
    def pages(self) -> int:
        """Pages in the chain: 0 for a slot-only store."""
        return self._tip.depth if self._tip is not None else 0

    @property
    def live(self) -> bool:
        return self._live

    def page_ids(self) -> list[int]:
        """Page ids (or host offsets) from the root."""
        return chain_pages(self._tip)

    def seq_slot(self) -> int | None:
        return self._slot.id if self._slot is not None else None

    def _nodes(self) -> list[Node]:
        assert self._live, f"{self!r} used after release"
        return chain_of(self._tip)

    def clone(self) -> Store:
        assert self._live, f"cloning a released {type(self).__name__}"
        tip = self._tip
        if tip is not None:
            assert tip.refs > 0, f"{tip!r} is already released"
            tip.refs += 1
        slot = self._slot
        if slot is not None:
            slot.hold()
        return type(self)(self.tokens, tip, slot)

    def release(self) -> None:
        assert self._live, f"{type(self).__name__} released twice"
        self._live = False
        tip = self._tip
        if tip is not None and tip.refs > 1:
            tip.refs -= 1  # not the last holder: release_chain's first step, and its last
        else:
            release_chain(tip)
        if self._slot is not None:
            self._slot.release()
