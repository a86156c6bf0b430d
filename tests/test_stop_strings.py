"""Stop strings of any length, matched across token boundaries and across stream chunks.

Properties (hypothesis), each against a brute-force rule written here without `serve.core.request`:
- the answer ends at the first token after which the text decoded so far (complete characters only)
  holds one of the stop strings, the first of them in the order given; the text is cut before it (or
  after it with `include_stop_str_in_output`); an answer that never completes one runs to its end and
  its flushed text (U+FFFD for a cut character) is matched last;
- a stream's chunks, however the tokens are split into steps, concatenate to the whole text.

The regression these exist for: the matcher kept the wrong tail between tokens, so stop strings of 4
or more characters were missed (6+ always).
"""

from __future__ import annotations

import codecs

from hypothesis import given, settings
from hypothesis import strategies as st

from serve.api.app import Reply
from serve.api.validate import Ask
from serve.core.request import Done, Request, Stops, Update

EOS = 256


def rule(data: bytes, stops: list[str], include: bool) -> tuple[int, str | None, str]:
    """(tokens kept, the stop string that ended it or None, the answer's text): the brute force."""
    for k in range(1, len(data) + 1):
        text = codecs.getincrementaldecoder("utf-8")("replace").decode(data[:k])  # complete characters
        for s in stops:
            i = text.find(s)
            if i >= 0:
                return k, s, text[:i + len(s)] if include else text[:i]
    text = data.decode("utf-8", "replace")
    for s in stops:
        i = text.find(s)
        if i >= 0:
            return len(data), s, text[:i + len(s)] if include else text[:i]
    return len(data), None, text


ascii_answer = st.binary(min_size=1, max_size=160).map(lambda b: bytes(32 + x % 95 for x in b))
utf8_answer = st.text(min_size=1, max_size=80).map(lambda t: t.encode("utf-8"))
any_bytes = st.binary(min_size=1, max_size=120)


@st.composite
def case(draw, answers=st.one_of(ascii_answer, utf8_answer, any_bytes)):
    data = draw(answers)
    text = data.decode("utf-8", "replace")
    stops = []
    for _ in range(draw(st.integers(1, 3))):
        if draw(st.booleans()) and text:  # a string the text holds: any length 1-64, any position
            n = draw(st.integers(1, min(64, len(text))))
            i = draw(st.integers(0, len(text) - n))
            stops.append(text[i:i + n])
        else:
            stops.append(draw(st.text(min_size=1, max_size=64)))
    return data, stops, draw(st.booleans())


def run_stops(data: bytes, stops: list[str], include: bool) -> tuple[int, Stops]:
    s = Stops(stops, [], include)
    for k, t in enumerate(data, 1):
        if s.sees(t):
            return k, s
    s.end()
    return len(data), s


@settings(max_examples=400, deadline=None)
@given(case())
def test_the_answer_ends_where_the_rule_says(c):
    data, stops, include = c
    kept, s = run_stops(data, stops, include)
    want_kept, want_reason, want_text = rule(data, stops, include)
    assert (kept, s.reason) == (want_kept, want_reason)
    text = data[:kept].decode("utf-8", "replace")
    assert (text if s.text_end is None else text[:s.text_end]) == want_text


@settings(max_examples=200, deadline=None)
@given(st.integers(1, 64), st.data())
def test_every_length_1_to_64_is_honoured(n, data):
    answer = data.draw(st.binary(min_size=n, max_size=n + 100).map(lambda b: bytes(32 + x % 95 for x in b)))
    i = data.draw(st.integers(0, len(answer) - n))
    stop = answer[i:i + n].decode()
    kept, s = run_stops(answer, [stop], False)
    first = answer.decode().find(stop)
    assert s.reason == stop and kept == first + n and s.text_end == first


@settings(max_examples=300, deadline=None)
@given(case(), st.lists(st.integers(1, 9), min_size=1, max_size=40))
def test_stream_chunks_concatenate_to_the_whole_text(c, splits):
    """The tokens reach the reply in steps of random sizes; the chunks it releases, joined, are the
    non-streamed text, and no chunk ever released a character past the cut."""
    data, stops, include = c
    req = Request("req-0", [65], 10_000, 1, send=lambda u: None, stops=Stops(stops, [], include))
    ask = Ask(ids=[65], max_tokens=10_000, stream=True, return_token_ids=True, include_usage=False, chat=False,
              stop=tuple(stops), include_stop=include)
    reply = Reply(req, ask, "toy")
    tokens = list(data) + [EOS]
    chunks, at, i = [], 0, 0
    while req.reason is None:
        n = splits[i % len(splits)]
        i += 1
        step = tokens[at:at + n]
        at += n
        new = req.take(step)
        done = Done(req.reason, 0, None, None, stop_reason=req.stops.reason, text_end=req.stops.text_end,
                    hide_last=req.stops.hide_last) if req.reason is not None else None
        chunks.append(reply.add(Update(new, done)))
    assert "".join(chunks) == reply.text()
    _, want_reason, want_text = rule(data, stops, include)
    assert reply.text() == want_text and req.stops.reason == want_reason


@settings(max_examples=300, deadline=None)
@given(data=st.one_of(ascii_answer, utf8_answer, any_bytes), splits=st.lists(st.integers(1, 9), min_size=1, max_size=20),
       chat=st.booleans(), ids=st.booleans(), usage=st.sampled_from(["none", "end", "every"]), echo=st.booleans(),
       model=st.text(min_size=1, max_size=12), named=st.one_of(st.none(), st.text(min_size=1, max_size=12)))
def test_a_chunk_made_from_the_template_is_the_chunk(data, splits, chat, ids, usage, echo, model, named):
    """`Reply.chunk_text` (the JSON of a stream's middle chunks cut from a template made once) parses to
    what `Reply.chunk` builds for the same updates, for every chunk of a stream: completions and chat,
    any text (a quote, a backslash, a character JSON escapes), any model and request name, with and
    without token ids, usage at the end or on every chunk, echo."""
    import json

    def reply() -> Reply:
        req = Request("req-0", [65, 66], 10_000, 1, send=lambda u: None)
        ask = Ask(ids=[65, 66], max_tokens=10_000, stream=True, return_token_ids=ids, include_usage=usage != "none",
                  chat=chat, continuous_usage=usage == "every", echo=echo and not chat, request_id=named)
        return Reply(req, ask, model)

    built, cut = reply(), reply()
    cut.created = built.created  # made a moment apart: the same second
    tokens = list(data)
    at, i = 0, 0
    while at < len(tokens):
        n = splits[i % len(splits)]
        i += 1
        step, at = tokens[at:at + n], at + n
        done = Done("length", 0, None) if at >= len(tokens) else None
        assert json.loads(cut.chunk_text(Update(step, done))) == built.chunk(Update(step, done)), i
