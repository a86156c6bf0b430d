"""The gate's parameter rule (verdicts/params.py) against the server's own request path.

Property: for any continuation (byte tokens, EOS, bad UTF-8) and any stop strings, stop token ids,
include flag, ignore_eos and max_tokens, what `expect` predicts (token ids, text, finish reason,
stop reason) is what the server's `Request.take` and `Reply` produce from the same tokens. The two
are written apart: this holds each to the other. Plus the rule's own corner cases by hand, and
`decoded_path` (the policy oracle's path of an answer past EOS) held to `toy.model.path` wherever the
model's own path runs to max_tokens.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from hypothesis import assume, given, settings
from hypothesis import strategies as st

from serve.api.app import Reply
from serve.api.validate import Ask
from serve.core.request import Done, Request, Stops, Update
from tests.stop_strings import stop_strings
from verdicts.params import decoded_path, expect, text_of

EOS = 256


def served(cont, max_tokens, stop=(), stop_ids=(), include=False, ignore_eos=False):
    """The server's answer to a model that emits `cont`, one token a step."""
    stops = Stops(list(stop), list(stop_ids), include) if stop or stop_ids else None
    req = Request("req-0", [65], max_tokens, 1, send=lambda u: None, stops=stops, ignore_eos=ignore_eos)
    ask = Ask(ids=[65], max_tokens=max_tokens, stream=False, return_token_ids=True, include_usage=False, chat=False,
              ignore_eos=ignore_eos, stop=tuple(stop), stop_ids=tuple(stop_ids), include_stop=include)
    reply = Reply(req, ask, "toy")
    for t in cont:
        new = req.take([t])
        done = None
        if req.reason is not None:
            s = req.stops
            done = Done(req.reason, stop_reason=s.reason if s else None, text_end=s.text_end if s else None,
                        hide_last=s.hide_last if s else False)
        reply.add(Update(new, done))
        if done is not None:
            break
    return reply.tokens, reply.text(), req.reason, req.stops.reason if req.stops else None


tokens = st.lists(st.one_of(st.integers(32, 126), st.integers(0, 255), st.just(EOS)), min_size=1, max_size=80)


@st.composite
def case(draw):
    cont = draw(tokens)
    stop = stop_strings(draw, text_of(cont), 64, 8)
    stop_ids = draw(st.lists(st.sampled_from(cont), max_size=2, unique=True)) if draw(st.booleans()) else []
    ignore_eos = draw(st.booleans())
    include = draw(st.booleans())
    if not ignore_eos and EOS in cont:  # the model's continuation ends at its first EOS
        cont = cont[:cont.index(EOS) + 1]
    return cont, len(cont) if draw(st.booleans()) else draw(st.integers(1, len(cont))), stop, stop_ids, include, \
        ignore_eos


@settings(max_examples=500, deadline=None)
@given(case())
def test_the_rule_is_what_the_server_answers(c):
    cont, m, stop, stop_ids, include, ignore_eos = c
    want = expect(cont, m, EOS, stop=tuple(stop), stop_ids=tuple(stop_ids), include=include, ignore_eos=ignore_eos)
    got = served(cont, m, stop, stop_ids, include, ignore_eos)
    assert got == (want.token_ids, want.text, want.finish, want.stop_reason)


def test_corner_cases_by_hand():
    cont = list(b"hello world") + [EOS]
    assert expect(cont, 20, EOS).finish == "stop" and expect(cont, 20, EOS).token_ids == cont
    assert expect(cont, 11, EOS).finish == "length" and expect(cont, 12, EOS).finish == "stop"  # EOS at the edge
    w = expect(cont, 20, EOS, stop=("o w",))
    assert (w.text, w.stop_reason, w.token_ids) == ("hell", "o w", list(b"hello w"))
    assert expect(cont, 20, EOS, stop=("o w",), include=True).text == "hello w"
    w = expect(cont, 20, EOS, stop_ids=(ord("w"),))
    assert (w.text, w.stop_reason, w.token_ids[-1]) == ("hello ", ord("w"), ord("w"))
    assert expect(cont, 20, EOS, stop=("rld", "wor")).stop_reason == "wor"  # completed first wins
    assert expect(list(b"ab"), 2, EOS, echo="P: ").text == "P: ab"
    try:
        expect(list(b"ab"), 5, EOS)
    except ValueError:
        pass
    else:
        raise AssertionError("a continuation shorter than the answer can run must be refused")


