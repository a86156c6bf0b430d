"""Page tables kept between steps: a row is rebuilt only when the pages of the cell in it changed.

A decode step's cells mostly hold the pages they held the step before (a sequence takes a new page
once every `unit` tokens), so rebuilding every row of every page table each step, and uploading all
of it, is work thrown away. `Resident` keeps, per row of the step's batch, the pages it was built
from, a padded pages matrix (what the slot map is read from) and each table's host copy in its
buffer's dtype; `update(cells)` rewrites just the rows whose cell holds other pages than before and
returns the runs of rows rewritten, so the runtime uploads only those (the buffer on the device then
equals a full rebuild: tests/test_stage.py holds it to the per-cell reference over runs of steps).

The host copies mirror the buffers only while nothing else writes them: the runtime calls
`invalidate()` whenever a table is written another way (a plain staging, an arriving buffer).
"""

from __future__ import annotations

import itertools

import numpy as np

from kern.errors import KernError
from runtime.step import PageTable


class NoPages(KernError, ValueError):
    """A cell with no pages: it has no page-table row (the runtime stages such a step whole)."""


class Resident:
    def __init__(self, unit: int, tables: list[PageTable], rows: int, dtypes: dict[str, np.dtype]):
        self.unit = unit
        self.tables = tables
        self.rows = rows
        self.held: list[list[int] | None] = [None] * rows  # the pages each row was built from (a copy)
        self.pages = np.zeros((rows, 8), np.int64)  # row g's pages, left-aligned
        self.host = {t.name: np.zeros(rows * t.width, dtypes[t.name]) for t in tables}
        self.dirty: list[tuple[int, int]] = []  # the last update's rewritten runs of rows [lo, hi)
        self._steps = np.arange(max((t.per_page for t in tables), default=1), dtype=np.int64)

    def invalidate(self) -> None:
        """The buffers were written another way: every row is rebuilt (and uploaded) at its next use."""
        self.held = [None] * self.rows

    def update(self, cells) -> list[tuple[int, int]]:
        """Bring rows 0..len(cells)-1 to these cells' pages (each cell holds at least one page);
        returns (and keeps in `dirty`) the runs [lo, hi) of rows rewritten."""
        held = self.held
        changed = [g for g, (h, c) in enumerate(zip(held, cells)) if h != c.pages]
        if not changed:
            self.dirty = []
            return self.dirty
        try:
            rebuild = [g for g in changed if not self._grew(g, cells[g].pages)]
            if rebuild:
                self._rebuild(cells, rebuild)
        except BaseException:
            self.invalidate()
            raise
        runs: list[tuple[int, int]] = []
        for g in changed:
            if runs and runs[-1][1] == g:
                runs[-1] = (runs[-1][0], g + 1)
            else:
                runs.append((g, g + 1))
        self.dirty = runs
        return runs

    def _grew(self, g: int, pages: list[int]) -> bool:
        """The common change, done in place: row g holds the same sequence one page longer (a decode
        step crossed a page boundary), so only that page's entries are written, over what was the
        first entry repeated. False (nothing written) for any other change."""
        held = self.held[g]
        k = len(pages) - 1
        if held is None or len(held) != k or k >= self.pages.shape[1] or pages[:k] != held:
            return False
        page = pages[k]
        self.pages[g, k] = page
        for t in self.tables:
            lo = k * t.per_page
            if lo < t.width:  # past the width the row holds only its first pages
                hi = min(lo + t.per_page, t.width)
                self.host[t.name][g * t.width + lo : g * t.width + hi] = page * t.per_page + self._steps[: hi - lo]
        held.append(page)
        return True

    def _rebuild(self, cells, changed: list[int]) -> None:
        held = self.held
        lists = [cells[g].pages for g in changed]
        lens = np.fromiter(map(len, lists), np.int64, len(lists))
        if lens.min() < 1:
            raise NoPages("a cell with no pages has no page-table row")
        widest = int(lens.max())
        if widest > self.pages.shape[1]:
            grown = np.zeros((self.rows, max(widest, 2 * self.pages.shape[1])), np.int64)
            grown[:, : self.pages.shape[1]] = self.pages
            self.pages = grown
        ch = np.asarray(changed, np.int64)
        total = int(lens.sum())
        starts = np.zeros(len(lists) + 1, np.int64)
        np.cumsum(lens, out=starts[1:])
        which = np.repeat(np.arange(len(lists), dtype=np.int64), lens)
        flat = np.fromiter(itertools.chain.from_iterable(lists), np.int64, total)
        self.pages[ch[which], np.arange(total, dtype=np.int64) - starts[which]] = flat
        for t in self.tables:
            # a row's entries: each of its pages' `per_page` entries in order, then its first entry repeated
            j = np.arange(t.width, dtype=np.int64)
            n = np.minimum(lens * t.per_page, t.width)
            col = np.where(j[None, :] < n[:, None], j[None, :], 0)
            ent = self.pages[ch[:, None], col // t.per_page] * t.per_page + col % t.per_page
            self.host[t.name].reshape(self.rows, t.width)[ch] = ent
        for g, pages in zip(changed, lists):
            held[g] = list(pages)

    def slots(self, cell_of_row: np.ndarray, rows: np.ndarray) -> np.ndarray:
        """The slot map: each row's position in its cell's pages (after `update`)."""
        return self.pages[cell_of_row, rows // self.unit] * self.unit + rows % self.unit
