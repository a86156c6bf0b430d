"""Unit tests of the device tier: layout, denials, slots, remaps, sharing (reference §3.2)."""

import pytest

from pool import Copies, Denied, Geometry, GeometryError, Lease, Pool, PoolError, chunk_size, chunks_for
from test_pool_models import HYBRID, HYBRID4, ODD, PAGED4, TWO_PAGED, hybrid_pool, hybrid_pool4, land, pool, pool4

MIB = 1 << 20


# geometry


def test_toy_geometries():
    paged = Geometry(paged=(("kv", 4096),), page_tables=(("block_table", "kv", 512, 16),))
    assert (paged.unit, paged.row_tokens, paged.page_size, paged.has_slots) == (16, 8192, 65536, False)
    big = Geometry(paged=(("kv", 65536),), page_tables=(("block_table", "kv", 1024, 64),))
    assert (big.unit, big.row_tokens) == (64, 65536)
    stateful = Geometry(**{
        "paged": [["kv", 4096]], "lined": [["mem", 1 << 20]],
        "page_tables": [["block_table", "kv", 512, 16]], "line_tables": [["mem.line", "mem", 1, 1 << 20]],
    })
    assert stateful.has_slots and stateful.slot_size == 1 << 20
    assert stateful.line_table("mem.line") == ("mem", 1, 1)
    assert hash(stateful) == hash(Geometry(**{k: getattr(stateful, k) for k in ("paged", "lined", "page_tables", "line_tables")}))


def test_two_paged_geometry():
    assert (TWO_PAGED.unit, TWO_PAGED.row_tokens) == (16, 48)
    assert TWO_PAGED.page_bytes == {"draft_kv": 16, "kv": 16}
    assert (PAGED4.unit, PAGED4.row_tokens) == (4, 32)


@pytest.mark.parametrize("kwargs, message", [
    pytest.param(dict(paged=(("kv", 1),), lined=(("kv", 8),), page_tables=(("t", "kv", 4, 4),)),
                 "one layout", id="one-layout"),
    pytest.param(dict(paged=(("kv", 1),), lined=(("gdn", 24),), page_tables=(("t", "kv", 4, 4),),
                      line_tables=(("l", "gdn", 4, 8),)), "state holds 3", id="state-holds"),
    pytest.param(dict(paged=(("kv", 1),), page_tables=(("t", "gdn", 4, 4),)), "not a paged state", id="unpaged"),
    pytest.param(dict(paged=(("kv", 1),)), "no page table", id="no-table"),
    pytest.param(dict(paged=(("kv", 1),), page_tables=(("t", "kv", 3, 4), ("d", "kv", 1, 16))),
                 "narrower than one page", id="narrow"),
    pytest.param(dict(paged=(("kv", 0),), page_tables=(("t", "kv", 3, 4),)), "positive", id="zero"),
])
def test_geometry_rejections(kwargs, message):
    with pytest.raises(GeometryError, match=message):
        Geometry(**kwargs)


def test_first_slots_that_do_not_fit():
    with pytest.raises(PoolError, match="hold 1 sequence slots"):
        Pool(HYBRID, 8, 2, 1)


def test_per_state_rounding():
    assert chunks_for(HYBRID, 32, 4, 8) == 16
    two40 = Geometry(paged=(("a", 10), ("b", 10)), page_tables=(("t", "a", 4, 4),))
    assert chunks_for(two40, 4, 0, 32) == 4


def test_chunk_size_rule():
    big = Geometry(paged=(("kv", 64 << 10),), page_tables=(("t", "kv", 4, 784),))
    assert chunk_size(big) == 24 * MIB
    assert chunk_size(PAGED4) == 2 * MIB
    huge = Geometry(paged=(("kv", 1 << 30),), page_tables=(("t", "kv", 4, 1),))
    assert chunk_size(huge) == 64 * MIB


# the first plan


def test_first_plan():
    p, plan = Pool.new(TWO_PAGED, 8, 18, 0)
    assert p.total == 4 and len(plan.map) == 16 and len(p._chunks.free) == 2
    assert [a.state for a in p.arenas] == ["draft_kv", "kv"]
    assert plan.made == [("page", i) for i in range(4)]
    capped, _ = Pool.new(TWO_PAGED, 8, 18, 0, tokens=32)
    assert capped.total == 2 and capped.pages_max == 2
    h, plan = Pool.new(HYBRID, 8, 20, 4)
    assert len(plan.made) == 8 and len(plan.access) == 8
    assert (h.pages_max, h.slots_max, h.total, h.slots, h.slots_used) == (10, 6, 4, 4, 0)


