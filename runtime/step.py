"""Staging a step: cells padded to a bucket, and the fills each cell's rows need (SPEC §5)."""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np

BUCKETS = (1, 2, 4, 8, 16, 24, 32, 48, 64, 96, 128, 192, 256)


@dataclass(slots=True)
class Cell:
    """One sequence's rows in a step: `ids` fed at positions pos, pos+1, ... into `pages`."""

    pages: list[int]
    slot: int | None
    ids: list[int]
    pos: int
    tokens: list[int] = field(default_factory=list)  # what the step emitted for it


def bucket(n: int, cap: int) -> int:
    """The padded batch size for n cells: the first bucket >= n, capped at `cap` (never below n)."""
    for b in BUCKETS:
        if b >= n:
            return max(min(b, cap), n)
    return n


@dataclass(frozen=True, slots=True)
class PageTable:
    name: str
    width: int
    per_page: int  # entries per page: unit / stride


@dataclass(frozen=True, slots=True)
class LineTable:
    name: str
    lines: int
    per_slot: int  # lines per slot: bytes_per_seq / stride


def stage(
    cells: list[Cell],
    per: int,
    unit: int,
    fills: dict[str, list[str]],
    page_tables: list[PageTable],
    line_tables: list[LineTable],
    groups_max: int,
    pad_slot: int,
) -> dict[str, np.ndarray]:
    """Host arrays for every filled input and table, for these (already padded) cells.

    Each cell feeds its own `len(ids)` rows (`per` for every cell of a batched step; a packed chunk's
    cells differ): its rows follow the previous cell's, `cu_seqlens` marks where each begins."""
    b = len(cells)
    pos = np.array([c.pos for c in cells], np.int64)
    lens = np.array([len(c.ids) for c in cells], np.int64)
    rows = np.concatenate([c.pos + np.arange(len(c.ids), dtype=np.int64) for c in cells])
    out: dict[str, np.ndarray] = {}
    for name in fills.get("token", []):
        out[name] = np.fromiter((t for c in cells for t in c.ids), np.int64, int(lens.sum()))
    for name in fills.get("position", []):
        out[name] = rows
    for name in fills.get("seq_len", []):
        out[name] = pos + lens
    for name in fills.get("cu_seqlens", []):
        out[name] = np.concatenate([[0], np.cumsum(lens)]).astype(np.int64)
    if fills.get("slot"):
        pages = np.concatenate([np.asarray(c.pages, np.int64)[(c.pos + np.arange(len(c.ids))) // unit] for c in cells])
        slots = pages * unit + rows % unit
        for name in fills["slot"]:
            out[name] = slots
    for t in page_tables:
        table = np.empty((b, t.width), np.int64)
        for g, c in enumerate(cells):
            ent = (np.asarray(c.pages, np.int64)[:, None] * t.per_page + np.arange(t.per_page)).reshape(-1)
            n = min(len(ent), t.width)
            table[g, :n] = ent[:n]
            table[g, n:] = ent[0]
        out[t.name] = table.reshape(-1)
    for t in line_tables:
        table = np.empty((t.lines, groups_max), np.int64)
        slots = np.full(groups_max, pad_slot, np.int64)
        slots[:b] = [c.slot for c in cells]
        for line in range(t.lines):
            table[line] = slots * t.per_slot + line
        out[t.name] = table.reshape(-1)
    return out
