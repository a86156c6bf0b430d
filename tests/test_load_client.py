"""bench/load_client.py, the load benchmarks' lean HTTP client, reads a real `kern serve`'s answers as
httpx does: whole answers (content-length bodies) and streams (chunked server-sent events) over the same
keep-alive connection, one after another, every token counted, a stream's first token and gaps timed;
a refused request raises with the server's reason. Timing is never asserted."""

from __future__ import annotations

import asyncio

import pytest
from conftest import bench_module


def _bodies(streams: int, per: int, max_tokens: int) -> list[list[dict]]:
    # alternate whole and streamed answers on each connection: a chunked body must be read to its end
    # before the next request's head, or the next answer is misread
    return [[{"prompt": f"load client {j} {r}", "max_tokens": max_tokens, "temperature": 0, "ignore_eos": True,
              "return_token_ids": True, "stream": (j + r) % 2 == 1} for r in range(per)] for j in range(streams)]


def test_the_lean_client_counts_what_httpx_counts_on_one_connection_each(kern_server):
    lc = bench_module("load_client")
    server = kern_server("toy-paged")
    bodies = _bodies(3, 4, 24)
    lean = asyncio.run(lc._asyncio_run(server.url, bodies))
    old = lc._httpx_run(server.url, bodies)
    assert len(lean) == len(old) == 12
    assert sorted(n for n, _, _ in lean) == sorted(n for n, _, _ in old) == [24] * 12
    streamed = [r for r in lean if r[1] is not None]
    whole = [r for r in lean if r[1] is None]
    assert len(streamed) == len(whole) == 6
    for n, ttft, gaps in streamed:
        assert ttft > 0 and len(gaps) <= n - 1 and all(g >= 0 for g in gaps)
    assert all(gaps == [] for _, _, gaps in whole)


def test_a_refused_request_raises_with_the_servers_reason(kern_server):
    lc = bench_module("load_client")
    server = kern_server("toy-paged")
    bad = [[{"prompt": "x", "max_tokens": 0}]]
    with pytest.raises(lc.HttpError, match="400.*max_tokens"):
        asyncio.run(lc._asyncio_run(server.url, bad))


def test_an_unknown_client_is_refused_by_name():
    lc = bench_module("load_client")
    with pytest.raises(ValueError, match="unknown client 'curl'"):
        lc.worker("http://127.0.0.1:1", [], None, None, "curl")