def test_access_spans_merge_grants():
    p, plan = Pool.new(TWO_PAGED, 8, 18, 0)
    assert plan.access_spans() == [("draft_kv", 0, 8), ("kv", 0, 8)]


# denials


def test_exceeds_row_then_busy():
    p = pool()
    assert p.lease(49) == Denied.ExceedsRow(48)
    a = p.lease(48)
    assert isinstance(a, Lease) and a.pages == [0, 1, 2]
    assert p.lease(17) == Denied.Busy
    a.release()
    assert p.used == 0


def test_a_small_budget_caps_the_row():
    p = Pool(TWO_PAGED, 8, 8, 0)
    assert p.max_seq_tokens == 32
    assert p.lease(33) == Denied.ExceedsRow(32)


def test_stateful_checkpoint_is_busy_retire_never_is():
    p = Pool(HYBRID, 8, 20, 2)  # slot 1 only
    a = p.lease(10)
    assert p.checkpoint(a, 10) == Denied.Busy or p.checkpoint(a, 10) == Denied.Remapping
    cp = p.retire(a, 10)
    assert cp.has_slot and cp.seq_slot() == 1
    cp.release()
    assert p.used == 0 and p.slots_used == 0


def test_no_layout_holds_a_slot():
    p = Pool(HYBRID, 8, 5, 1)
    assert p.slots == 1
    assert p.lease(1) == Denied.ExceedsPool


def test_the_pad_is_not_a_row():
    p = pool4()  # 8 pages of 4 tokens
    pad = p.lease_pad()
    assert isinstance(pad, Lease) and pad.pages == [0]
    assert p.max_seq_tokens == 28
    assert p.lease(32) == Denied.ExceedsRow(28)
    assert p.used == 1


# slots, lines, rows


def test_slots_count_up_and_are_reused():
    p = hybrid_pool()
    a, b, c = p.lease(1), p.lease(1), p.lease(1)
    assert [a.slot, b.slot, c.slot] == [1, 2, 3] and p.slots_used == 3
    b.release()
    d = p.lease(1)
    assert d.slot == 2


def test_a_free_page_cannot_make_a_slot():
    p = Pool(HYBRID, 8, 14, 2)  # slots 0,1 (6 chunks) + 4 pages (8 chunks)
    a = p.lease(48)
    assert a.pages == [0, 1, 2] and a.slot == 1
    # the one free page (2 chunks) is the request's own and could not make a 3-chunk slot anyway
    assert p.lease(1) == Denied.Busy


def test_lines_and_rows():
    p = hybrid_pool()
    a = p.lease(20)
    assert a.slot == 1
    assert [a.seq_line("line_index", r) for r in range(3)] == [3, 4, 5]
    with pytest.raises(PoolError, match="past the table"):
        a.seq_line("line_index", 3)
    with pytest.raises(PoolError, match="unknown"):
        a.seq_line("nope", 0)
    assert a.row("block_table") == [0, 1, 0]
    q = pool()
    b = q.lease(20)
    assert b.row("draft_table") == [0, 1, 2, 3, 4, 5, 6, 7] + [0] * 8
    with pytest.raises(PoolError, match="unknown"):
        b.row("nope")


# remaps


def test_pages_from_slots():
    p = hybrid_pool()
    a = p.lease(48)
    assert a.pages == [0, 1, 2] and a.slot == 1
    assert p.lease(32) == Denied.Remapping
    assert p.lease(32) == Denied.Remapping
    assert (p.total, p.slots, p.remapped) == (4, 3, True)
    plan = p.take_pending()
    assert p.take_pending() is None
    assert plan.unmap == [("gdn", 9), ("gdn", 10), ("gdn", 11)]
    assert len(plan.map) == 2 and plan.access == [("kv", 8, 10)]
    assert (plan.made, plan.unmade) == ([("page", 4)], [("slot", 3)])
    assert p.lease(32) == Denied.Remapping
    p.complete(plan)
    b = p.lease(32)
    assert b.pages == [3, 4] and b.slot == 2
    assert (p.total, p.slots) == (5, 3)


