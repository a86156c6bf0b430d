"""`Request.take`'s bulk path (no stop strings or ids, no EOS that ends the answer: the tokens that fit
taken at once) commits exactly what the per-token loop does.

Property: for any max_tokens, ignore_eos and sequence of steps' token lists (EOS among them or not),
two requests fed the same steps, one through `take` and one through the loop alone (`_loop_take`, the
loop as it stands in `take`), agree after every step on what the client gets, on `out`, `emitted`,
`reason` and `anchor`; and `take_run` on top of each agrees on the steps it counts."""

from __future__ import annotations

from hypothesis import given, settings
from hypothesis import strategies as st

from serve.core.request import EOS, Request


def _request(max_tokens: int, ignore_eos: bool) -> Request:
    return Request("r", [1, 2, 3], max_tokens, 1, lambda u: None, ignore_eos=ignore_eos)


def _loop_take(req: Request, tokens: list[int]) -> list[int]:
    """`take` with its bulk path bypassed: the request's stops set to a stand-in that never sees a
    stop, which sends every call through the per-token loop."""

    class Never:
        def sees(self, t: int) -> bool:
            return False

        def end(self) -> bool:
            return False

    req.stops = Never()
    try:
        return req.take(tokens)
    finally:
        req.stops = None


def _state(req: Request) -> tuple:
    return list(req.out), list(req.emitted), req.reason, req.anchor


tokens = st.lists(st.sampled_from([0, 7, 65, 255, EOS]), min_size=1, max_size=20)


@settings(max_examples=300, deadline=None)
@given(max_tokens=st.integers(1, 40), ignore_eos=st.booleans(), steps=st.lists(tokens, min_size=1, max_size=8))
def test_the_bulk_take_commits_what_the_loop_commits(max_tokens, ignore_eos, steps):
    fast, slow = _request(max_tokens, ignore_eos), _request(max_tokens, ignore_eos)
    for toks in steps:
        assert fast.take(list(toks)) == _loop_take(slow, list(toks))
        assert _state(fast) == _state(slow)
        if fast.reason is not None:
            break


@settings(max_examples=200, deadline=None)
@given(max_tokens=st.integers(1, 40), ignore_eos=st.booleans(), steps=st.lists(tokens, min_size=1, max_size=6))
def test_take_run_counts_the_same_steps_either_way(max_tokens, ignore_eos, steps):
    fast, slow = _request(max_tokens, ignore_eos), _request(max_tokens, ignore_eos)
    for toks in steps:
        got = fast.take_run(list(toks))
        slow_new = _loop_take(slow, list(toks))
        used = len(slow_new) if slow.reason is not None else len(toks)
        if used < len(toks):
            del slow.emitted[used - len(toks):]
        assert got == (slow_new, used)
        assert _state(fast) == _state(slow)
        if fast.reason is not None:
            break


def test_a_full_answer_takes_nothing_more():
    req = _request(3, True)
    assert req.take([5, 6]) == [5, 6] and req.reason is None and req.anchor == 6
    assert req.take([7, 8]) == [7] and req.reason == "length" and req.out == [5, 6, 7]
    assert req.emitted == [5, 6, 7, 8]
