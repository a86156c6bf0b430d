"""A stuck engine core (issue 41, item 2): /health, /stats, /stats/live and /metrics answer from the
front end, a 503 saying so, instead of waiting on the core, and /health is 200 again once it goes on.

- `--frontend-process`: the core's process is stopped (SIGSTOP): each route answers 503 while it is
  still stopped (the answer came before it resumed: its state is read after the answer), then
  SIGCONT, and /health is 200 again and a request is answered token-exactly;
- in process: the `long-first-step` fault holds the scheduler in one step for 12 s; with
  `--stuck-after 2` /health and /stats answer 503 `engine core stuck` during it, and 200 after.

No timing is asserted: each request has a client timeout of 5 s (the routes wait 0.4 s and 0.8 s on
the core) and the outcome is what is checked.
"""

from __future__ import annotations

import os
import signal
import threading
import time

import httpx

from conftest import ask, children, oracle

TARGET = "toy-paged"
ROUTES = ("/stats", "/stats/live", "/metrics")


def _state(pid: int) -> str:
    with open(f"/proc/{pid}/stat") as f:
        return f.read().rsplit(")", 1)[-1].split()[0]


def _until(server, status: int, limit: float = 60.0) -> httpx.Response:
    """GET /health until it answers `status` (each with a 5 s client timeout), at most `limit` s."""
    deadline = time.monotonic() + limit
    while True:
        r = httpx.get(server.url + "/health", timeout=5)
        if r.status_code == status or time.monotonic() > deadline:
            return r
        time.sleep(0.2)


def test_a_stopped_core_process_is_answered_503_by_the_front_end(kern_server):
    server = kern_server(TARGET, "--frontend-process")
    core = children(server.proc.pid)[0]
    assert ask(server, list(b"abc"), 6)["ids"] == oracle(TARGET, list(b"abc"), 6)
    os.kill(core, signal.SIGSTOP)
    try:
        t0 = time.monotonic()
        r = httpx.get(server.url + "/health", timeout=5)
        took = time.monotonic() - t0
        assert _state(core) == "T", "the core resumed before /health answered"
        print(f"\n/health answered {r.status_code} in {took:.3f} s with the core stopped")
        assert r.status_code == 503 and r.json()["status"] == "engine core not answering", r.text
        for path in ROUTES:
            r = httpx.get(server.url + path, timeout=5)
            assert _state(core) == "T"
            assert r.status_code == 503, (path, r.text)
            assert r.json()["error"]["code"] == "engine_core_not_answering", (path, r.text)
    finally:
        os.kill(core, signal.SIGCONT)
    r = _until(server, 200)
    assert r.status_code == 200 and r.json() == {"status": "ok"}, r.text
    for path in ROUTES:
        assert httpx.get(server.url + path, timeout=30).status_code == 200, path
    assert ask(server, list(b"abcd"), 6)["ids"] == oracle(TARGET, list(b"abcd"), 6)


def test_a_core_stuck_in_one_step_in_process_is_answered_503(kern_server):
    server = kern_server(TARGET, "--fault", "long-first-step", "--stuck-after", "2")
    got: dict = {}
    t = threading.Thread(target=lambda: got.update(ask(server, list(b"abc"), 6)), daemon=True)
    t.start()
    r = _until(server, 503, limit=30)
    assert r.status_code == 503 and r.json()["status"] == "engine core stuck", r.text
    assert r.json()["busy_s"] > 2
    s = httpx.get(server.url + "/stats", timeout=5)
    assert s.status_code == 503 and s.json()["error"]["code"] == "engine_core_stuck", s.text
    live = httpx.get(server.url + "/stats/live", timeout=5)  # in process: read at once, never waits
    assert live.status_code == 200 and live.json()["step_s"] is not None, live.text
    t.join(60)
    assert got["ids"] == oracle(TARGET, list(b"abc"), 6)
    r = _until(server, 200)
    assert r.status_code == 200 and r.json() == {"status": "ok"}, r.text
    assert httpx.get(server.url + "/stats", timeout=30).status_code == 200