def test_slots_from_pages():
    p = Pool(HYBRID, 8, 20, 2)  # slots 0,1 (6 chunks), pages 0..6 (14 chunks)
    assert (p.slots, p.total) == (2, 7)
    a = p.lease(1)
    assert p.lease(1) == Denied.Remapping
    plan = land(p)
    assert plan.unmade == [("page", 6), ("page", 5)] and plan.made == [("slot", 2)]
    b = p.lease(1)
    assert b.slot == 2 and (p.total, p.slots) == (5, 3)
    a.release()
    b.release()


# sharing, restore, fork


def test_checkpoint_shares_pages_and_outlives_the_lease():
    p = pool4()
    a = p.lease(10)
    assert a.pages == [0, 1, 2]
    cp, copies = p.checkpoint(a, 10)
    assert cp.page_ids() == [0, 1, 3] and copies == Copies(pages=[(2, 3)])
    assert a.shared == 2 and p.used == 4
    a.release()
    assert p.used == 3
    cp.release()
    assert p.used == 0


def test_checkpoints_along_one_lease_share_one_chain():
    p = pool4()
    a = p.lease(16)
    deep, c1 = p.checkpoint(a, 12)
    assert deep.page_ids() == [0, 1, 2] and not c1
    shallow, c2 = p.checkpoint(a, 6)
    assert shallow.page_ids() == [0, 4] and c2.pages == [(1, 4)]
    for h in (a, deep, shallow):
        h.release()
    assert p.used == 0


def test_restore_shares_whole_pages_and_copies_the_partial_one():
    p = pool4()
    a = p.lease(10)
    cp, _ = p.checkpoint(a, 10)
    a.release()
    b, copies = p.restore(cp, 10, 14)
    assert b.pages == [0, 1, 2, 4] and copies.pages == [(3, 2)]
    assert (b.prefix, b.shared) == (10, 2)
    c, copies = p.restore(cp, 8, 9)
    assert c.pages == [0, 1, 5] and not copies
    for h in (b, c, cp):
        h.release()
    assert p.used == 0


def test_fork_copies_the_partial_page_and_the_slot():
    p = hybrid_pool4()
    a = p.lease(10)
    child, copies = p.fork(a, 6, 12)
    assert child.pages == [0, 3, 4] and copies.pages == [(1, 3)] and copies.slot == (1, 2)
    assert a.shared == 1 and child.shared == 1 and child.prefix == 6
    a.release()
    child.release()
    assert p.used == 0 and p.slots_used == 0


def test_hybrid_checkpoint_copies_the_slot_and_retire_moves_it():
    p = hybrid_pool4()
    a = p.lease(8)
    cp, copies = p.checkpoint(a, 8)
    assert copies.slot == (1, 2) and not copies.pages
    assert p.slots_used == 2 and p.stored_slots == 1
    kept = p.retire(a, 8)
    assert kept.seq_slot() == 1 and kept.page_ids() == [0, 1]
    cp.release()
    kept.release()
    assert (p.used, p.slots_used, p.stored_slots, p.sealed_pages) == (0, 0, 0, 0)


def test_slot_only_leases_move_only_the_slot():
    p = hybrid_pool4()
    a = p.lease_slot()
    assert a.pages == [] and a.slot == 1
    cp, copies = p.checkpoint(a, 7)
    assert cp.pages == 0 and copies == Copies(slot=(1, 2))
    assert p.restore(cp, 7, 8) == Denied.Remapping or True
    with pytest.raises(PoolError, match="restoring 3 tokens of a checkpoint of 7 \\(with a slot\\)"):
        p.restore(cp, 3, 8)
    a.release()
    cp.release()


def test_a_long_chain_releases_without_recursion():
    g = Geometry(paged=(("kv", 1),), page_tables=(("t", "kv", 300_000, 1),))
    p = Pool(g, 1 << 16, 4, 0)
    a = p.lease(200_000)
    cp = p.retire(a, 200_000)
    assert p.used == 200_000 and p.sealed_pages == 200_000
    cp.release()
    assert p.used == 0 and p.sealed_pages == 0


