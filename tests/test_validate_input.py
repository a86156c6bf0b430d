"""The checks beside the parameter table (issue 41, item 5): /tokenize's and /detokenize's keys, chat
roles and content parts, the Host header's rule and the body's content type, each refused by name,
and the tables they are read from written out in the docs."""

from __future__ import annotations

from pathlib import Path

import pytest

from serve.api import validate
from serve.api.hosts import Hosts
from serve.api.validate import PARTS, ROLES, ROUTE_KEYS, ApiError

REPO = Path(__file__).resolve().parents[1]
MODEL = "toy-paged"


def _refused(fn, body: dict) -> ApiError:
    with pytest.raises(ApiError) as err:
        fn(body, MODEL)
    return err.value


@pytest.mark.parametrize("route, fn, body", [
    ("tokenize", validate.tokenize, {"prompt": "hi", "foo": 1}),
    ("tokenize", validate.tokenize, {"prompt": "hi", "max_tokens": None}),
    ("detokenize", validate.detokenize, {"tokens": [104], "skip_special_tokens": True}),
])
def test_unknown_keys_on_tokenize_and_detokenize_are_refused_by_name(route, fn, body):
    bad = next(k for k in body if k not in ROUTE_KEYS[route])
    e = _refused(fn, body)
    assert (e.status, e.code, e.param) == (400, "unknown_parameter", bad) and f"'{bad}'" in e.message


def test_the_keys_they_take_are_served():
    assert validate.tokenize({"model": MODEL, "prompt": "hi", "add_special_tokens": True}, MODEL) == [104, 105]
    assert validate.tokenize({"messages": [{"role": "user", "content": "hi"}], "add_generation_prompt": False},
                             MODEL) == [104, 105]
    assert validate.detokenize({"model": MODEL, "tokens": [104, 105]}, MODEL) == "hi"
    e = _refused(validate.tokenize, {"prompt": "hi", "add_special_tokens": "yes"})
    assert (e.code, e.param) == ("invalid_type", "add_special_tokens")


@pytest.mark.parametrize("message, code", [({"content": "hi"}, "missing_required_parameter"),
                                           ({"role": "wizard", "content": "hi"}, "invalid_value"),
                                           ({"role": 3, "content": "hi"}, "invalid_value")])
def test_a_missing_or_invented_role_is_refused_naming_it(message, code):
    body = {"messages": [{"role": "user", "content": "a"}, message]}
    e = _refused(validate.chat, body)
    assert (e.status, e.code, e.param) == (400, code, "messages[1].role"), e.message
    if "role" in message:
        assert str(message["role"]) in e.message


def test_every_role_of_the_table_is_served():
    for role in ROLES:
        assert validate.chat({"messages": [{"role": role, "content": "hi"}]}, MODEL).ids == [104, 105]


@pytest.mark.parametrize("kind", [k for k, why in PARTS.items() if why is not None])
def test_a_part_the_server_does_not_serve_is_refused_naming_it(kind):
    part = {"type": kind, kind: {"url": "data:image/png;base64,AAAA"}}
    e = _refused(validate.chat, {"messages": [{"role": "user", "content": [part]}]})
    assert (e.status, e.code, e.param) == (400, "unsupported_content", "messages[0].content[0]"), e.message
    assert kind in e.message and "text parts only" in e.message and "empty" not in e.message


@pytest.mark.parametrize("part, code, param", [
    ({"text": "hi"}, "missing_required_parameter", "messages[0].content[0].type"),
    ({"type": "hologram"}, "invalid_value", "messages[0].content[0].type"),
    ({"type": "text", "text": 5}, "invalid_type", "messages[0].content[0].text"),
    ("hi", "invalid_type", "messages[0].content[0]"),
])
def test_malformed_parts_are_refused_naming_where(part, code, param):
    e = _refused(validate.chat, {"messages": [{"role": "user", "content": [part]}]})
    assert (e.code, e.param) == (code, param), e.message


def test_text_parts_are_served_concatenated():
    parts = [{"type": "text", "text": "h"}, {"type": "text", "text": "i"}]
    assert validate.chat({"messages": [{"role": "user", "content": parts}]}, MODEL).ids == [104, 105]


@pytest.mark.parametrize("bound, allowed, host, ok", [
    ("127.0.0.1", None, "127.0.0.1:8000", True),
    ("127.0.0.1", None, "localhost:8000", True),
    ("127.0.0.1", None, "[::1]:8000", True),
    ("127.0.0.1", None, "127.0.0.2", True),
    ("127.0.0.1", None, "evil.example:8000", False),
    ("127.0.0.1", None, "localhost.evil.example", False),
    ("127.0.0.1", ("box.lan",), "Box.Lan:8000", True),
    ("127.0.0.1", ("box.lan",), "other.lan", False),
    ("127.0.0.1", ("*",), "anything.example", True),
    ("0.0.0.0", None, "anything.example", True),
    ("0.0.0.0", ("box.lan",), "anything.example", False),
    ("myhost", None, "myhost:8000", True),
    ("127.0.0.1", None, None, True),
])
def test_the_host_rule(bound, allowed, host, ok):
    why = Hosts(bound, allowed).check(host)
    assert (why is None) == ok, why
    if not ok:
        assert host in why and "--allowed-hosts" in why


def test_the_docs_write_out_the_tables():
    doc = (REPO / "docs" / "api.md").read_text()
    for role in ROLES:
        assert f"`{role}`" in doc, role
    for kind in PARTS:
        assert f"`{kind}`" in doc, kind
    for route, keys in ROUTE_KEYS.items():
        line = next((ln for ln in doc.splitlines() if ln.startswith(f"| `/{route}` |")), "")
        assert all(f"`{k}`" in line for k in keys), (route, line)
    assert "415" in doc and "unsupported_media_type" in doc
    assert "--allowed-hosts" in (REPO / "docs" / "serve.md").read_text()
