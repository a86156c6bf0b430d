"""runtime/step.py's `stage`, built from whole-array operations, against the per-cell reference it
replaced (the property: for any cells, tables and fills, every array is identical, values and dtype)."""

from __future__ import annotations

import numpy as np
from hypothesis import given, settings
from hypothesis import strategies as st

from runtime.step import Cell, LineTable, PageTable, stage


def reference_stage(
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


@st.composite
def steps(draw):
    unit = draw(st.sampled_from([1, 2, 4, 16]))
    cells = []
    for _ in range(draw(st.integers(1, 9))):
        n = draw(st.integers(1, 6))
        pos = draw(st.integers(0, 80))
        need = (pos + n + unit - 1) // unit
        pages = draw(st.lists(st.integers(0, 5000), min_size=need, max_size=need + 3))
        ids = draw(st.lists(st.integers(0, 256), min_size=n, max_size=n))
        cells.append(Cell(pages, draw(st.integers(0, 60)), ids, pos))
    tables = [PageTable(f"pt{i}", draw(st.integers(1, 48)), draw(st.sampled_from([1, 2, 4])))
              for i in range(draw(st.integers(0, 2)))]
    lines = [LineTable(f"lt{i}", draw(st.integers(1, 4)), draw(st.integers(1, 3))) for i in range(draw(st.integers(0, 2)))]
    return unit, cells, tables, lines, len(cells) + draw(st.integers(0, 3))


FILLS = {"token": ["tok"], "position": ["p"], "seq_len": ["sl"], "cu_seqlens": ["cu"], "slot": ["s", "s2"]}


@settings(max_examples=400, deadline=None)
@given(steps())
def test_stage_equals_the_per_cell_reference(case):
    unit, cells, tables, lines, groups_max = case
    want = reference_stage(cells, 1, unit, FILLS, tables, lines, groups_max, 7)
    got = stage(cells, 1, unit, FILLS, tables, lines, groups_max, 7)
    assert got.keys() == want.keys()
    for k in want:
        assert got[k].dtype == want[k].dtype and np.array_equal(got[k], want[k]), k
