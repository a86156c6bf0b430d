"""No reset at exit (issue 41, item 4): while the server drains, a request on a connection that was
idle when the drain began, and a request on a new connection, are each answered 503
`server_shutting_down` (the port answers until the drain ends), and the request in progress is
answered in full; the exit code is 0."""

from __future__ import annotations

import json
import os
import signal
import socket
import threading
import time

from conftest import ask, oracle

TARGET = "toy-paged"
HEALTH = b"GET /health HTTP/1.1\r\nHost: 127.0.0.1\r\n\r\n"


def _read_answer(s: socket.socket) -> bytes:
    """One HTTP answer (its head and its content-length body), or what came before the close."""
    out = b""
    while b"\r\n\r\n" not in out:
        got = s.recv(65536)
        if not got:
            return out
        out += got
    head, _, body = out.partition(b"\r\n\r\n")
    length = next((int(ln.split(b":", 1)[1]) for ln in head.split(b"\r\n") if ln.lower().startswith(b"content-length:")), 0)
    while len(body) < length:
        got = s.recv(65536)
        if not got:
            break
        body += got
    return head + b"\r\n\r\n" + body


def _shutting_down(raw: bytes) -> None:
    assert raw.startswith(b"HTTP/1.1 503 "), raw[:300]
    assert json.loads(raw.partition(b"\r\n\r\n")[2])["error"]["code"] == "server_shutting_down", raw[:300]


def test_requests_arriving_during_the_drain_get_503_not_a_reset(kern_server):
    server = kern_server(TARGET, "--fault", "slow-steps")
    idle = socket.create_connection(("127.0.0.1", server.port), timeout=60)
    idle.sendall(HEALTH)
    assert _read_answer(idle).startswith(b"HTTP/1.1 200 ")  # kept alive, idle from now on
    got: dict = {}
    long = threading.Thread(target=lambda: got.update(ask(server, list(b"hold the drain"), 150)), daemon=True)
    long.start()
    deadline = time.monotonic() + 60
    while server.stats()["gauges"]["running"] < 1 and time.monotonic() < deadline:
        time.sleep(0.05)
    os.kill(server.proc.pid, signal.SIGTERM)
    while " draining " not in server.log() and time.monotonic() < deadline:
        time.sleep(0.02)
    assert " draining " in server.log()
    idle.sendall(HEALTH)
    _shutting_down(_read_answer(idle))
    idle.close()
    fresh = socket.create_connection(("127.0.0.1", server.port), timeout=60)
    body = json.dumps({"prompt": "hi", "max_tokens": 2}).encode()
    fresh.sendall(b"POST /v1/completions HTTP/1.1\r\nHost: 127.0.0.1\r\ncontent-type: application/json\r\n"
                  b"content-length: %d\r\n\r\n%s" % (len(body), body))
    _shutting_down(_read_answer(fresh))
    fresh.close()
    long.join(120)
    assert got["ids"] == oracle(TARGET, list(b"hold the drain"), 150)
    assert server.wait_exit(60) == 0
