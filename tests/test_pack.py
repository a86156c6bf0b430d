"""pack(): the reference's table, then the drain property, exhaustively over a small grid and by hypothesis."""

import itertools

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from serve.core.pack import Bounds, Waiting, pack

B = Bounds(rows=8, seqs=3, context=20)


@pytest.mark.parametrize("waiting, plan", [
    ([(0, 5), (0, 5), (0, 5)], [(0, 5), (1, 3)]),   # the call's rows run out inside the second
    ([(0, 20)], [(0, 8)]),                           # a long prompt goes a chunk at a time
    ([(16, 8), (0, 8)], [(0, 4)]),                   # the context stops the oldest; the next waits
    ([(10, 2), (0, 8)], [(0, 2), (1, 6)]),           # the context (12 + 6) bounds the second
    ([(20, 2)], []),                                 # no room at all: nothing, not a skip
])
def test_the_reference_table(waiting, plan):
    assert pack([Waiting(*w) for w in waiting], B) == plan


def test_sequences_with_nothing_left_are_passed_over():
    assert pack([Waiting(3, 0), Waiting(0, 2), Waiting(5, 0), Waiting(0, 1)], B) == [(1, 2), (3, 1)]


def test_the_call_sequences_bound_the_plan():
    assert pack([Waiting(0, 1)] * 5, B) == [(0, 1), (1, 1), (2, 1)]


def drain(waiting: list[Waiting], b: Bounds, limit: int = 1000) -> list[list[int]]:
    """Apply pack() until nothing is left, checking every plan; the positions fed to each sequence."""
    fed = [[] for _ in waiting]
    for _ in range(limit):
        if all(w.left == 0 for w in waiting):
            return fed
        plan = pack(waiting, b)
        assert plan, f"nothing planned while rows are left: {waiting}"
        idx = [i for i, _ in plan]
        assert idx == sorted(set(idx)), f"indices not strictly increasing: {plan}"
        assert idx[0] == next(i for i, w in enumerate(waiting) if w.left), "the oldest with rows left goes first"
        assert len(plan) <= b.seqs
        assert sum(n for _, n in plan) <= b.rows
        assert sum(waiting[i].pos + n for i, n in plan) <= b.context
        for i, n in plan:
            w = waiting[i]
            assert 1 <= n <= w.left
            fed[i] += range(w.pos, w.pos + n)
            waiting[i] = Waiting(w.pos + n, w.left - n)
    raise AssertionError(f"not drained after {limit} calls: {waiting}")


def test_every_small_input_drains_within_its_bounds():
    """Over lefts 0..3 x 0..3 x 0..9 and a first position 0..2: every plan keeps the call's rows,
    sequences and context, names sequences in increasing order starting at the oldest with rows
    left, and repeated plans feed every row of every sequence exactly once, in order, until all
    is drained."""
    n = 0
    for lefts in itertools.product(range(4), range(4), range(10)):
        for first in range(3):
            start = [Waiting(first, lefts[0]), Waiting(0, lefts[1]), Waiting(0, lefts[2])]
            fed = drain(list(start), B)
            assert fed == [list(range(w.pos, w.pos + w.left)) for w in start]
            n += 1
    assert n == 480


@settings(max_examples=200, deadline=None)
@given(
    st.integers(1, 12), st.integers(1, 5), st.integers(1, 40),
    st.lists(st.tuples(st.integers(0, 40), st.integers(0, 40)), max_size=8),
)
def test_any_seatable_input_drains(rows, seqs, context, pairs):
    """Whatever the bounds, waiting sequences that each fit the context alone (pos + left <= context)
    drain: every row fed exactly once, in order, every plan within its bounds."""
    start = [Waiting(p, l) for p, l in pairs if p + l <= context]
    fed = drain(list(start), Bounds(rows, seqs, context))
    assert fed == [list(range(w.pos, w.pos + w.left)) for w in start]


def test_a_sequence_past_the_context_stalls_everyone_behind_it():
    """Why admission must refuse a prompt the context can never seat: pack() stops, never skips."""
    waiting = [Waiting(0, 25), Waiting(0, 3)]
    for _ in range(3):
        plan = pack(waiting, B)
        for i, n in plan:
            waiting[i] = Waiting(waiting[i].pos + n, waiting[i].left - n)
    assert waiting[0] == Waiting(20, 5)
    assert pack(waiting, B) == []
