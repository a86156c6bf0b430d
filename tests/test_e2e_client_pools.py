"""The gate's client gives each thread a connection pool of its own (`e2e.client.Client.http`).

Why: a pool shared by threads closes connections under each other. httpcore hands an idle connection to
one thread's request, and another thread's call, finding it idle past its keep-alive expiry, closes it
before the first thread writes on it; the request then ends in `ReadError: [Errno 9] Bad file
descriptor`. This failed 2 of 70 loaded toy-paged gates (cold_burst, refcount_stress).

The properties: no two threads ever get the same client; a thread keeps its own client from call to
call; `reconnect` and `close` close every client made so far, and the next use makes a new one; a GET
the server closed unread is sent again once, on a fresh connection."""

from __future__ import annotations

import socket
import threading
from concurrent.futures import ThreadPoolExecutor
from types import SimpleNamespace

import httpx
import pytest

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


def test_a_get_the_server_closed_unread_is_sent_again_once_on_a_fresh_connection():
    """A server that closes a connection without answering ("Server disconnected without sending a
    response": its keep-alive ran out while the client's thread waited) gets the GET again, once, on a
    new connection; the answer is the second one's. A server that does it twice is an error."""
    def serve(closes: int):
        lsock = socket.socket()
        lsock.bind(("127.0.0.1", 0))
        lsock.listen(4)
        seen = []

        def run():
            for i in range(closes + 1):
                try:
                    conn, _ = lsock.accept()
                except OSError:
                    return
                seen.append(conn.recv(65536).split(b"\r\n", 1)[0])
                if i >= closes:
                    conn.sendall(b"HTTP/1.1 200 OK\r\ncontent-length: 2\r\n\r\nok")
                conn.close()
            lsock.close()

        threading.Thread(target=run, daemon=True).start()
        return lsock, seen

    lsock, seen = serve(1)
    checked = []
    session = SimpleNamespace(url=f"http://127.0.0.1:{lsock.getsockname()[1]}", log=None, check=lambda grace: checked.append(grace))
    c = Client(session, "toy")
    r = c.get("/stats/live")
    assert (r.status_code, r.text, c.resent) == (200, "ok", 1)
    assert seen == [b"GET /stats/live HTTP/1.1"] * 2 and checked  # the session asked whether the server lives
    c.close()
    lsock, seen = serve(2)
    c = Client(SimpleNamespace(url=f"http://127.0.0.1:{lsock.getsockname()[1]}", log=None, check=lambda grace: checked.append(grace)), "toy")
    with pytest.raises(httpx.RemoteProtocolError):
        c.get("/stats/live")
    c.close()


def test_a_burst_makes_every_thread_s_client_before_its_barrier():
    """`run_all` sends its calls together: each thread's client (4 ms of CPU to make, under the
    interpreter lock) is made before the barrier, so when the first call goes out every thread holds
    its client and nothing but the request itself is left to do (made after it, twelve clients spread a
    burst over 50 ms, and a fast engine answered each before the next arrived)."""
    c = _client()
    made: list[bool] = []
    lock = threading.Lock()

    def complete(prompt, n):
        with lock:  # whether every other thread of the burst already holds its client
            made.append(len(c._clients) == 12)
        return prompt

    c.complete = complete
    assert c.run_all([(f"p{i}", 4) for i in range(12)]) == [f"p{i}" for i in range(12)]
    assert made == [True] * 12
    c.close()
