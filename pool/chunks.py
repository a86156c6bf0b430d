"""Physical chunks behind the arenas, and the `Remap` plans that move them.

Each pooled state is an arena: a reserved range of chunk positions. Object `i` of `size` bytes covers
positions `[size*i // chunk, ceil((size*i + size) / chunk))`, so neighbours may share a boundary
position. A position is mapped when its first user arrives and unmapped when its last user leaves.
"""

from __future__ import annotations

from dataclasses import dataclass, field

__all__ = ["Arena", "Chunks", "Remap"]

PAGE = "page"
SLOT = "slot"


@dataclass(slots=True)
class Remap:
    """One plan for the runtime, executed in order: unmap, then map, then grant access.

    Attributes:
        unmap:  (arena, position) to unmap; the chunk returns to the free stack.
        map:    (arena, position, chunk) to map.
        access: (arena, start, stop) position ranges made accessible, one per arena per made object.
        made:   (kind, id) objects this plan makes; kind is "page" or "slot". The runtime zeroes each.
        unmade: (kind, id) objects this plan removes.
    """

    unmap: list[tuple[str, int]] = field(default_factory=list)
    map: list[tuple[str, int, int]] = field(default_factory=list)
    access: list[tuple[str, int, int]] = field(default_factory=list)
    made: list[tuple[str, int]] = field(default_factory=list)
    unmade: list[tuple[str, int]] = field(default_factory=list)

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
