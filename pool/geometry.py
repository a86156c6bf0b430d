"""The pool's view of a manifest: which states are paged, which lined, and the tables that index them.

The runtime derives a `Geometry` from a manifest and hands it over as plain values (names, byte
counts, widths, strides), so the runtime never imports the pool and the pool never reads a manifest.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from kern.errors import KernError

__all__ = ["Geometry", "GeometryError", "chunk_size", "chunks_for"]

MIB = 1 << 20


class GeometryError(KernError, ValueError):
    """The tables disagree with the states (a provider bug)."""


def _tuples(rows) -> tuple:
    return tuple(tuple(r) for r in rows)


@dataclass(frozen=True, slots=True)
class Geometry:
    """States and tables, already split by layout.

    Attributes:
        paged:       (state, bytes_per_token), one per paged state, in name order.
        lined:       (state, bytes_per_seq), one per per-sequence state, in name order.
        page_tables: (buffer, state, width, stride): `width` entries, each covering `stride` tokens.
        line_tables: (buffer, state, lines, stride): `lines` rows per sequence of `stride` bytes.
    """

    paged: tuple[tuple[str, int], ...] = ()
    lined: tuple[tuple[str, int], ...] = ()
    page_tables: tuple[tuple[str, str, int, int], ...] = ()
    line_tables: tuple[tuple[str, str, int, int], ...] = ()

    def __post_init__(self) -> None:
        for name in ("paged", "lined", "page_tables", "line_tables"):
            object.__setattr__(self, name, _tuples(getattr(self, name)))
        names = [s for s, _ in self.paged] + [s for s, _ in self.lined]
        if len(set(names)) != len(names):
            raise GeometryError(f"a state has one layout: {sorted(names)}")
        for state, size in self.paged + self.lined:
            if not isinstance(size, int) or size <= 0:
                raise GeometryError(f"state {state}: size {size!r} is not a positive integer")
        paged = dict(self.paged)
        lined = dict(self.lined)
        for buf, state, width, stride in self.page_tables:
            if state not in paged:
                raise GeometryError(f"page table {buf} indexes {state!r}, which is not a paged state")
            if width <= 0 or stride <= 0:
                raise GeometryError(f"page table {buf}: width {width} and stride {stride} must be positive")
        if paged and not self.page_tables:
            raise GeometryError(f"paged states {sorted(paged)} have no page table")
        if self.page_tables and self.row_tokens == 0:
            raise GeometryError("a page table is narrower than one page")
        for buf, state, lines, stride in self.line_tables:
            if state not in lined:
                raise GeometryError(f"line table {buf} indexes {state!r}, which is not a per-sequence state")
            if lines <= 0 or stride <= 0:
                raise GeometryError(f"line table {buf}: lines {lines} and stride {stride} must be positive")
            per_slot = lined[state] // stride
            if lines > per_slot:
                raise GeometryError(
                    f"line table {buf}: the state holds {per_slot} lines per sequence, not {lines} ({state})")

    # derived

    @property
    def unit(self) -> int:
        """Tokens per page: the lcm of every page table's stride (1 without paged states)."""
        return math.lcm(*(t[3] for t in self.page_tables)) if self.page_tables else 1

    @property
    def row_tokens(self) -> int:
        """The longest sequence the narrowest page table can address, in whole pages."""
        u = self.unit
        return min((w * s // u * u for _, _, w, s in self.page_tables), default=0)

    @property
    def page_bytes(self) -> dict[str, int]:
        """Bytes of one page in each paged state."""
        return {s: self.unit * bpt for s, bpt in self.paged}

    @property
    def slot_bytes(self) -> dict[str, int]:
        """Bytes of one slot in each per-sequence state."""
        return dict(self.lined)

    @property
    def page_size(self) -> int:
        """Bytes of one page across every paged state (a host page holds them back to back)."""
        return sum(self.page_bytes.values())

    @property
    def slot_size(self) -> int:
        """Bytes of one slot across every per-sequence state."""
        return sum(self.slot_bytes.values())

    @property
    def has_slots(self) -> bool:
        return bool(self.lined)

    def page_table(self, buf: str) -> tuple[str, int, int]:
        """(state, width, stride) of a page table."""
        for name, state, width, stride in self.page_tables:
            if name == buf:
                return state, width, stride
        raise KeyError(f"no page table {buf!r}")

    def line_table(self, buf: str) -> tuple[str, int, int]:
        """(state, lines, per_slot) of a line table: line r of slot s is s*per_slot + r."""
        for name, state, lines, stride in self.line_tables:
            if name == buf:
                return state, lines, dict(self.lined)[state] // stride
        raise KeyError(f"no line table {buf!r}")


def chunks_for(geometry: Geometry, tokens: int, first_slots: int, chunk: int) -> int:
    """Chunks that hold `tokens` tokens and `first_slots` slots, each state rounded up on its own."""
    paged = sum(-(-tokens * bpt // chunk) for _, bpt in geometry.paged)
    lined = sum(-(-first_slots * bps // chunk) for _, bps in geometry.lined)
    return paged + lined


def chunk_size(geometry: Geometry) -> int:
    """2 MiB granularity, half the smallest object, at most 64 MiB."""
    objects = list(geometry.page_bytes.values()) + list(geometry.slot_bytes.values())
    grains = min(objects, default=0) // 2 // (2 * MIB)
    return max(1, min(grains, 32)) * 2 * MIB
