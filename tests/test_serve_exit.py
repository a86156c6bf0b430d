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

from conftest import ask, children, oracle

TARGET = "toy-paged"
CLIENTS = 32  # threads opening connections one after another
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


def _hammer(port: int, stop: threading.Event, out: list) -> None:
    """New connections one after another, each a completion with `connection: close`, until `stop`
    or the port refuses: each outcome into `out` ("200", "503 <code>", "refused", or "reset: ...").
    A connect that fails with a reset is "refused" too: its handshake was still under way when the
    listening socket closed (nothing can take a connection before its handshake ends), and no byte
    of a request was sent on it; a reset after the connect, on a request sent, is a "reset"."""
    body = json.dumps({"prompt": "hi", "max_tokens": 2}).encode()
    req = (b"POST /v1/completions HTTP/1.1\r\nHost: 127.0.0.1\r\ncontent-type: application/json\r\n"
           b"content-length: %d\r\nconnection: close\r\n\r\n%s" % (len(body), body))
    while not stop.is_set():
        try:
            s = socket.create_connection(("127.0.0.1", port), timeout=30)
        except (ConnectionRefusedError, ConnectionResetError):
            out.append("refused")
            return
        phase = "send"
        try:
            s.sendall(req)
            phase = "read"
            raw = _read_answer(s)
        except OSError as exc:
            out.append(f"reset: on {phase}: {exc!r}")
            continue
        finally:
            s.close()
        if not raw.startswith(b"HTTP/1.1 "):
            out.append(f"reset: {raw[:80]!r}")
        elif raw.startswith(b"HTTP/1.1 200 "):
            out.append("200")
        else:
            code = json.loads(raw.partition(b"\r\n\r\n")[2])["error"]["code"]
            out.append(f"{raw[9:12].decode()} {code}")


def test_connections_arriving_as_the_server_exits_after_a_core_kill_are_answered(kern_server):
    """The engine core's process killed while clients keep opening connections: every connection the
    server took gets an HTTP answer (200 before, then 503 engine_core_dead or server_shutting_down),
    none a reset; once the port is closed a connection is refused; the exit code is 101."""
    server = kern_server(TARGET, "--frontend-process", "--fault", "slow-steps")
    core = children(server.proc.pid)[0]
    stop, outs = threading.Event(), [[] for _ in range(CLIENTS)]
    threads = [threading.Thread(target=_hammer, args=(server.port, stop, out), daemon=True) for out in outs]
    for t in threads:
        t.start()
    deadline = time.monotonic() + 60
    while sum(o.count("200") for o in outs) < 6 and time.monotonic() < deadline:
        time.sleep(0.05)
    os.kill(core, signal.SIGKILL)
    assert server.wait_exit(60) == 101
    stop.set()
    for t in threads:
        t.join(60)
    seen = [x for o in outs for x in o]
    resets = [x for x in seen if x.startswith("reset")]
    assert not resets, f"{len(resets)} of {len(seen)} connections reset: {resets[:5]}"
    assert set(seen) <= {"200", "refused", "503 engine_core_dead", "503 server_shutting_down"}, set(seen)
    assert seen.count("200") >= 6


def test_a_listening_socket_told_to_stop_handshakes_takes_none_new_and_keeps_the_rest():
    """`guard.stop_handshakes` (Linux): a new connection's SYN is dropped (its connect times out here;
    refused once the socket is closed), while a connection already in the backlog is still taken and
    its bytes read; a socket it cannot filter says so (False)."""
    import sys

    import pytest

    from serve.api import guard

    if not sys.platform.startswith("linux"):
        pytest.skip("a socket filter is Linux's")
    with socket.socket() as ls:
        ls.bind(("127.0.0.1", 0))
        ls.listen(16)
        port = ls.getsockname()[1]
        early = socket.create_connection(("127.0.0.1", port), timeout=5)
        assert guard.stop_handshakes(ls)
        with pytest.raises(socket.timeout):
            socket.create_connection(("127.0.0.1", port), timeout=0.3)
        conn, _ = ls.accept()
        early.sendall(b"x")
        assert conn.recv(1) == b"x"
        conn.close()
        early.close()
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as udp:
        udp.close()
        assert guard.stop_handshakes(udp) is False  # a closed socket: the filter refused
    with pytest.raises(ConnectionRefusedError):
        socket.create_connection(("127.0.0.1", port), timeout=5)
