"""Fixtures and reference models shared by the pool, host and prefix tests.

Fixtures follow reference/kern-pool.md §3.1; `Rand` is its xorshift64, ported bit-exactly.
"""

from __future__ import annotations

from pool import Geometry, Pool, Remap

MASK = (1 << 64) - 1

TWO_PAGED = Geometry(
    paged=(("draft_kv", 1), ("kv", 1)),
    page_tables=(("block_table", "kv", 3, 16), ("draft_table", "draft_kv", 16, 4)),
)
HYBRID = Geometry(
    paged=(("kv", 1),),
    lined=(("gdn", 24),),
    page_tables=(("block_table", "kv", 3, 16),),
    line_tables=(("line_index", "gdn", 3, 8),),
)
PAGED4 = Geometry(paged=(("kv", 1),), page_tables=(("block_table", "kv", 8, 4),))
HYBRID4 = Geometry(
    paged=(("kv", 1),),
    lined=(("rec", 8),),
    page_tables=(("block_table", "kv", 8, 4),),
    line_tables=(("rec.line", "rec", 1, 8),),
)
# 12-byte pages and 20-byte slots over 8-byte chunks: object boundaries inside chunks
ODD = Geometry(
    paged=(("kv", 3),),
    lined=(("rec", 20),),
    page_tables=(("block_table", "kv", 8, 4),),
    line_tables=(("rec.line", "rec", 1, 20),),
)


def pool() -> Pool:
    return Pool(TWO_PAGED, 8, 16, 0)


def hybrid_pool() -> Pool:
    return Pool(HYBRID, 8, 20, 4)


def pool4() -> Pool:
    return Pool(PAGED4, 4, 8, 0)


def hybrid_pool4() -> Pool:
    return Pool(HYBRID4, 4, 18, 3)


def land(p: Pool) -> Remap:
    plan = p.take_pending()
    assert plan is not None, "no remap pending"
    p.complete(plan)
    return plan


class Rand:
    """xorshift64: x ^= x<<13; x ^= x>>7; x ^= x<<17 (wrapping); next(n) = (x>>33) % n."""

    def __init__(self, seed: int) -> None:
        self.x = seed & MASK

    def next(self, n: int) -> int:
        x = self.x
        x ^= (x << 13) & MASK
        x ^= x >> 7
        x ^= (x << 17) & MASK
        self.x = x
        return (x >> 33) % n

    def pick(self, items: list):
        return items[self.next(len(items))]


def swap_remove(items: list, i: int):
    """Rust's Vec::swap_remove: the last element moves into slot i."""
    last = items.pop()
    if i == len(items):
        return last
    items[i], last = last, items[i]
    return last


def fold(line: int, stamp: int) -> int:
    return (line * 0x100000001B3 ^ stamp) & MASK


class Device:
    """Token slots and lines of the device, as the runtime would hold them; applies copy plans."""

    def __init__(self, unit: int) -> None:
        self.unit = unit
        self.tokens: dict[int, int] = {}
        self.lines: dict[int, int] = {}

    def copy(self, copies) -> None:
        u = self.unit
        for src, dst in copies.pages:
            for k in range(u):
                v = self.tokens.get(src * u + k)
                if v is None:
                    self.tokens.pop(dst * u + k, None)
                else:
                    self.tokens[dst * u + k] = v
        if copies.slot is not None:
            src, dst = copies.slot
            if src in self.lines:
                self.lines[dst] = self.lines[src]
            else:
                self.lines.pop(dst, None)


class HostModel:
    """Host bytes by (offset, token) and slot offsets; applies park and wake plans with a Device."""

    def __init__(self, unit: int) -> None:
        self.unit = unit
        self.tokens: dict[tuple[int, int], int] = {}
        self.lines: dict[int, int] = {}

    def park(self, dev: Device, copies) -> None:
        u = self.unit
        for page, off in copies.pages:
            for k in range(u):
                v = dev.tokens.get(page * u + k)
                if v is None:
                    self.tokens.pop((off, k), None)
                else:
                    self.tokens[(off, k)] = v
        if copies.slot is not None:
            src, off = copies.slot
            if src in dev.lines:
                self.lines[off] = dev.lines[src]
            else:
                self.lines.pop(off, None)

    def wake(self, dev: Device, copies) -> None:
        u = self.unit
        for off, page in copies.pages:
            for k in range(u):
                v = self.tokens.get((off, k))
                if v is None:
                    dev.tokens.pop(page * u + k, None)
                else:
                    dev.tokens[page * u + k] = v
        if copies.slot is not None:
            off, dst = copies.slot
            if off in self.lines:
                dev.lines[dst] = self.lines[off]
            else:
                dev.lines.pop(dst, None)


