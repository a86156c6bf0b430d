"""Conventions users bring from vLLM (issue 29): `--version` on `kern`, `kern serve` and `e2e`, and
`GET /version`; the streaming usage chunk of `stream_options.include_usage` (a last chunk with
`"choices": []` and the request's usage, before `[DONE]`), on completions and chat, against the same
request's non-streamed usage. One real server on an ephemeral port."""

from __future__ import annotations

import json
import re
import subprocess
import sys
from pathlib import Path

import httpx
import openai
import pytest

from conftest import PROMPTS
from oracle.version import describe, package_version

TARGET = "toy-paged"
REPO = Path(__file__).resolve().parents[1]
LONG = list(PROMPTS[4].encode())


@pytest.fixture(scope="module")
def server(tmp_path_factory):
    from conftest import start_server

    s = start_server(TARGET, log_path=tmp_path_factory.mktemp("conventions") / "server.log")
    yield s
    s.stop()
    if s.proc.poll() is None:
        s.proc.kill()


# -- versions ----------------------------------------------------------------------------------------


@pytest.mark.parametrize("argv, prog", [(["kern.cli"], "kern"), (["kern.cli", "serve"], "kern serve"),
                                        (["serve"], "kern serve"), (["e2e.cli"], "e2e")])
def test_version_flags_print_the_version_and_the_commit(argv, prog):
    r = subprocess.run([sys.executable, "-m", *argv, "--version"], cwd=REPO, capture_output=True, text=True,
                       timeout=120)
    assert r.returncode == 0, r.stderr
    head = subprocess.run(["git", "-C", str(REPO), "rev-parse", "--short=12", "HEAD"], capture_output=True,
                          text=True).stdout.strip()
    line = r.stdout.strip()
    assert line.startswith(f"{prog} {package_version()} (commit {head}"), line
    assert package_version() != "unknown"
    assert "\n" not in line


def test_version_outside_a_checkout_is_the_package_version_alone(tmp_path):
    assert describe("kern", tmp_path) == f"kern {package_version()}"


def test_get_version_answers_as_vllm(server):
    r = httpx.get(server.url + "/version", timeout=10)
    assert r.status_code == 200 and r.json() == {"version": package_version()}


# -- the streaming usage chunk ------------------------------------------------------------------------


def _events(server, path: str, body: dict) -> list:
    """Every `data:` event of a stream, parsed ("[DONE]" as the string)."""
    out = []
    with httpx.stream("POST", server.url + path, json={**body, "stream": True}, timeout=120) as r:
        assert r.status_code == 200, r.read()
        for line in r.iter_lines():
            if line.startswith("data: "):
                out.append(line[6:] if line == "data: [DONE]" else json.loads(line[6:]))
    return out


# (path, body, whether the repeat is a prefix-cache hit: then the usage's cached_tokens must agree too)
CASES = [("/v1/completions", {"prompt": LONG, "max_tokens": 7}, True),
         ("/v1/chat/completions", {"messages": [{"role": "user", "content": PROMPTS[4]}], "max_tokens": 7}, True),
         ("/v1/completions", {"prompt": "Hi", "max_tokens": 40}, False)]  # shorter than a page; may end by EOS


@pytest.mark.parametrize("path, body, hit", CASES, ids=["completions", "chat", "completions-short"])
def test_include_usage_sends_a_last_chunk_with_no_choices_and_the_usage(server, path, body, hit):
    httpx.post(server.url + path, json=body, timeout=120)  # from here on the prefix cache holds its prompt
    whole = httpx.post(server.url + path, json=body, timeout=120).json()["usage"]
    events = _events(server, path, {**body, "stream_options": {"include_usage": True}})
    assert httpx.post(server.url + path, json=body, timeout=120).json()["usage"] == whole  # a steady hit
    assert events[-1] == "[DONE]", events[-3:]
    chunk = events[-2]
    assert isinstance(chunk, dict) and "choices" in chunk and chunk["choices"] == [], chunk
    assert chunk["usage"] == whole  # the same request: the same prompt, tokens and cached tokens
    assert chunk["id"] == events[0]["id"] and chunk["object"] == events[0]["object"]
    content = events[:-2]
    assert content and all(c["choices"] for c in content)
    assert content[-1]["choices"][0]["finish_reason"] in ("stop", "length")
    assert not any("usage" in c for c in content)  # vLLM: the usage only in its own chunk
    assert (whole["prompt_tokens_details"]["cached_tokens"] > 0) == hit


