"""The params session's own reading of a response (e2e/scenarios/params.py `shape`, `compare`): a
stream's chunks joined are judged as the whole response would be, and each field that differs from
the expectation is named. Pure: no server."""

from __future__ import annotations

from e2e.scenarios.params import compare, shape, stops_from
from verdicts.params import expect, text_of

EOS = 256
CONT = list(b"hello world") + [EOS]


def whole(want, served, chat=False):
    c = {"finish_reason": want.finish, "stop_reason": want.stop_reason, "token_ids": want.token_ids,
         "prompt_token_ids": served}
    c.update({"message": {"content": want.text}} if chat else {"text": want.text})
    return {"choices": [c], "usage": {"prompt_tokens": len(served), "completion_tokens": len(want.token_ids)}}


def streamed(want, served, chat=False, cut=4, done=True):
    """The same answer as two chunks (text split at `cut`), prompt ids in the first only."""
    def choice(text, ids, last):
        c = {"finish_reason": want.finish if last else None, "stop_reason": want.stop_reason if last else None,
             "token_ids": ids}
        c.update({"delta": {"content": text}} if chat else {"text": text})
        return {"choices": [c]}
    first = choice(want.text[:cut], want.token_ids[:cut], False)
    second = choice(want.text[cut:], want.token_ids[cut:], True)
    first["choices"][0]["prompt_token_ids"] = served
    return {"chunks": [first, second], "done": done,
            "usage": {"prompt_tokens": len(served), "completion_tokens": len(want.token_ids)}}


def test_whole_and_streamed_answers_read_alike():
    served = list(b"P: ")
    want = expect(CONT, 20, EOS, stop=("o w",), include=True)
    for chat in (False, True):
        assert compare(shape(whole(want, served, chat), chat), want, served) is None
        assert compare(shape(streamed(want, served, chat), chat), want, served) is None


def test_each_difference_is_named():
    served = list(b"P: ")
    want = expect(CONT, 20, EOS, stop=("o w",))
    bad = streamed(want, served, done=False)
    assert "[DONE]" in compare(shape(bad, False), want, served)
    bad = streamed(want, served)
    del bad["chunks"][0]["choices"][0]["prompt_token_ids"]
    assert "prompt_token_ids" in compare(shape(bad, False), want, served)
    bad = whole(want, served)
    bad["choices"][0]["stop_reason"] = None
    assert "stop_reason" in compare(shape(bad, False), want, served)
    bad = whole(want, served)
    bad["usage"]["completion_tokens"] += 1
    assert "usage" in compare(shape(bad, False), want, served)
    bad = streamed(want, served)
    bad["chunks"][1]["choices"][0]["text"] += "o w"  # the stop string leaked into the last chunk
    assert "text" in compare(shape(bad, False), want, served)
    assert "prompt_token_ids" in compare(shape(whole(want, served[1:]), False), want, served)


def test_drawn_stop_strings_are_of_the_text_or_never_in_it():
    """Each drawn string is cut from the answer's text (1-64 characters, so it matches) or is not in
    it at all (so it never matches); both kinds are drawn, lengths across the whole range."""
    import random
    text = text_of(list(range(32, 127)) * 2)
    rng = random.Random(5)
    drawn = [s for _ in range(200) for s in stops_from(rng, text)]
    cut = [s for s in drawn if s in text]
    assert all(1 <= len(s) <= 64 for s in cut) and all(len(s) <= 65 for s in drawn)
    assert len(cut) < len(drawn) and {1, 64} <= {len(s) for s in cut}