class Mapping:
    """Chunk positions as the runtime maps them; checks every plan it lands."""

    def __init__(self, geometry: Geometry, chunk: int, chunks: int, p: Pool) -> None:
        self.chunk = chunk
        self.chunks = chunks
        # arena -> (kind, object bytes)
        self.arenas = {s: ("page", b) for s, b in geometry.page_bytes.items()}
        self.arenas.update({s: ("slot", b) for s, b in geometry.slot_bytes.items()})
        self.mapped: dict[tuple[str, int], int] = {}
        self.free = set(range(chunks))
        self.made: set[tuple[str, int]] = set()
        self.landed = 0
        self.pool = p

    def span(self, arena: str, i: int) -> range:
        size = self.arenas[arena][1]
        return range(size * i // self.chunk, -(-(size * i + size) // self.chunk))

    def land(self, plan: Remap) -> None:
        for arena, pos in plan.unmap:
            assert (arena, pos) in self.mapped, f"unmap of unmapped {(arena, pos)}"
            self.free.add(self.mapped.pop((arena, pos)))
        for arena, pos, chunk in plan.map:
            assert (arena, pos) not in self.mapped, f"map onto mapped {(arena, pos)}"
            assert chunk in self.free, f"map of a used chunk {chunk}"
            self.free.remove(chunk)
            self.mapped[(arena, pos)] = chunk
        for kind, i in plan.unmade:
            assert (kind, i) in self.made, f"unmade {(kind, i)} never made"
            self.made.remove((kind, i))
        for kind, i in plan.made:
            assert (kind, i) not in self.made, f"made {(kind, i)} twice"
            self.made.add((kind, i))
            self.check_mapped(kind, i)
        assert len(self.mapped) + len(self.free) == self.chunks
        self.landed += 1

    def land_pending(self) -> None:
        plan = self.pool.take_pending()
        assert plan is not None
        self.land(plan)
        self.pool.complete(plan)
        assert sum(1 for k, _ in self.made if k == "page") == self.pool.total
        assert sum(1 for k, _ in self.made if k == "slot") == self.pool.slots

    def check_mapped(self, kind: str, i: int) -> None:
        assert (kind, i) in self.made, f"{(kind, i)} is not made"
        for arena, (k, _) in self.arenas.items():
            if k == kind:
                for pos in self.span(arena, i):
                    assert (arena, pos) in self.mapped, f"{(kind, i)} not mapped at {(arena, pos)}"


def test_rand_is_xorshift64():
    r = Rand(1)
    # x = 1 -> 1<<13 ^ 1 = 8193; >>7 = 64 -> 8257; <<17 ...
    x = 1
    x ^= (x << 13) & MASK
    x ^= x >> 7
    x ^= (x << 17) & MASK
    assert r.next(1 << 31) == (x >> 33) % (1 << 31)
    a, b = Rand(0x9E3779B97F4A7C15), Rand(0x9E3779B97F4A7C15)
    assert [a.next(9) for _ in range(100)] == [b.next(9) for _ in range(100)]


def test_swap_remove_moves_the_last_in():
    items = [1, 2, 3, 4]
    assert swap_remove(items, 1) == 2 and items == [1, 4, 3]
    assert swap_remove(items, 2) == 3 and items == [1, 4]


class K:
    """A stand-in store for the prefix index: tokens, a slot flag, and a count of its holders."""

    __slots__ = ("tokens", "has_slot", "name", "holders", "live")

    def __init__(self, tokens: int, has_slot: bool = False, name: str = "", holders: list | None = None) -> None:
        self.tokens = tokens
        self.has_slot = has_slot
        self.name = name
        self.holders = holders if holders is not None else [0]
        self.holders[0] += 1
        self.live = True

    def __repr__(self) -> str:
        return f"K({self.tokens}, {self.has_slot}, {self.name!r})"

    def clone(self) -> "K":
        assert self.live, f"cloning a released {self!r}"
        return K(self.tokens, self.has_slot, self.name, self.holders)

    def release(self) -> None:
        assert self.live, f"{self!r} released twice"
        self.live = False
        self.holders[0] -= 1