@pytest.mark.parametrize("path, body", [c[:2] for c in CASES[:2]], ids=["completions", "chat"])
def test_without_include_usage_there_is_no_usage_chunk(server, path, body):
    for opts in (None, {"include_usage": False}, {"continuous_usage_stats": True}):
        events = _events(server, path, {**body, **({"stream_options": opts} if opts is not None else {})})
        assert events[-1] == "[DONE]"
        assert all(c["choices"] for c in events[:-1]), opts  # no chunk without choices
        assert [("usage" in c) for c in events[:-1]] == [False] * (len(events) - 2) + [True], opts  # kern's own


def test_continuous_usage_counts_up_and_ends_with_the_usage_chunk(server):
    body = {"prompt": LONG, "max_tokens": 5, "stream_options": {"include_usage": True, "continuous_usage_stats": True}}
    events = _events(server, "/v1/completions", body)
    assert events[-1] == "[DONE]"
    assert [c["usage"]["completion_tokens"] for c in events[:-1]] == [1, 2, 3, 4, 5, 5]
    assert events[-2]["choices"] == [] and all(c["choices"] for c in events[:-2])
    assert re.fullmatch(r"cmpl-req-\d+", events[-2]["id"])


def test_the_openai_client_reads_the_usage_chunk(server):
    """The OpenAI SDK, as a vLLM user streams chat with include_usage: the last chunk has no choices and
    the usage, equal to the non-streamed usage of the same request."""
    client = openai.OpenAI(base_url=server.url + "/v1", api_key="none", max_retries=0, timeout=60)
    msgs = [{"role": "user", "content": PROMPTS[3]}]
    client.chat.completions.create(model=TARGET, messages=msgs, max_tokens=9)  # warm: a steady hit from here
    whole = client.chat.completions.create(model=TARGET, messages=msgs, max_tokens=9)
    chunks = list(client.chat.completions.create(model=TARGET, messages=msgs, max_tokens=9, stream=True,
                                                 stream_options={"include_usage": True}))
    client.close()
    last = chunks[-1]
    assert last.choices == [] and last.usage is not None
    assert last.usage.model_dump(exclude_none=True) == whole.usage.model_dump(exclude_none=True)
    assert all(c.choices and c.usage is None for c in chunks[:-1])
    assert "".join(c.choices[0].delta.content or "" for c in chunks[:-1]) == whole.choices[0].message.content


# -- no Nagle stall ----------------------------------------------------------------------------------


def test_the_listening_socket_is_tcp_so_connections_get_no_delay():
    """asyncio sets TCP_NODELAY only on connections of a socket whose proto is IPPROTO_TCP; the
    listening socket says so (socket.socket's default proto 0 left Nagle on)."""
    import socket

    from serve.cli import bind

    sock = bind("127.0.0.1", 0)
    try:
        assert sock.proto == socket.IPPROTO_TCP
    finally:
        sock.close()


def test_an_answer_is_not_held_for_the_clients_delayed_ack(server):
    """A response goes out as its head and then its body; with Nagle's algorithm on, the body waits
    for the client's delayed ACK of the head (40 ms on Linux) on every request. Property: the median
    of 21 kept-alive round trips of /health and of an 8-token completion stays under 20 ms, half the
    stall (seen: 44 and 48 ms with Nagle on, 0.2 and 2.5 ms off)."""
    import socket
    import time

    body = json.dumps({"prompt": LONG[:8], "max_tokens": 8}).encode()
    asks = {"health": b"GET /health HTTP/1.1\r\nHost: 127.0.0.1\r\n\r\n",
            "completion": (f"POST /v1/completions HTTP/1.1\r\nHost: 127.0.0.1\r\ncontent-type: application/json\r\n"
                           f"content-length: {len(body)}\r\n\r\n").encode() + body}
    with socket.create_connection(("127.0.0.1", server.port), timeout=30) as s:
        s.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)  # the client sends each ask in one write
        for name, ask in asks.items():
            took = []
            for _ in range(21):
                t = time.perf_counter()
                s.sendall(ask)
                got = b""
                while b"\r\n\r\n" not in got or len(got.split(b"\r\n\r\n", 1)[1]) < _length(got):
                    got += s.recv(65536)
                took.append(time.perf_counter() - t)
                assert got.startswith(b"HTTP/1.1 200 "), got[:200]
            median = sorted(took)[10]
            assert median < 0.020, f"{name}: median round trip {median * 1e3:.1f} ms"


def _length(raw: bytes) -> int:
    head = raw.split(b"\r\n\r\n", 1)[0].decode().lower()
    return int(re.search(r"content-length: (\d+)", head).group(1))
