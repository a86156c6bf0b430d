"""Issue 41 item 1: fair admission. One client's three long streams (ignore_eos, each reserving a third of
a small pool) hold the pool with the third waiting; 20 short requests from 20 other clients are all
answered, exactly, while the long ones still run under `--admission fair` (the default), and none is
under `--admission fifo` (the lock the issue found, which proves the test can fail). The order is
read off the server's own log (its scheduler thread writes every `finished` line), not off a clock.

Also: a request left waiting past --queue-timeout gets a plain 503 `queue_timeout` with Retry-After
(a stream too: before its first byte); --max-tokens-ceiling refuses a larger max_tokens with a 400
naming it; a bearer key names the client, else the peer address.

The long requests are long in time whatever the machine's load: the fair and fifo servers run
`--fault slow-steps` (every step 20 ms more, answers unchanged), so a long one runs over 6 s, and the 20
short requests, sent once two long ones run and the third waits, arrive long before either ends. With
plain steps (2,000 tokens in about a second) a loaded machine once sent the shorts late enough that a
long one finished first.

On loopback every client is 127.0.0.1, so the clients bind their own source addresses in 127.0.0.0/8
(Linux routes the whole block to lo): the long requests' client is 127.0.0.2, the others 127.0.0.3 on."""

from __future__ import annotations

import json
import re
import threading
import time
from types import SimpleNamespace

import httpx
import pytest

from conftest import EOS, can_bind, manifest_dict, oracle, start_server

TARGET = "toy-paged"
LONG_CLIENT = "127.0.0.2"
CLIENTS = [f"127.0.0.{i}" for i in range(3, 23)]  # 20 clients
CAPACITY = 960  # 60 pages of 16 (the pad takes one): two long requests reserve 40, leaving 19 (the third needs 20)
LONG = 308  # each long request's max_tokens (ignore_eos: it runs all of them; 20 pages with its prompt)
SLOW = ("--fault", "slow-steps")  # 20 ms a step: a long request runs over 6 s
SHORT = 4


needs_loopback = pytest.mark.skipif(not can_bind(LONG_CLIENT), reason="no 127.0.0.2 on lo (not Linux)")


def _client(addr: str) -> httpx.Client:
    return httpx.Client(transport=httpx.HTTPTransport(local_address=addr), timeout=600)


def long_answer(ids: list[int], m: int) -> list[int]:
    """toy/model.py's continuation run past every EOS up to `m` tokens (what ignore_eos serves)."""
    manifest = manifest_dict(TARGET)
    from toy.model import generate

    out: list[int] = []
    while len(out) < m:
        out += generate(list(ids) + out, m - len(out), manifest)
        if len(out) < m:
            out.append(EOS)
    return out


def _long_prompt(i: int) -> list[int]:
    return list(f"long story {i}".encode())  # 12 tokens: 320 reserve 20 pages


def _short_prompt(i: int) -> list[int]:
    return list(f"short {i}".encode())


def _stream(addr: str, url: str, ids: list[int], m: int, out: dict) -> None:
    body = {"prompt": ids, "max_tokens": m, "ignore_eos": True, "stream": True, "return_token_ids": True}
    toks: list[int] = []
    with _client(addr) as c, c.stream("POST", url + "/v1/completions", json=body) as r:
        out["status"] = r.status_code
        for line in r.iter_lines():
            if line.startswith("data: {"):
                choice = json.loads(line[6:])["choices"][0]
                toks += choice.get("token_ids") or []
                out["finish"] = choice.get("finish_reason") or out.get("finish")
    out["ids"] = toks


def _short(c: httpx.Client, url: str, ids: list[int], out: dict) -> None:
    r = c.post(url + "/v1/completions", json={"prompt": ids, "max_tokens": SHORT, "return_token_ids": True})
    out["status"] = r.status_code
    out["ids"] = r.json()["choices"][0]["token_ids"] if r.status_code == 200 else r.text


def _wait_live(server, ok, timeout: float = 120.0) -> dict:
    deadline = time.monotonic() + timeout
    while True:
        live = httpx.get(server.url + "/stats/live", timeout=30).json()
        if ok(live) or time.monotonic() > deadline:
            return live
        time.sleep(0.02)


def _finished(log: str) -> list[int]:
    """The max_tokens of every request in the order the scheduler finished them (its log)."""
    admitted = dict(re.findall(r" admitted request=(\S+) prompt=\d+ max_tokens=(\d+)", log))
    return [int(admitted[r]) for r in re.findall(r" finished request=(\S+) ", log) if r in admitted]


def _longs_and_shorts(server) -> tuple[list[dict], list[dict]]:
    """Three long streams from one client, then (once two run and the third waits) 20 shorts from 20
    others, their connections made beforehand (sending one is then a write, not a connect); returns
    both once all ended."""
    clients = [_client(a) for a in CLIENTS]
    try:
        for c in clients:
            assert c.get(server.url + "/v1/models").status_code == 200
        longs = [{} for _ in range(3)]
        threads = [threading.Thread(target=_stream, args=(LONG_CLIENT, server.url, _long_prompt(i), LONG, longs[i]))
                   for i in range(3)]
        for t in threads:
            t.start()
        live = _wait_live(server, lambda d: d["running"] == 2 and d["waiting"] == 1)
        assert live["running"] == 2 and live["waiting"] == 1, f"the long requests did not hold the pool: {live}"
        shorts = [{} for _ in CLIENTS]
        more = [threading.Thread(target=_short, args=(c, server.url, _short_prompt(i), shorts[i]))
                for i, c in enumerate(clients)]
        for t in more:
            t.start()
        for t in threads + more:
            t.join(600)
    finally:
        for c in clients:
            c.close()
    return longs, shorts


