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
