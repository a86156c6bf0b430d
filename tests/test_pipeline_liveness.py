"""Liveness between a head and a stage, each a real process running its watcher: a stage killed
(SIGKILL) or frozen (SIGSTOP) ends the head with a clear line and exit code 3 within the limit; a
head that goes away ends the stage. Nothing waits forever: every wait here has a deadline."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

PEERS = Path(__file__).with_name("pp_peers.py")
LIMIT = 2.0  # --pp-timeout for these peers


def _start(*args: str) -> subprocess.Popen:
    return subprocess.Popen([sys.executable, str(PEERS), *args], stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                            text=True, start_new_session=True)


@pytest.fixture
def pair():
    procs: list[subprocess.Popen] = []
    head = _start("head", str(LIMIT))
    procs.append(head)
    addr = head.stdout.readline().strip()
    assert addr.startswith("tcp://"), head.stderr.read()
    stage = _start("stage", addr, str(LIMIT))
    procs.append(stage)
    assert stage.stdout.readline().strip() == "stage up"
    time.sleep(1.0)  # a few heartbeats each way
    assert head.poll() is None and stage.poll() is None
    yield head, stage
    for p in procs:
        if p.poll() is None:
            os.killpg(p.pid, signal.SIGKILL)
        p.wait()


def _exit_within(p: subprocess.Popen, seconds: float) -> tuple[int, str, float]:
    t0 = time.monotonic()
    try:
        code = p.wait(seconds)
    except subprocess.TimeoutExpired:
        pytest.fail(f"still running {seconds} s after its peer went away")
    return code, p.stderr.read(), time.monotonic() - t0


def test_a_killed_stage_ends_the_head(pair):
    head, stage = pair
    stage.send_signal(signal.SIGKILL)
    code, err, _ = _exit_within(head, LIMIT + 5)
    assert code == 3
    assert " pp stage lost " in err and "stage=1" in err


def test_a_frozen_stage_ends_the_head_at_the_limit(pair):
    """A stopped process keeps its connection open: only the missing heartbeats give it away."""
    head, stage = pair
    stage.send_signal(signal.SIGSTOP)
    code, err, took = _exit_within(head, LIMIT + 5)
    assert code == 3
    assert " pp stage lost " in err and 'reason="no heartbeat"' in err
    assert took >= LIMIT - 1.0  # the limit, not the connection, ended it
    stage.send_signal(signal.SIGCONT)


@pytest.mark.parametrize("how", [signal.SIGKILL, signal.SIGSTOP], ids=["killed", "frozen"])
def test_a_head_that_goes_away_ends_the_stage(pair, how):
    head, stage = pair
    head.send_signal(how)
    code, err, _ = _exit_within(stage, LIMIT + 5)
    assert code == 3
    assert " pp head gone " in err
    if how == signal.SIGSTOP:
        assert 'reason="no heartbeat"' in err


class _Wire:
    """A head's control wire in memory: `recv` hands out what a test queued (each message from the
    sender it names), `send` keeps what the watcher sent."""

    def __init__(self) -> None:
        import queue

        self.q: queue.Queue = queue.Queue()
        self.sent: list = []

    def recv(self, timeout: float):
        import queue

        try:
            return self.q.get(timeout=timeout)
        except queue.Empty:
            return None

    def send(self, msg, to=None) -> None:
        self.sent.append((to, msg.kind))


@pytest.mark.parametrize("beats", [False, True], ids=["frozen-after-hello", "beating"])
def test_a_stage_heard_only_by_its_hello_is_still_watched(beats):
    """A stage frozen after its hello and before its watcher's first heartbeat reached the head (a
    forked-warm stage is up in well under the first beat's 0.4 s; the loaded suite froze one there) is
    lost once silent past the limit, as one frozen later is; a stage that goes on beating is not; one
    never heard from is left to the startup's own deadline."""
    from serve.pipeline.liveness import HeadWatch
    from serve.pipeline.transport import Message

    wire, lost = _Wire(), []
    watch = HeadWatch(wire, [1, 2], 0.3, on_lost=lambda k, why: lost.append((k, why)))
    wire.q.put(Message("hello", {"stage": 1}, sender=b"s1"))
    watch.start()
    try:
        end = time.monotonic() + 1.5
        while time.monotonic() < end:
            if beats:
                wire.q.put(Message("hb", sender=b"s1.hb"))
            time.sleep(0.05)
    finally:
        watch.stop()
        watch.join(timeout=5)  # ended within one receive
    assert not watch.is_alive()
    assert lost == ([] if beats else [(1, "no heartbeat")]), lost
    assert watch.control.get_nowait().kind == "hello"
    assert (b"s1.hb", "hb") in wire.sent if beats else not wire.sent  # beats only to a heartbeat heard from
