"""Physical chunks behind the arenas, and the `Remap` plans that move them.

Each pooled state is an arena: a reserved range of chunk positions. Object `i` of `size` bytes covers
positions `[size*i // chunk, ceil((size*i + size) / chunk))`, so neighbours may share a boundary
position. A position is mapped when its first user arrives and unmapped when its last user leaves.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

__all__ = ["Arena", "Chunks", "Remap"]

PAGE = "page"
SLOT = "slot"


class Remap:
    """One plan for the runtime, executed in order: unmap, then map, then grant access.

    Attributes:
        unmap:  (arena, position) to unmap; the chunk returns to the free stack.
        map:    (arena, position, chunk) to map.
        access: (arena, start, stop) position ranges made accessible, one per arena per made object.
        made:   (kind, id) objects this plan makes; kind is "page" or "slot". The runtime zeroes each.
        unmade: (kind, id) objects this plan removes.

    A plan that makes a million objects at once (the first layout of a large pool) holds them as
    arrays and spells the lists out on first use, so building the pool does not build the lists.
    """

    __slots__ = ("_unmap", "_map", "_access", "_made", "_unmade", "_bulk")

    def __init__(self, unmap=None, map=None, access=None, made=None, unmade=None) -> None:
        self._unmap: list[tuple[str, int]] = list(unmap or ())
        self._map: list[tuple[str, int, int]] = list(map or ())
        self._access: list[tuple[str, int, int]] = list(access or ())
        self._made: list[tuple[str, int]] = list(made or ())
        self._unmade: list[tuple[str, int]] = list(unmade or ())
        self._bulk: list = []

    def __repr__(self) -> str:
        self._spell()
        return (f"Remap(unmap={self._unmap!r}, map={self._map!r}, access={self._access!r}, "
                f"made={self._made!r}, unmade={self._unmade!r})")

    def __eq__(self, other: object) -> bool:
        if not isinstance(other, Remap):
            return NotImplemented
        self._spell()
        other._spell()
        return (self._unmap, self._map, self._access, self._made, self._unmade) == (
            other._unmap, other._map, other._access, other._made, other._unmade)

    def _defer(self, spell) -> None:
        """`spell()` returns (map, access, made) lists to append, in order, when first read."""
        self._bulk.append(spell)

    def _spell(self) -> None:
        while self._bulk:
            m, a, made = self._bulk.pop(0)()
            self._map.extend(m)
            self._access.extend(a)
            self._made.extend(made)

    @property
    def unmap(self) -> list[tuple[str, int]]:
        self._spell()
        return self._unmap

    @property
    def map(self) -> list[tuple[str, int, int]]:
        self._spell()
        return self._map

    @property
    def access(self) -> list[tuple[str, int, int]]:
        self._spell()
        return self._access

    @property
    def made(self) -> list[tuple[str, int]]:
        self._spell()
        return self._made

    @property
    def unmade(self) -> list[tuple[str, int]]:
        self._spell()
        return self._unmade

    def access_spans(self) -> list[tuple[str, int, int]]:
        """The access grants with touching or overlapping ranges of one arena merged."""
        spans: list[tuple[str, int, int]] = []
        for arena, lo, hi in sorted(self.access):
            if spans and spans[-1][0] == arena and spans[-1][2] >= lo:
                spans[-1] = (arena, spans[-1][1], max(spans[-1][2], hi))
            else:
                spans.append((arena, lo, hi))
        return spans


@dataclass(frozen=True, slots=True)
class Arena:
    """One pooled state's reservation: `objects` objects of `size` bytes over `chunk`-byte positions."""

    state: str
    kind: str
    size: int
    objects: int
    chunk: int

    @property
    def positions(self) -> int:
        return -(-self.size * self.objects // self.chunk)

    def span(self, i: int) -> range:
        return range(self.size * i // self.chunk, -(-(self.size * i + self.size) // self.chunk))


class Chunks:
    """Users per position and the chunk behind each mapped position; chunks come from a free stack."""

    def __init__(self, arenas: list[Arena], total: int) -> None:
        self.arenas = arenas
        self.total = total
        # lowest chunk id on top
        self.free: list[int] = list(range(total - 1, -1, -1))
        self.users: dict[str, list[int]] = {a.state: [0] * a.positions for a in arenas}
        self.chunk_of: dict[str, list[int]] = {a.state: [-1] * a.positions for a in arenas}

    def clone(self) -> Chunks:
        other = Chunks.__new__(Chunks)
        other.arenas = self.arenas
        other.total = self.total
        other.free = list(self.free)
        other.users = {k: list(v) for k, v in self.users.items()}
        other.chunk_of = {k: list(v) for k, v in self.chunk_of.items()}
        return other

    def _of(self, kind: str) -> list[Arena]:
        return [a for a in self.arenas if a.kind == kind]

    def cost(self, kind: str, i: int) -> int:
        """Positions object `i` needs that nobody maps yet."""
        return sum(1 for a in self._of(kind) for p in a.span(i) if self.users[a.state][p] == 0)

    def make(self, kind: str, i: int, plan: Remap) -> None:
        for a in self._of(kind):
            users, chunk_of = self.users[a.state], self.chunk_of[a.state]
            span = a.span(i)
            for p in span:
                if users[p] == 0:
                    chunk_of[p] = self.free.pop()
                    plan.map.append((a.state, p, chunk_of[p]))
                users[p] += 1
            plan.access.append((a.state, span.start, span.stop))
        plan.made.append((kind, i))

    def unmake(self, kind: str, i: int, plan: Remap) -> None:
        for a in self._of(kind):
            users, chunk_of = self.users[a.state], self.chunk_of[a.state]
            for p in a.span(i):
                users[p] -= 1
                assert users[p] >= 0, f"{a.state=} {p=} unmapped twice"
                if users[p] == 0:
                    plan.unmap.append((a.state, p))
                    self.free.append(chunk_of[p])
                    chunk_of[p] = -1
        plan.unmade.append((kind, i))

    # the first layout, vectorised

    def fit_first(self, kind: str, most: int) -> int:
        """The most objects 0..k-1 (k <= most) of `kind` that the free chunks can map, in arenas of
        that kind nobody uses yet: as many as making them one by one, lowest first, would make."""
        arenas = self._of(kind)
        assert all(not any(self.users[a.state]) for a in arenas), "fit_first on a used arena"
        free = len(self.free)

        def cost(k: int) -> int:
            return sum(-(-a.size * k // a.chunk) for a in arenas)

        lo, hi = 0, most
        while lo < hi:
            mid = (lo + hi + 1) >> 1
            if cost(mid) <= free:
                lo = mid
            else:
                hi = mid - 1
        return lo

    def make_first(self, kind: str, k: int, plan: Remap) -> None:
        """Make objects 0..k-1 of `kind` at once: the same mappings, chunks and users as making
        them one by one (object-major, then arena, then position), with arrays."""
        arenas = self._of(kind)
        names, pos, first, which = [], [], [], []
        for ai, a in enumerate(arenas):
            positions = -(-a.size * k // a.chunk)
            p = np.arange(positions, dtype=np.int64)
            pos.append(p)
            # the first object whose bytes reach into position p
            first.append(p * a.chunk // a.size)
            which.append(np.full(positions, ai, dtype=np.int64))
            names.append(a.state)
            # objects reaching into position p: from first[p] to the last one starting before its end
            last = np.minimum((p * a.chunk + a.chunk - 1) // a.size, k - 1)
            users = last - first[-1] + 1
            self.users[a.state][:positions] = users.tolist()
        pos_all, first_all, which_all = np.concatenate(pos), np.concatenate(first), np.concatenate(which)
        order = np.lexsort((pos_all, which_all, first_all))
        n = len(order)
        chunks = np.array(self.free[len(self.free) - n:][::-1], dtype=np.int64)
        del self.free[len(self.free) - n:]
        pos_all, which_all = pos_all[order], which_all[order]
        for ai, a in enumerate(arenas):
            mine = which_all == ai
            got = np.empty(len(pos[ai]), dtype=np.int64)
            got[pos_all[mine]] = chunks[mine]
            self.chunk_of[a.state][:len(got)] = got.tolist()

        def spell():
            state = [names[i] for i in which_all.tolist()]
            mapped = list(zip(state, pos_all.tolist(), chunks.tolist()))
            access = []
            spans = [(a.state, [range(a.size * i // a.chunk, -(-(a.size * i + a.size) // a.chunk)) for i in range(k)])
                     for a in arenas]
            for i in range(k):
                for state_name, rs in spans:
                    access.append((state_name, rs[i].start, rs[i].stop))
            return mapped, access, [(kind, i) for i in range(k)]

        plan._defer(spell)
