"""Faults: a client hanging up mid-stream has its request aborted and its lease returned; a crash of
the scheduler thread ends the process with 101 at once, with no request left hanging; SIGTERM drains
and exits 0. And the injected faults really misbehave, so the gate's checks have something to catch.
"""

from __future__ import annotations

import json
import signal
import threading
import time

import httpx
import openai

from conftest import EOS, PROMPTS, SUFFIX, ask, assert_nothing_leaked, oracle


LONG = list(b"The difference between a symphony and a concerto is")


def _hang_up_after(server, ids, chunks: int = 3, max_tokens: int = 4000) -> None:
    # ignore_eos and a long bound, as the gate's abort does: on a loaded box a 200-token answer could
    # finish before the server saw the socket close, and then nothing is aborted
    body = {"prompt": ids, "max_tokens": max_tokens, "stream": True, "ignore_eos": True}
    with httpx.stream("POST", server.url + "/v1/completions", json=body, timeout=60) as r:
        seen = 0
        for line in r.iter_lines():
            if line.startswith("data: "):
                seen += 1
                if seen == chunks:
                    break


def test_a_hang_up_mid_stream_aborts_and_returns_the_lease(kern_server):
    target = "toy-paged"
    server = kern_server(target, "--max-seqs", "8")
    ids = LONG
    assert len(oracle(target, ids, 200)) == 200  # no stop: the hang-up lands mid-stream
    _hang_up_after(server, ids)
    assert_nothing_leaked(server)
    client = openai.OpenAI(base_url=server.url + "/v1", api_key="unused", max_retries=0, timeout=120)
    stream = client.completions.create(model=target, prompt=ids, max_tokens=48, stream=True,
                                       extra_body={"return_token_ids": True})
    got, text = [], ""
    for chunk in stream:
        got += chunk.choices[0].token_ids
        text += chunk.choices[0].text
    assert got == oracle(target, ids, 48)
    assert text == bytes(t for t in got if t != EOS).decode("utf-8", "replace")
    s = assert_nothing_leaked(server)
    assert "abort" in server.log()
    assert s["counters"]["requests"] == 2


def test_a_scheduler_crash_exits_101_at_once(kern_server):
    server = kern_server("toy-paged", "--fault", "raise-in-scheduler")
    outcome = {}

    def call():
        try:
            outcome["r"] = httpx.post(server.url + "/v1/completions", json={"prompt": "hello", "max_tokens": 32},
                                      timeout=30)
        except httpx.HTTPError as exc:
            outcome["error"] = exc

    t0 = time.monotonic()
    th = threading.Thread(target=call)
    th.start()
    assert server.wait_exit(10) == 101
    th.join(10)
    assert not th.is_alive(), "a request hung after the scheduler crashed"
    assert "error" in outcome or outcome["r"].status_code >= 500
    assert time.monotonic() - t0 < 10
    assert "scheduler crashed" in server.log()


def test_sigterm_drains_and_exits_0(kern_server):
    target = "toy-stateful"
    server = kern_server(target)
    ids = list(PROMPTS[1].encode())
    result = {}
    th = threading.Thread(target=lambda: result.setdefault("r", ask(server, ids, 64)))
    th.start()
    deadline = time.monotonic() + 10
    while server.stats()["gauges"]["running"] == 0 and "r" not in result and time.monotonic() < deadline:
        time.sleep(0.01)
    server.proc.send_signal(signal.SIGTERM)
    assert server.wait_exit(30) == 0
    th.join(10)
    assert result["r"]["ids"] == oracle(target, ids, 64)


def test_injected_faults_misbehave(kern_server):
    target = "toy-paged"
    server = kern_server(target, "--fault", "wrong-token", "--fault", "no-checkpoint", "--fault", "leak-lease")
    ids = list(PROMPTS[0].encode())
    want = oracle(target, ids, 24)
    got = ask(server, ids, 24)
    assert got["ids"] != want and sum(a != b for a, b in zip(got["ids"], want)) == 1
    assert ask(server, ids, 24)["cached"] == 0  # no-checkpoint: nothing to hit
    _hang_up_after(server, LONG)
    time.sleep(1.0)
    assert server.stats()["gauges"]["leases"] == 1  # leak-lease: the aborted lease never came back


def test_keep_overshoot_misbehaves(kern_server):
    # keep-overshoot keeps prompt 3's overshot snapshot (toy-stateful-spec): turn 2 then answers wrong
    target = "toy-stateful-spec"
    server = kern_server(target, "--fault", "keep-overshoot")
    ids = list(PROMPTS[2].encode())
    first = ask(server, ids, 256)
    assert first["ids"] == oracle(target, ids, 256) and first["kern"]["snapshot"] == "kept"
    ids2 = ids + first["ids"] + list(SUFFIX.encode())
    second = ask(server, ids2, 64)
    assert second["cached"] > 0 and second["ids"] != oracle(target, ids2, 64)
    assert json.dumps(server.stats())  # still serving


