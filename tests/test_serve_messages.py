"""serve/core/messages.py: the typed messages of the front-end wire and the scheduler's inbox.

Properties: every wire message comes back from `decode(encode(m))` equal to what was sent; a request
crosses the process split with every field of `Asked` (whatever values it holds, stops included);
a finish (`Done`) crosses whole; a message this build cannot read (an unknown tag, another field
count: a front end and a core from different builds) is refused by name; the inbox's dispatcher
calls the handler of the message's type and refuses a type it has none for.
"""

from __future__ import annotations

import dataclasses

import msgpack
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from serve.core import messages as m
from serve.core.request import Done, Request, Stops

text = st.text(max_size=8)
ints = st.lists(st.integers(0, 300), max_size=6)
plain = st.one_of(st.none(), st.booleans(), st.integers(-5, 5), text, ints)

WIRE = st.one_of(
    st.builds(m.Arrive, st.integers(0, 4), text, ints, st.integers(1, 9), st.just({})),
    st.builds(m.HungUp, text),
    st.builds(m.Question, st.integers(0, 99), st.sampled_from(["stats", "live"]), st.integers(0, 3)),
    st.builds(m.DrainFor, st.floats(0, 60)),
    st.builds(m.StopCore),
    st.builds(m.FrontEndDied, st.integers(1, 4)),
    st.builds(m.Ready, st.dictionaries(text, plain, max_size=3)),
    st.builds(m.Updates, st.lists(st.tuples(text, ints, st.none(), st.none()).map(list), max_size=3),
              st.one_of(st.none(), st.just([3, [[0.5, 2]]]))),
    st.builds(m.Answer, st.integers(0, 99), st.booleans(), plain),
    st.builds(m.Bye, st.integers(0, 9)),
)


@settings(max_examples=200, deadline=None)
@given(WIRE)
def test_every_wire_message_round_trips(msg):
    assert m.decode(m.encode(msg)) == msg


@settings(max_examples=200, deadline=None)
@given(ids=ints.filter(bool), max_tokens=st.integers(1, 99), t=st.floats(0, 1e6), eos=st.booleans(),
       whole=st.booleans(), client=text, stops=st.one_of(st.none(), st.tuples(st.lists(text.filter(bool), max_size=2),
                                                                              ints, st.booleans())))
def test_a_request_crosses_with_every_asked_field(ids, max_tokens, t, eos, whole, client, stops):
    s = Stops(*stops) if stops is not None and (stops[0] or stops[1]) else None
    sent = Request("req-7", ids, max_tokens, 1, None, t_arrive=t, ignore_eos=eos, stops=s, whole=whole, client=client)
    msg = m.decode(m.encode(m.Arrive.of(3, sent)))
    got = Request(msg.id, msg.ids, msg.max_tokens, 1, None, **msg.kwargs())
    assert msg.fe == 3 and (got.id, got.ids, got.max_tokens) == (sent.id, sent.ids, sent.max_tokens)
    for f in dataclasses.fields(m.Asked):
        a, b = getattr(got, f.name), getattr(sent, f.name)
        if f.name == "stops":
            assert (a is None) == (b is None)
            if a is not None:
                assert (a.strings, a.ids, a.include) == (b.strings, b.ids, b.include)
        else:
            assert a == b, f.name


def test_a_request_is_an_asked():
    """Every field the wire carries for a request is one of the request's own (inherited, keyword-only)."""
    names = {f.name for f in dataclasses.fields(Request)}
    assert {f.name for f in dataclasses.fields(m.Asked)} <= names
    assert all(f.kw_only for f in dataclasses.fields(m.Asked))


@settings(max_examples=100, deadline=None)
@given(st.builds(Done, st.sampled_from([None, "stop", "length"]), st.integers(0, 99),
                 st.sampled_from([None, "device", "host"]), st.sampled_from(["none", "kept", "not kept"]),
                 st.one_of(st.none(), st.tuples(st.integers(400, 599), text, text, st.one_of(st.none(), text))),
                 st.one_of(st.none(), text, st.integers(0, 300)), st.one_of(st.none(), st.integers(0, 99)),
                 st.booleans(), st.booleans()))
def test_a_finish_crosses_whole(done):
    raw = msgpack.packb(m.pack_done(done), use_bin_type=True)
    assert m.done_of(msgpack.unpackb(raw, raw=False)) == done


def test_a_message_this_build_cannot_read_is_refused_by_name():
    with pytest.raises(m.MessageError, match="Arrive with 4 field"):
        m.decode(msgpack.packb(["s", 0, "req-1", [1], 5]))
    with pytest.raises(m.MessageError, match="not a wire message"):
        m.decode(msgpack.packb(["?", 1]))
    with pytest.raises(m.MessageError, match="lacks"):
        m.Arrive(0, "req-1", [1], 5, {"priority": 3}).kwargs()
    with pytest.raises(m.MessageError, match="Done has"):
        m.done_of([None, 0])


def test_the_inbox_dispatches_by_type():
    seen = []
    handle = m.dispatcher({m.Submit: lambda x: seen.append(("submit", x.req)), m.Stop: lambda x: seen.append("stop")})
    handle(m.Submit("r"))
    handle(m.Stop())
    assert seen == [("submit", "r"), "stop"]
    with pytest.raises(TypeError, match="Drain"):
        handle(m.Drain(1.0))
