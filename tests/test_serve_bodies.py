"""Large bodies parsed in turn per client (issue 41, item 3): one client's burst of 24 bodies of 4 MiB
queued in the body worker does not hold another client's 70 KB body (over the inline bound, so it is
parsed in the worker too) behind the whole burst. Checked by order, not by time: the burst is read by
the server whole (nothing left in the sockets' queues) before the small body is sent, and most of it is
answered after the small body (first come, first parsed: none or one or two). And `bodies.Fair` on its own: clients taken in turn, a call cancelled
while it waits is skipped.

Clients bind their own loopback addresses (127.0.0.2, 127.0.0.3: Linux routes 127.0.0.0/8 to lo)."""

from __future__ import annotations

import json
import socket
import threading
import time

import pytest

from conftest import can_bind, start_server
from serve.api import bodies

BIG, SMALL = "127.0.0.2", "127.0.0.3"
BURST = 24


def test_clients_are_taken_in_turn():
    fair = bodies.Fair()
    gate, started, order = threading.Event(), threading.Event(), []
    first = fair.submit("a", lambda: (started.set(), gate.wait(30)))  # holds the thread while the rest queue
    assert started.wait(30)
    calls = [fair.submit(c, order.append, f"{c}{i}") for c, i in
             [("a", 1), ("a", 2), ("a", 3), ("b", 1), ("c", 1), ("b", 2)]]
    dropped = fair.submit("c", order.append, "c2")
    assert dropped.cancel()
    gate.set()
    for f in [first, *calls]:
        f.result(30)
    assert order == ["a1", "b1", "c1", "a2", "b2", "a3"]


def _send(port: int, addr: str, path: str, body: bytes) -> socket.socket:
    s = socket.create_connection(("127.0.0.1", port), timeout=120, source_address=(addr, 0))
    s.sendall(f"POST {path} HTTP/1.1\r\nHost: 127.0.0.1\r\ncontent-type: application/json\r\n"
              f"content-length: {len(body)}\r\nconnection: close\r\n\r\n".encode() + body)
    return s


def _in_flight(port: int, addr: str) -> int:
    """Bytes between `addr`'s connections and the server on `port` not yet read by the server: the
    clients' send queues and the server's receive queues (Linux's /proc/net/tcp)."""
    me = "%08X" % int.from_bytes(socket.inet_aton(addr), "little")
    total = 0
    with open("/proc/net/tcp") as f:
        for line in f.readlines()[1:]:
            local, remote, _, queues = line.split()[1:5]
            tx, rx = (int(q, 16) for q in queues.split(":"))
            if local.startswith(me) and int(remote.split(":")[1], 16) == port:
                total += tx
            elif remote.startswith(me) and int(local.split(":")[1], 16) == port:
                total += rx
    return total


def _answer(s: socket.socket) -> bytes:
    out = b""
    try:
        while True:
            got = s.recv(65536)
            if not got:
                return out
            out += got
    finally:
        s.close()


@pytest.mark.skipif(not can_bind(BIG), reason="no 127.0.0.2 on lo (not Linux)")
def test_a_small_body_is_not_held_behind_another_clients_burst(tmp_path):
    server = start_server("toy-paged", log_path=tmp_path / "server.log")
    try:
        big = json.dumps({"prompt": [1] * ((4 << 20) // 2 - 64), "max_tokens": 1}, separators=(",", ":")).encode()
        small = json.dumps({"prompt": [65] * 23_000}, separators=(",", ":")).encode()
        assert len(big) <= 4 << 20 and len(small) > bodies.INLINE_BYTES
        order: list[tuple[str, bytes]] = []
        lock, sent = threading.Lock(), threading.Semaphore(0)

        def one(addr: str, path: str, body: bytes, name: str) -> None:
            s = _send(server.port, addr, path, body)
            sent.release()
            raw = _answer(s)
            with lock:
                order.append((name, raw))

        threads = [threading.Thread(target=one, args=(BIG, "/v1/completions", big, "big"), daemon=True)
                   for _ in range(BURST)]
        for t in threads:
            t.start()
        for _ in range(BURST):  # every big body handed to the kernel, then read by the server (so queued
            assert sent.acquire(timeout=120)  # for the worker) before the small one is sent
        deadline = time.monotonic() + 120
        while _in_flight(server.port, BIG) and time.monotonic() < deadline:
            time.sleep(0.02)
        time.sleep(0.2)
        t0 = time.monotonic()
        one(SMALL, "/tokenize", small, "small")
        took = time.monotonic() - t0
        for t in threads:
            t.join(180)
        names = [n for n, _ in order]
        assert sorted(names) == ["big"] * BURST + ["small"], names
        for n, raw in order:
            want = b"HTTP/1.1 200 " if n == "small" else b"HTTP/1.1 400 "
            assert raw.startswith(want), (n, raw[:300])
        assert json.loads(dict(order)["small"].split(b"\r\n\r\n", 1)[1])["count"] == 23_000
        after = len(names) - 1 - names.index("small")
        print(f"\nthe small body was answered in {took:.2f} s with {after} of {BURST} big ones still to come")
        assert after >= BURST // 2, f"only {after} of {BURST} big bodies came after the small one: {names}"
    finally:
        server.stop()
