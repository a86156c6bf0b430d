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