def _check_answers(longs: list[dict], shorts: list[dict]) -> None:
    for i, got in enumerate(longs):
        assert got.get("status") == 200 and got.get("finish") == "length", got.get("status")
        assert got["ids"] == long_answer(_long_prompt(i), LONG), f"long request {i}: its answer differs"
    for i, got in enumerate(shorts):
        assert got.get("status") == 200, got
        assert got["ids"] == oracle(TARGET, _short_prompt(i), SHORT), f"short request {i}: {got['ids']}"


@pytest.fixture
def served(tmp_path):
    started = []

    def start(*flags: str, capacity: int = CAPACITY):
        s = start_server(TARGET, "--capacity", str(capacity), *flags, log_path=tmp_path / f"s{len(started)}.log")
        started.append(s)
        return s

    yield start
    for s in started:
        s.kill()


@needs_loopback
def test_short_requests_start_beside_long_ones_by_default(served):
    """The default policy (fair): every short request finishes before the first long one does."""
    s = served(*SLOW)
    longs, shorts = _longs_and_shorts(s)
    _check_answers(longs, shorts)
    order = _finished(s.log())
    first_long = order.index(LONG)
    assert order[:first_long] == [SHORT] * len(CLIENTS), f"finish order (max_tokens): {order}"
    assert sorted(order[first_long:]) == [LONG] * 3


@needs_loopback
def test_fifo_keeps_the_lock_by_name(served):
    """--admission fifo, today's first-come order: no short request finishes while every long one
    runs (they wait behind the third long one until one of the first two ends)."""
    s = served("--admission", "fifo", *SLOW)
    longs, shorts = _longs_and_shorts(s)
    _check_answers(longs, shorts)
    order = _finished(s.log())
    assert order[0] == LONG, f"finish order (max_tokens): {order}"
    assert order.count(SHORT) == len(CLIENTS)


@needs_loopback
def test_a_request_waiting_past_the_queue_timeout_gets_503_with_retry_after(served):
    """--queue-timeout 0.5: one long request reserves 20 of the pool's 32 pages for over 6 s (slow
    steps: whatever the load, it still runs when the next one has waited its 0.5 s); a stream needing
    13 waits for room and is answered a plain 503 queue_timeout with Retry-After (before its first
    byte); --max-tokens-ceiling refuses one token more than it allows. With the engine core in a
    process of its own: the client and the error cross its wire."""
    hold = 308  # 12 prompt tokens + 308: 20 pages
    s = served("--queue-timeout", "0.5", "--max-tokens-ceiling", str(hold), "--frontend-process", *SLOW,
               capacity=528)
    over = httpx.post(s.url + "/v1/completions", json={"prompt": [1, 2], "max_tokens": hold + 1}, timeout=60)
    assert over.status_code == 400, over.text
    err = over.json()["error"]
    assert err["param"] == "max_tokens" and "--max-tokens-ceiling" in err["message"], err
    got: dict = {}
    hog = threading.Thread(target=_stream, args=(LONG_CLIENT, s.url, _long_prompt(0), hold, got))
    with _client(CLIENTS[0]) as c:
        assert c.get(s.url + "/v1/models").status_code == 200  # connected before the long one starts
        hog.start()
        live = _wait_live(s, lambda d: d["running"] == 1)
        assert live["running"] == 1, live
        body = {"prompt": _short_prompt(0), "max_tokens": 200, "stream": True}
        with c.stream("POST", s.url + "/v1/completions", json=body) as r:
            raw = r.read()
    hog.join(600)
    assert r.status_code == 503, raw[:300]
    assert r.headers.get("retry-after", "").isdigit(), dict(r.headers)
    assert json.loads(raw)["error"]["code"] == "queue_timeout", raw[:300]
    assert got.get("finish") == "length" and len(got["ids"]) == hold, "the running request was disturbed"
    queue = s.stats()["queue"]
    assert queue["admission"] == "fair" and queue["timed_out"] == 1, queue


def test_the_client_is_its_bearer_key_else_its_address():
    from serve.api.routes_complete import client_of

    def req(headers: dict, host: str | None = "10.0.0.7"):
        return SimpleNamespace(headers=headers, client=SimpleNamespace(host=host) if host else None)

    a, b = client_of(req({"authorization": "Bearer k1"})), client_of(req({"authorization": "Bearer k2"}))
    assert a.startswith("key:") and b.startswith("key:") and a != b and "k1" not in a
    assert client_of(req({"authorization": "bearer k1"}, "10.0.0.8")) == a
    assert client_of(req({})) == "10.0.0.7"
    assert client_of(req({"authorization": "Basic xyz"})) == "10.0.0.7"


def test_a_bad_admission_flag_is_one_line_naming_it():
    from click.testing import CliRunner

    from serve.cli import serve_command

    for flags, name in ((["--admission", "lifo"], "--admission"), (["--client-page-share", "0"], "--client-page-share"),
                        (["--max-bypass", "-1"], "--max-bypass"), (["--max-tokens-ceiling", "0"], "--max-tokens-ceiling")):
        got = CliRunner().invoke(serve_command, [TARGET, *flags])
        assert got.exit_code == 2 and name in got.output, (flags, got.output)
