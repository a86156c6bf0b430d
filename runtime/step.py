"""Staging a step: cells padded to a bucket, and the fills each cell's rows need (SPEC §5)."""

from __future__ import annotations

import itertools
import operator
from dataclasses import dataclass, field

import numpy as np

_IDS, _POS, _PAGES = operator.attrgetter("ids"), operator.attrgetter("pos"), operator.attrgetter("pages")
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


def _layout(cells: list[Cell], per: int, pos: np.ndarray, uniform: bool):
    """(rows per cell, total rows, each cell's first row (and the end), each row's cell, each row's
    position) of a step over `cells`."""
    b = len(cells)
    if uniform:
        lens = np.full(b, per, np.int64)
        total = b * per
        starts = np.arange(0, total + 1, per, dtype=np.int64)
        if per == 1:
            cell_of_row, rows = np.arange(b, dtype=np.int64), pos
        else:
            cell_of_row = np.repeat(np.arange(b, dtype=np.int64), per)
            rows = (pos[:, None] + np.arange(per, dtype=np.int64)).reshape(-1)
    else:
        lens = np.fromiter(map(len, map(_IDS, cells)), np.int64, b)
        total = int(lens.sum())
        starts = np.zeros(b + 1, np.int64)
        np.cumsum(lens, out=starts[1:])
        cell_of_row = np.repeat(np.arange(b, dtype=np.int64), lens)
        rows = pos[cell_of_row] + (np.arange(total, dtype=np.int64) - starts[cell_of_row])
    return lens, total, starts, cell_of_row, rows


def _paged(cells: list[Cell], unit: int, fills: dict, page_tables: list, cell_of_row, rows, out: dict) -> None:
    """The slot map and the page tables built whole from the cells' pages (no resident rows), into `out`."""
    b = len(cells)
    npages = np.fromiter((len(c.pages) for c in cells), np.int64, b)
    first = np.zeros(b + 1, np.int64)
    np.cumsum(npages, out=first[1:])
    flat = np.fromiter(itertools.chain.from_iterable(c.pages for c in cells), np.int64, int(first[-1]))
    if fills.get("slot"):
        slots = flat[first[cell_of_row] + rows // unit] * unit + rows % unit
        for name in fills["slot"]:
            out[name] = slots
    for t in page_tables:
        # a cell's entries: each of its pages' `per_page` entries in order, then its first entry repeated
        ent = (flat[:, None] * t.per_page + np.arange(t.per_page, dtype=np.int64)).reshape(-1)
        n = np.minimum(npages * t.per_page, t.width)
        j = np.arange(t.width, dtype=np.int64)
        at = first[:-1, None] * t.per_page + np.where(j[None, :] < n[:, None], j[None, :], 0)
        out[t.name] = ent[at].reshape(-1)


def stage(
    cells: list[Cell],
    per: int,
    unit: int,
    fills: dict[str, list[str]],
    page_tables: list[PageTable],
    line_tables: list[LineTable],
    groups_max: int,
    pad_slot: int,
    resident=None,
    uniform: bool = False,
) -> dict[str, np.ndarray]:
    """Host arrays for every filled input and table, for these (already padded) cells.

    Each cell feeds its own `len(ids)` rows (`per` for every cell of a batched step; a packed chunk's
    cells differ): its rows follow the previous cell's, `cu_seqlens` marks where each begins. Built
    with whole-array operations over every cell at once (the per-cell work is reading its lists), so
    a step of 64 sequences costs about what a step of one does.

    With `resident` (a `runtime.tables.Resident` over these page tables), the slot map and the page
    tables come from the rows it keeps between steps: only the rows whose pages changed are rebuilt
    (its `dirty` runs), and each table is its host copy's first `len(cells)` rows, in the buffer's
    dtype; every cell must hold at least one page. `uniform` says every cell feeds `per` rows (a
    batched step, as the runtime has checked): the rows' layout is then known without reading the cells."""
    b = len(cells)
    pos = np.fromiter(map(_POS, cells), np.int64, b)  # map over attrgetter: the loop runs in C
    lens, total, starts, cell_of_row, rows = _layout(cells, per, pos, uniform)
    out: dict[str, np.ndarray] = {}
    for name in fills.get("token", []):
        out[name] = np.fromiter(itertools.chain.from_iterable(map(_IDS, cells)), np.int64, total)
    for name in fills.get("position", []):
        out[name] = rows
    for name in fills.get("seq_len", []):
        out[name] = pos + lens
    for name in fills.get("cu_seqlens", []):
        out[name] = starts.copy()
    if resident is not None and (fills.get("slot") or page_tables):
        resident.update(cells)
        if fills.get("slot"):
            slots = resident.slots(cell_of_row, rows)
            for name in fills["slot"]:
                out[name] = slots
        for t in page_tables:
            out[t.name] = resident.host[t.name][: b * t.width]
    elif fills.get("slot") or page_tables:
        _paged(cells, unit, fills, page_tables, cell_of_row, rows, out)
    for t in line_tables:
        slots = np.full(groups_max, pad_slot, np.int64)
        slots[:b] = [c.slot for c in cells]
        out[t.name] = (slots[None, :] * t.per_slot + np.arange(t.lines, dtype=np.int64)[:, None]).reshape(-1)
    return out
