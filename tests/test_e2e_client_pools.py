"""The gate's client gives each thread a connection pool of its own (`e2e.client.Client.http`).

Why: a pool shared by threads closes connections under each other. httpcore hands an idle connection to
one thread's request, and another thread's call, finding it idle past its keep-alive expiry, closes it
before the first thread writes on it; the request then ends in `ReadError: [Errno 9] Bad file
descriptor`. This failed 2 of 70 loaded toy-paged gates (cold_burst, refcount_stress).

The properties: no two threads ever get the same client; a thread keeps its own client from call to
call; `reconnect` and `close` close every client made so far, and the next use makes a new one."""

from __future__ import annotations

import threading
from concurrent.futures import ThreadPoolExecutor
from types import SimpleNamespace

from e2e.client import Client


def _client() -> Client:
    return Client(SimpleNamespace(url="http://127.0.0.1:9", log=None), "toy")


def test_no_two_threads_share_a_client_and_each_keeps_its_own():
    c = _client()
    barrier = threading.Barrier(8)

    def mine(_):
        first = c.http
        barrier.wait()  # all eight threads alive at once: none can be handed another's by reuse
        return first, c.http

    with ThreadPoolExecutor(8) as ex:
        got = list(ex.map(mine, range(8)))
    assert all(a is b for a, b in got)  # each thread's own, call after call
    assert len({id(a) for a, _ in got}) == 8  # none shared
    assert c.http is c.http and c.http not in [a for a, _ in got]
    c.close()


def test_reconnect_and_close_close_every_client_and_the_next_use_makes_a_new_one():
    c = _client()
    with ThreadPoolExecutor(3) as ex:
        made = list(ex.map(lambda _: c.http, range(3)))
    here = c.http
    c.reconnect()
    assert all(x.is_closed for x in [*made, here])
    fresh = c.http
    assert fresh is not here and not fresh.is_closed
    c.close()
    assert fresh.is_closed