def test_every_fault_is_listed_under_help_and_bound_only_by_serve_faults():
    """Each fault is described under --help; `serve/core/faults.py` binds each one (the core's device wrapped,
    a hook point of the core or its admission replaced, or what the HTTP side asks changed); and no
    other file of serve/ names one: the serving code has no fault branch."""
    import ast
    from pathlib import Path

    from click.testing import CliRunner

    from pyruntime import engine
    from serve.cli import serve_command
    from serve.core.core import Core
    from serve.core.faults import FAULTS, Faults

    out = "".join(CliRunner().invoke(serve_command, ["--help"]).output.split())  # click wraps at hyphens
    serve = Path(__file__).resolve().parent.parent / "serve"
    named = {f"{p.relative_to(serve)}: {node.value}" for p in serve.rglob("*.py") if p.name != "faults.py"
             for node in ast.walk(ast.parse(p.read_text()))
             if isinstance(node, ast.Constant) and node.value in FAULTS}
    assert not named, f"fault names outside serve/core/faults.py: {sorted(named)}"
    e, _ = engine("toy-paged", 64 * 16, 0, 4)
    plain = _bound(Core(e), e)
    for name in FAULTS:
        assert f"{name}:" in out, name  # the catalogue's description, not only the choice list
        e.faults = Faults([name])
        assert _bound(e.faults.bind(Core(e)), e) != plain, f"{name} binds nothing"


def _bound(core, e) -> dict:
    """What a fault may bind: the core's device, the hook points replaced on the core and its admission
    (an instance attribute over the class's method), what the HTTP side asks."""
    return {"device": type(core.device).__name__,
            "core": sorted(set(vars(core)) & {"abort", "release_aborted", "retire", "tell"}),
            "admission": sorted(set(vars(core.admission)) & {"lookup", "checkpoint", "on_remapping", "too_long",
                                                             "restore", "restore_copy", "parker"}),
            "limit": e.faults.request_limit(e), "tier": e.faults.tells_tier}


def test_stats_live_answers_while_a_step_never_returns(kern_server):
    """/stats waits for the scheduler's thread; /stats/live does not: idle it says the scheduler waits
    for work, and with `wedge-step` (the second request's step never returns) it says a runtime step
    has been in progress for seconds while /stats gives no answer."""
    server = kern_server("toy-paged", "--fault", "wedge-step")
    idle = httpx.get(server.url + "/stats/live", timeout=10).json()
    assert idle["busy_s"] is None and idle["step_s"] is None and idle["running"] == 0, idle
    ask(server, LONG[:8], 4)  # the first request is served
    threading.Thread(target=lambda: _quietly(server), daemon=True).start()
    t0 = time.monotonic()
    live = None
    while time.monotonic() - t0 < 30:
        live = httpx.get(server.url + "/stats/live", timeout=5).json()
        if live["step_s"] is not None and live["step_s"] > 2:
            break
        time.sleep(0.2)
    assert live is not None and live["step_s"] > 2 and live["busy_s"] >= live["step_s"], live
    assert live["running"] == 1 and live["steps"] >= 1, live
    try:
        httpx.get(server.url + "/stats", timeout=1)
        raise AssertionError("/stats answered while the scheduler is in a step")
    except httpx.TimeoutException:
        pass


def _quietly(server) -> None:
    try:
        httpx.post(server.url + "/v1/completions", json={"prompt": LONG[:8], "max_tokens": 4}, timeout=60)
    except httpx.HTTPError:
        pass


class _Losable:
    """A device double that can lose a stage: each step returns one token a cell; `lose()` sets
    `broken` and counts the loss as a pipeline's take does."""

    protocol = timing = None

    def __init__(self) -> None:
        self.broken = threading.Event()
        self.losses = 0

    def step(self, program, cells):
        return [[1] for _ in cells]

    def lose(self) -> None:
        self.losses += 1
        self.broken.set()


def _stall_steps(dev, n: int) -> float:
    """Seconds `n` steps of one cell take through the fault."""
    t0 = time.monotonic()
    for _ in range(n):
        dev.step("decode", [None])
    return time.monotonic() - t0


def test_stall_until_loss_holds_the_step_until_a_stage_is_lost_and_never_after_a_loss(monkeypatch):
    """The fault e2e's stage_loss session runs under: STALL_AT steps after the first request the next
    step waits for a loss (here one 0.5 s later), once; a server that lost a stage before the stall point
    (the gate's kill came first) never stalls (on pp3 the resumed load once sat out all 120 s of it)."""
    from serve.core import faults

    monkeypatch.setattr(faults, "STALL_S", 10.0)
    inner = _Losable()
    dev = faults.FaultyDevice(inner, ["stall-until-loss"], {"requests": 1}, "prefill", 1)
    assert _stall_steps(dev, faults.STALL_AT) < 0.5  # up to the stall point: no wait
    threading.Timer(0.5, inner.lose).start()
    assert 0.4 < _stall_steps(dev, 1) < 5.0  # the stall, ended by the loss
    assert _stall_steps(dev, 3 * faults.STALL_AT) < 0.5  # once
    early = _Losable()
    dev = faults.FaultyDevice(early, ["stall-until-loss"], {"requests": 1}, "prefill", 1)
    _stall_steps(dev, 3)
    early.lose()
    early.broken.clear()  # the loss taken (the scheduler's take_loss), a replacement serving
    assert _stall_steps(dev, 3 * faults.STALL_AT) < 0.5