# caller bugs


def test_past_the_lease():
    a = pool4().lease(8)
    with pytest.raises(PoolError, match="past the lease"):
        a.slot_of(8)


def test_restoring_short_of_a_stateful_checkpoint():
    p = hybrid_pool4()
    a = p.lease(10)
    cp = p.retire(a, 10)
    with pytest.raises(PoolError, match=r"restoring 4 tokens of a checkpoint of 10 \(with a slot\)"):
        p.restore(cp, 4, 20)


def test_a_lease_refuses_the_pages_it_sealed():
    p = pool4()
    a = p.lease(12)
    assert a.slot_of(5) == 5
    p.checkpoint(a, 8)[0].release()
    with pytest.raises(PoolError, match="inside a sealed page"):
        a.slot_of(5)
    assert a.slot_of(8) == 8


def test_a_restored_lease_refuses_the_shared_prefix():
    p = pool4()
    a = p.lease(10)
    cp, _ = p.checkpoint(a, 10)
    b, _ = p.restore(cp, 10, 16)
    with pytest.raises(PoolError, match="inside the shared prefix"):
        b.slot_of(9)
    assert b.slot_of(10) == b.pages[2] * 4 + 2


def test_released_handles_refuse():
    p = pool4()
    a = p.lease(4)
    a.release()
    with pytest.raises(PoolError):
        a.release()
    with pytest.raises(PoolError):
        p.checkpoint(a, 4)


def test_all_is_sorted_and_complete():
    import pool

    assert pool.__all__ == sorted(pool.__all__)
    public = {n for n in dir(pool) if not n.startswith("_") and n[0].isupper() or n in ("runs", "chunks_for", "chunk_size")}
    modules = {"chunks", "denied", "geometry", "host", "lease", "pages", "prefix", "store", "tokens"}
    assert public - modules == set(pool.__all__)


def test_pool_imports_nothing_of_the_project():
    import ast
    import pathlib

    for path in pathlib.Path(__file__).parents[1].joinpath("pool").glob("*.py"):
        for node in ast.walk(ast.parse(path.read_text())):
            names = [a.name for a in node.names] if isinstance(node, ast.Import) else (
                [node.module or ""] if isinstance(node, ast.ImportFrom) else [])
            for name in names:
                top = name.split(".")[0]
                # array and numpy hold the accounting in arrays; none of these does I/O. kern (the root
                # exception, the token ids) holds leaves only (tests/test_imports.py: they import nothing)
                assert top in {"pool", "kern", "__future__", "array", "bisect", "dataclasses", "enum", "heapq", "math",
                               "numpy", "typing"}, (path, name)


@pytest.mark.parametrize("geometry, chunk, chunks, first_slots", [
    (TWO_PAGED, 8, 18, 0), (HYBRID, 8, 20, 4), (PAGED4, 4, 8, 0), (HYBRID4, 4, 18, 3),
    (ODD, 8, 23, 2), (ODD, 8, 7, 1), (Geometry(paged=(("a", 3), ("b", 5)), page_tables=(("t", "a", 8, 4),)), 16, 41, 0),
])
def test_the_first_layout_equals_making_pages_one_by_one(geometry, chunk, chunks, first_slots):
    """The vectorised first layout makes the same pages, maps the same positions to the same chunks
    in the same order, with the same users per position, as making page 0, 1, 2, ... one at a time
    while the free chunks cover the next page (the rule it replaces)."""
    from pool.chunks import PAGE, SLOT, Chunks, Remap

    p, plan = Pool.new(geometry, chunk, chunks, first_slots)
    table, want = Chunks(p.arenas, chunks), Remap()
    if geometry.has_slots:
        for s in range(max(first_slots, 1)):
            table.make(SLOT, s, want)
    i = 0
    while i < p.pages_max and table.cost(PAGE, i) <= len(table.free):
        table.make(PAGE, i, want)
        i += 1
    assert p.total == i
    assert (plan.map, plan.access, plan.made, plan.unmap, plan.unmade) == (
        want.map, want.access, want.made, want.unmap, want.unmade)
    assert p._chunks.free == table.free and p._chunks.users == table.users and p._chunks.chunk_of == table.chunk_of