TOY = Path(__file__).resolve().parent.parent / "manifests" / "toy"
MANIFESTS = {name: json.loads((TOY / f"{name}.json").read_text())
             for name in ("toy-paged", "toy-stateful", "toy-layers")}


@settings(max_examples=150, deadline=None)
@given(st.sampled_from(sorted(MANIFESTS)), st.lists(st.integers(0, 255), min_size=1, max_size=40),
       st.integers(1, 24), st.booleans())
def test_decoded_path_is_the_models_path_of_an_answer_run_to_max_tokens(name, ids, m, emits):
    """Property: a token a step, an answer of max_tokens tokens has the path toy.model.path gives."""
    from toy.model import path
    emits = emits or name == "toy-layers"  # the layered toy prefills emitting
    want = path(ids, m, MANIFESTS[name], 1, emits)
    assume(want["reason"] == "length")
    assert decoded_path(len(ids), want["answer"], emits) == want


def test_decoded_path_runs_past_eos():
    p = decoded_path(5, [65, EOS, 66, EOS], True)
    assert (p["reason"], p["first"], p["counts"], p["fed"]) == ("length", 1, [1, 1, 1], 8)
    p = decoded_path(5, [65, EOS, 66, EOS], False)
    assert (p["first"], p["counts"], p["fed"]) == (0, [1, 1, 1, 1], 8)


def test_vllms_rules_differ_from_kerns_where_vllm_documents_otherwise():
    """The vLLM rules (held to vLLM's own code in tests/test_vllm_params_rules.py, where vLLM is
    installed) part from kern's in four places, each by hand here: a partial character is held, never
    flushed; of two strings completing on one token the earlier-ending wins (kern: the first given);
    min_tokens masks EOS and holds stop strings off until it; echo adds no prompt text."""
    from verdicts.params import RULES

    kern, vllm = RULES["kern"], RULES["vllm"]
    partial = [0x61, 0xE2, 0x82]  # "a" and two bytes of a three-byte character
    assert expect(partial, 3, EOS).text == "a\ufffd"
    assert expect(partial, 3, EOS, rules=vllm).text == "a"
    bad = [0x78, 0xC3, 0x79]  # "x", a lead byte, "y": the third token shows "\ufffdy" at once
    k, v = (expect(bad, 3, EOS, stop=("y", "\ufffd"), rules=r) for r in (kern, vllm))
    assert (k.text, k.finish, k.stop_reason) == ("x\ufffd", "stop", "y")
    assert (v.text, v.finish, v.stop_reason) == ("x", "stop", "\ufffd")
    ab = [0x61, 0x62, 0x61, 0x62, 0x63, EOS]  # "ababc"
    got = expect(ab, 8, EOS, stop=("ab",), rules=vllm, min_tokens=3)  # the first "ab" ends at token 2: too soon
    assert (got.token_ids, got.text, got.finish, got.stop_reason) == ([0x61, 0x62, 0x61, 0x62], "ab", "stop", "ab")
    assert expect(ab, 8, EOS, stop=("ab",), rules=vllm).token_ids == [0x61, 0x62]
    with pytest.raises(ValueError, match="refused under the kern rules"):
        expect(ab, 8, EOS, rules=kern, min_tokens=3)
    with pytest.raises(ValueError, match="not a masked continuation"):
        expect([0x61, EOS], 8, EOS, rules=vllm, min_tokens=3)
