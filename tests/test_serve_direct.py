"""The generating routes' direct path (`serve.api.app.Kern`: a POST to /v1/completions or
/v1/chat/completions skips FastAPI's middleware stack and router) answers exactly as the full stack
does: every bad input of the error matrix, a missing key, a handler's unexpected exception, and a
good request, each sent once through each path of one app, in process."""

from __future__ import annotations

import asyncio

import httpx
import pytest
from fastapi import FastAPI

from conftest import oracle
from test_serve_errors import CASES

KEY = "sk-direct"
TARGET = "toy-paged"


@pytest.fixture(scope="module")
def app():
    from serve.api.app import make_app
    from serve.core.engine import Options, build
    from serve.core.scheduler import Scheduler

    engine = build(TARGET, Options(capacity=1024, backend="cpu"))
    sched = Scheduler(engine)
    sched.start()
    try:
        yield make_app(sched, engine, api_key=KEY)
    finally:
        sched.stop()
        sched.join(30)


def _through_both(app, path: str, body, key: str | None = KEY) -> tuple[httpx.Response, httpx.Response]:
    """The answer through the direct path, then through the full stack (FastAPI's own `__call__`)."""
    async def stack(scope, receive, send):
        await FastAPI.__call__(app, scope, receive, send)

    headers = {"content-type": "application/json"}
    if key is not None:
        headers["authorization"] = f"Bearer {key}"
    kw = {"content": body} if isinstance(body, str) else {"json": body}

    async def run():
        out = []
        for asgi in (app, stack):
            transport = httpx.ASGITransport(app=asgi, raise_app_exceptions=False)
            async with httpx.AsyncClient(transport=transport, base_url="http://kern") as c:
                out.append(await c.post(path, headers=headers, **kw))
        return out

    return tuple(asyncio.run(run()))


def _same(a: httpx.Response, b: httpx.Response) -> None:
    assert (a.status_code, a.headers.get("content-type")) == (b.status_code, b.headers.get("content-type"))
    assert a.json() == b.json()


@pytest.mark.parametrize("case", [c for c in CASES if c[1] != "/tokenize" and c[1] != "/detokenize"],
                         ids=lambda c: c[0])
def test_bad_input_is_answered_alike(app, case):
    _, path, body, status, code = case
    direct, stack = _through_both(app, path, body)
    _same(direct, stack)
    assert direct.status_code == status and direct.json()["error"]["code"] == code


def test_a_missing_key_is_answered_alike(app):
    direct, stack = _through_both(app, "/v1/completions", {"prompt": "hi"}, key=None)
    _same(direct, stack)
    assert direct.status_code == 401 and direct.json()["error"]["code"] == "invalid_api_key"


def test_an_unexpected_exception_is_a_500_alike(app, monkeypatch):
    """A handler's exception nobody expected: our 500 body through both paths, never a bare text."""
    from serve.api import routes_complete

    def broken(*_a, **_kw):
        raise RuntimeError("planted")

    monkeypatch.setattr(routes_complete, "_submit", broken)
    direct, stack = _through_both(app, "/v1/completions", {"prompt": "hi", "max_tokens": 2})
    _same(direct, stack)
    assert direct.status_code == 500 and direct.json()["error"]["code"] == "internal_error"
    assert "planted" in direct.json()["error"]["message"]


def test_a_good_request_is_answered_alike(app):
    for path, body in (("/v1/completions", {"prompt": [1, 2, 3], "max_tokens": 5, "return_token_ids": True}),
                       ("/v1/chat/completions", {"messages": [{"role": "user", "content": "hi"}], "max_tokens": 3})):
        direct, stack = _through_both(app, path, body)
        assert direct.status_code == stack.status_code == 200
        a, b = direct.json(), stack.json()
        for k in ("id", "created"):
            a.pop(k), b.pop(k)
        a.pop("kern", None), b.pop("kern", None)  # the request's own id
        assert a == b
    assert direct.json()["object"] == "chat.completion"
    first, _ = _through_both(app, "/v1/completions", {"prompt": [1, 2, 3], "max_tokens": 5, "return_token_ids": True})
    assert first.json()["choices"][0]["token_ids"] == oracle(TARGET, [1, 2, 3], 5)
