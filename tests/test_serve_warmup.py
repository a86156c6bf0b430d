"""Readiness (issue 28): /health answers 503 `{"status": "warming"}` until every program the server
runs has run once (kernels compiled or loaded), and the warm-up touches nothing a request can see;
`kern serve` prints its progress."""

from __future__ import annotations

import threading

import httpx
import pytest

from conftest import oracle

TARGET = "toy-paged"


def _engine(target: str = TARGET):
    from serve.core.engine import Options, build

    return build(target, Options(capacity=512, backend="cpu"))


def test_health_says_warming_until_the_warm_up_is_done(monkeypatch):
    """While the warm-up runs, /health is a 503 "warming" (and /v1/models still answers); a request
    sent meanwhile waits and is answered exactly; after it, /health is ok."""
    from starlette.testclient import TestClient

    import serve.core.warmup
    from serve.api.app import make_app
    from serve.core.scheduler import Scheduler

    release, started = threading.Event(), threading.Event()
    real = serve.core.warmup.warm_up

    def held(engine, *a, **kw):
        started.set()
        assert release.wait(60)
        return real(engine, *a, **kw)

    monkeypatch.setattr(serve.core.warmup, "warm_up", held)
    engine = _engine()
    sched = Scheduler(engine)
    sched.start()
    try:
        assert started.wait(30)
        client = TestClient(make_app(sched, engine))
        r = client.get("/health")
        assert r.status_code == 503 and r.json() == {"status": "warming"}
        assert client.get("/v1/models").status_code == 200
        out: dict = {}
        t = threading.Thread(target=lambda: out.update(r=client.post("/v1/completions", json={
            "prompt": [5, 6, 7], "max_tokens": 4, "return_token_ids": True})))
        t.start()
        t.join(0.5)
        assert t.is_alive()  # held behind the warm-up, not answered
        release.set()
        t.join(60)
        assert out["r"].status_code == 200
        assert out["r"].json()["choices"][0]["token_ids"] == oracle(TARGET, [5, 6, 7], 4)
        assert client.get("/health").json() == {"status": "ok"}
    finally:
        release.set()
        sched.stop()
        sched.join(30)


@pytest.mark.parametrize("target", ["toy-paged", "toy-stateful"])
def test_warm_up_runs_every_program_and_touches_nothing(target):
    """Every program the server may call runs once, one `warming` line each; the pool, the prefix
    cache and the counters are as they were."""
    from serve.core.warmup import programs, warm_up

    engine = _engine(target)
    ran: list[str] = []
    step = engine.runtime.step

    def counted(program, cells, *a, **kw):
        ran.append(program)
        return step(program, cells, *a, **kw)

    engine.runtime.step = counted
    lines: list[tuple] = []
    before = (engine.pool.total, engine.pool.used, engine.prefix.entries(), repr(engine.pool))
    warm_up(engine, lambda name, **f: lines.append((name, f)))
    after = (engine.pool.total, engine.pool.used, engine.prefix.entries(), repr(engine.pool))
    want = [f.program for f in programs(engine)]
    assert ran == want and want, ran
    assert any(f.rows is None for f in programs(engine))  # the chunk (prefill) program among them
    assert [f["program"] for n, f in lines if n == "warming" and "program" in f] == want
    assert lines[-1][0] == "warm"
    assert before == after


def test_kern_serve_prints_the_warm_up(kern_server):
    s = kern_server(TARGET, "--log-level", "info")
    log = s.log()
    assert " warming " in log and " warm programs=" in log
    assert log.index(" warm programs=") < log.index(" serving ") or httpx.get(s.url + "/health").status_code == 200


@pytest.mark.parametrize("frontend_process", [False, True], ids=["in-process", "frontend-process"])
def test_each_server_process_freezes_its_heap_once_warm(kern_server, frontend_process):
    """A server process collects and freezes its heap once (serve/common/startup.py `freeze_heap`): after the
    warm-up where it runs the engine, once serving for a front end alone; so a full collection while
    serving scans only what was made since. The frozen objects are the start's (tens of thousands),
    and requests are answered exactly afterwards."""
    import re
    import time

    s = kern_server(TARGET, "--log-level", "info", *(["--frontend-process"] if frontend_process else []))
    deadline = time.monotonic() + 30
    want = 2 if frontend_process else 1
    while s.log().count(" heap frozen ") < want and time.monotonic() < deadline:
        time.sleep(0.05)
    log = s.log()
    frozen = [int(n) for n in re.findall(r" heap frozen objects=(\d+) ", log)]
    assert len(frozen) == want, log[-2000:]
    assert all(n > 10_000 for n in frozen), frozen
    assert log.index(" warm programs=") < log.rindex(" heap frozen ")  # the engine's process: after its warm-up
    r = httpx.post(s.url + "/v1/completions", json={"prompt": [4, 5, 6], "max_tokens": 6, "return_token_ids": True},
                   timeout=60)
    assert r.json()["choices"][0]["token_ids"] == oracle(TARGET, [4, 5, 6], 6)
