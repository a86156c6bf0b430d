"""Where `kern serve --stages N` cuts, and the flags that pick the stages."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from serve.pipeline.plan import PlanError, balanced, parse_at


def test_balanced_cuts_even_shares_of_the_calls():
    # toy-layers' shape: embed, 4 layers, head = 6 calls; a cut may fall before any layer or the head
    assert balanced(6, [1, 2, 3, 4, 5], 2) == [3]
    assert balanced(6, [1, 2, 3, 4, 5], 3) == [2, 4]
    assert balanced(12, [2, 5, 6, 11], 2) == [6]


@settings(max_examples=200, deadline=None)
@given(st.data())
def test_balanced_points_are_increasing_candidates(data):
    """For any candidates and any stage count they can serve: N-1 strictly increasing points, each
    a candidate, and no stage's share is further from calls/N than a candidate allows."""
    calls = data.draw(st.integers(2, 60))
    cands = sorted(data.draw(st.sets(st.integers(1, calls - 1), min_size=1)))
    stages = data.draw(st.integers(2, len(cands) + 1))
    got = balanced(calls, cands, stages)
    assert len(got) == stages - 1
    assert all(a < b for a, b in zip(got, got[1:]))
    assert set(got) <= set(cands)
    if stages == 2:  # one point: the candidate nearest the middle
        assert abs(got[0] - calls / 2) == min(abs(c - calls / 2) for c in cands)


def test_too_few_places_to_cut_is_a_clear_error():
    with pytest.raises(PlanError, match="3 stages need 2 cut points; the manifest has 1 place"):
        balanced(6, [3], 3)


@pytest.mark.parametrize("text,want", [("3", [3]), ("2,4", [2, 4]), (" 2, 4 ", [2, 4])])
def test_parse_at(text, want):
    assert parse_at(text) == want


@pytest.mark.parametrize("text", ["a", "2;4", ","])
def test_parse_at_names_a_bad_value(text):
    with pytest.raises(PlanError, match="--at"):
        parse_at(text)


def test_balanced_with_held_states_gives_every_stage_a_state():
    # toy-layers: embed (no state), 4 layers (one state each), head (none): a cut at 1 or 5 leaves a stage empty
    held = {1: 0, 2: 1, 3: 2, 4: 3, 5: 4}
    assert balanced(6, [1, 2, 3, 4, 5], 4, held, 4) == [2, 3, 4]
    with pytest.raises(PlanError, match="5 stages cannot each hold a state.*--stages 1..4"):
        balanced(6, [1, 2, 3, 4, 5], 5, held, 4)


@settings(max_examples=200, deadline=None)
@given(st.data())
def test_balanced_with_held_states_never_leaves_a_stage_empty(data):
    """For any non-decreasing count of states held below each candidate: either N-1 points whose
    counts strictly increase from over 0 to under the total (every stage holds one), or a PlanError
    exactly when fewer than N-1 distinct counts lie strictly between 0 and the total."""
    calls = data.draw(st.integers(2, 40))
    cands = sorted(data.draw(st.sets(st.integers(1, calls - 1), min_size=1)))
    steps = data.draw(st.lists(st.integers(0, 2), min_size=len(cands), max_size=len(cands)))
    held, n = {}, 0
    for c, d in zip(cands, steps):
        n += d
        held[c] = n
    total = n + data.draw(st.integers(0, 2))
    stages = data.draw(st.integers(2, len(cands) + 1))
    possible = len({h for h in held.values() if 0 < h < total}) >= stages - 1
    if not possible:
        with pytest.raises(PlanError):
            balanced(calls, cands, stages, held, total)
        return
    got = balanced(calls, cands, stages, held, total)
    counts = [0] + [held[c] for c in got] + [total]
    assert len(got) == stages - 1 and set(got) <= set(cands)
    assert all(a < b for a, b in zip(counts, counts[1:])), (got, counts)


def test_a_cut_is_written_once_per_content_and_shared(tmp_path):
    """Every server running the same cut gets the same directory (nothing is left per run, however a
    server ends); another cut gets another; a half-made directory in the way is a clear error."""
    import threading

    from manifests import load
    from manifests.config import resolve
    from serve.pipeline.plan import shared_stages

    m = load(resolve("toy-layers").manifest)
    got: list = []
    threads = [threading.Thread(target=lambda: got.append(shared_stages(m, [3], tmp_path))) for _ in range(8)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert len(got) == 8 and all(g == got[0] for g in got), got
    assert [p.name for p in got[0]] == ["toy-layers.stage0.json", "toy-layers.stage1.json"]
    assert all(p.is_file() for p in got[0])
    other = shared_stages(m, [2], tmp_path)
    assert other[0].parent != got[0][0].parent
    assert sorted(p.name for p in tmp_path.iterdir()) == sorted({got[0][0].parent.name, other[0].parent.name})
    got[0][1].unlink()
    with pytest.raises(PlanError, match="remove it"):
        shared_stages(m, [3], tmp_path)
