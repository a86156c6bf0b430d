"""runtime/step.py's `stage`, built from whole-array operations, against the per-cell reference it
replaced (the property: for any cells, tables and fills, every array is identical, values and dtype)."""

from __future__ import annotations

import numpy as np
from hypothesis import given, settings
from hypothesis import strategies as st

from runtime.step import Cell, LineTable, PageTable, stage
from runtime.tables import Resident


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


@settings(max_examples=300, deadline=None)
@given(st.sampled_from([1, 2, 4, 16]), st.integers(1, 4), st.lists(st.tuples(st.integers(0, 80), st.integers(0, 3)), min_size=1, max_size=9),
       st.data())
def test_a_batched_step_staged_as_uniform_equals_the_reference(unit, per, shape, data):
    """A batched step (every cell feeds `per` rows) staged with `uniform`, which lays the rows out
    without reading each cell's length, gives the per-cell reference's arrays."""
    cells = []
    for pos, extra in shape:
        need = (pos + per + unit - 1) // unit
        pages = data.draw(st.lists(st.integers(0, 5000), min_size=need, max_size=need + extra))
        cells.append(Cell(pages, 3, data.draw(st.lists(st.integers(0, 256), min_size=per, max_size=per)), pos))
    tables = [PageTable("pt", data.draw(st.integers(1, 48)), data.draw(st.sampled_from([1, 2, 4])))]
    lines = [LineTable("lt", 2, 3)]
    want = reference_stage(cells, per, unit, FILLS, tables, lines, len(cells) + 1, 7)
    got = stage(cells, per, unit, FILLS, tables, lines, len(cells) + 1, 7, uniform=True)
    assert got.keys() == want.keys()
    for k in want:
        assert got[k].dtype == want[k].dtype and np.array_equal(got[k], want[k]), k


@st.composite
def runs_of_steps(draw):
    """A run of steps over one set of rows, as actions applied between the steps (the lists are
    live, as a lease's are): each row's pages are kept, grown in place, changed in place, replaced,
    or copied into an equal list; the batch is reshuffled, grows and shrinks."""
    unit = draw(st.sampled_from([1, 2, 4, 16]))
    tables = [PageTable(f"pt{i}", draw(st.integers(1, 24)), draw(st.sampled_from([1, 2, 4])))
              for i in range(draw(st.integers(0, 2)))]
    first = [draw(st.lists(st.integers(0, 5000), min_size=1, max_size=4)) for _ in range(ROWS)]
    page = st.integers(0, 5000)
    action = st.one_of(st.just(("keep",)), st.just(("keep",)), st.tuples(st.just("grow"), page),
                       st.tuples(st.just("replace"), st.lists(page, min_size=1, max_size=6)),
                       st.tuples(st.just("mutate"), st.integers(0, 5), page), st.just(("new-list",)))
    steps = []
    for _ in range(draw(st.integers(1, 8))):
        actions = [draw(action) for _ in range(ROWS)]
        order = draw(st.permutations(range(ROWS)))[: draw(st.integers(1, ROWS))]
        at = [draw(st.integers(0, 10_000)) for _ in order]
        steps.append((actions, order, at))
    return unit, tables, first, steps


ROWS = 12


def apply(pages: list[list[int]], actions) -> None:
    for g, act in enumerate(actions):
        if act[0] == "grow":
            pages[g].append(act[1])  # the same list, one page longer
        elif act[0] == "replace":
            pages[g] = list(act[1])
        elif act[0] == "mutate":
            pages[g][act[1] % len(pages[g])] = act[2]  # in place
        elif act[0] == "new-list":
            pages[g] = list(pages[g])  # equal pages in another list


@settings(max_examples=300, deadline=None)
@given(runs_of_steps())
def test_resident_tables_equal_a_full_rebuild_every_step(case):
    """Staged through `Resident`, every step's slot map equals the reference's, and a device buffer
    that gets only the dirty runs of rows holds, in its first rows, the reference's whole table."""
    unit, tables, first, steps = case
    pages = [list(p) for p in first]
    fills = {"slot": ["s"], "position": ["p"]}
    res = Resident(unit, tables, ROWS, {t.name: np.dtype(np.int32) for t in tables})
    device = {t.name: np.full(ROWS * t.width, -1, np.int32) for t in tables}
    for actions, order, at in steps:
        apply(pages, actions)
        cells = [Cell(pages[g], 0, [1], a % (len(pages[g]) * unit)) for g, a in zip(order, at)]
        want = reference_stage(cells, 1, unit, fills, tables, [], ROWS, 0)
        got = stage(cells, 1, unit, fills, tables, [], ROWS, 0, res)
        assert got.keys() == want.keys()
        assert np.array_equal(got["s"], want["s"]) and np.array_equal(got["p"], want["p"])
        for t in tables:
            w = t.width
            assert np.array_equal(got[t.name], want[t.name]), t.name
            for lo, hi in res.dirty:
                device[t.name][lo * w : hi * w] = got[t.name][lo * w : hi * w]
            assert np.array_equal(device[t.name][: len(cells) * w], want[t.name]), t.name


def test_resident_rebuilds_nothing_when_no_pages_changed():
    """The point of keeping the rows: a step whose cells hold the pages they held is no rewrite."""
    t = PageTable("bt", 8, 1)
    res = Resident(4, [t], 4, {"bt": np.dtype(np.int32)})
    cells = [Cell([3, 9], 0, [1], 5), Cell([4], 0, [1], 2)]
    assert res.update(cells) == [(0, 2)]
    assert res.update([Cell(list(c.pages), 0, [2], c.pos + 1) for c in cells]) == []
    cells[1].pages.append(7)
    assert res.update(cells) == [(1, 2)]  # grown in place: one page's entries written
    assert res.update(cells) == []  # and then held as it is
    assert res.host["bt"][8:11].tolist() == [4, 7, 4]  # row 1: its pages, then its first entry repeated
    res.invalidate()
    assert res.update(cells) == [(0, 2)]
