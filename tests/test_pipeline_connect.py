"""`--stage-connect-timeout`: a pipeline head waiting for its stages (`--pp-listen`) says which it waits
for while it waits, and a stage that never connects ends the head at the limit with one line naming
that stage (not the ones that did connect), exit 3. The head is a real `kern serve` process serving a
3-stage cut of the layered toy; stage 1 is this test, which connects and says hello as a stage does
(at once, so the test does not race a stage's start-up); stage 2 never connects."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
from e2e.session import free_port
from test_pipeline_serve import TARGET, _missing  # the same target, and the same reasons it may be missing

REPO = Path(__file__).resolve().parents[1]
LIMIT = 5.0


pytestmark = pytest.mark.skipif(_missing() is not None, reason=str(_missing()))


def _serve(log: Path, *args: str) -> subprocess.Popen:
    """`python -m serve ARGS --backend cpu`, started by the one launcher's fresh processes (e2e/spawn.py):
    its own process group, its stdout and stderr in `log`."""
    from e2e.spawn import Processes

    return Processes.project(cwd=REPO).start([sys.executable, "-m", "serve", *args, "--backend", "cpu"], log)


@pytest.fixture
def procs():
    started: list[subprocess.Popen] = []
    yield started
    for p in started:
        if p.poll() is None:
            os.killpg(p.pid, signal.SIGKILL)
        p.wait()


def test_a_stage_that_never_connects_ends_the_head_naming_it(tmp_path, procs):
    import zmq

    from serve.pipeline.plan import pipeline_paths
    from serve.pipeline.transport import Message, ZmqWire

    paths, weights = pipeline_paths(TARGET, 3, None, None, None, True)  # stage manifests, as the head cuts them
    cut = tmp_path / "cut"
    cut.mkdir()
    for p in [*paths, *weights]:  # a cut directory: the stage manifests and the weights beside them
        (cut / p.name).write_bytes(p.read_bytes())
    addr = f"tcp://127.0.0.1:{free_port()}"
    t0 = time.monotonic()
    log = tmp_path / "head.log"
    head = _serve(log, str(cut), "--pp-listen", addr, "--port", "0", "--stage-connect-timeout", f"{LIMIT:g}")
    procs.append(head)
    ctx = zmq.Context()
    try:  # stage 1: its control socket, and its hello (sent as soon as the head has bound the address)
        ctl = ZmqWire.make(ctx, zmq.DEALER, connect=addr, identity=b"s1", send_timeout=60)
        ctl.send(Message("hello", {"stage": 1, "stages": 3, "cut": "any", "pages": 64, "page_bytes": 1,
                                   "host_pages": 0, "up": "tcp://127.0.0.1:1", "pid": os.getpid(), "lined": False}))
        try:
            head.wait(timeout=LIMIT + 60)
        except subprocess.TimeoutExpired:
            pytest.fail(f"the head still waits {LIMIT + 60:g} s after it started (--stage-connect-timeout {LIMIT:g})")
    finally:
        ctx.destroy(linger=0)
    took = time.monotonic() - t0
    err = log.read_text(errors="replace")
    assert head.returncode == 3, err[-3000:]
    assert took >= LIMIT, took  # the limit ended it, not something else
    assert " pp stage connected stage=1 stages=3" in err, err[-3000:]
    assert f"waiting for stage 2/3 to connect (up to {LIMIT:g} s)..." in err, err[-3000:]
    errors = [line for line in err.splitlines() if " ERROR " in line]
    assert len(errors) == 1 and "Traceback" not in err, err[-3000:]
    line = errors[0]
    assert " pp stage lost " in line and "stages=2 " in line, line
    assert f"stage 2/3 did not connect within {LIMIT:g} s (--stage-connect-timeout)" in line, line
    assert "1/3" not in line  # stage 1 connected: only the missing stage is named


def test_the_flag_is_refused_when_not_positive():
    r = subprocess.run([sys.executable, "-m", "serve", TARGET, "--stages", "2", "--stage-connect-timeout", "0"],
                       cwd=REPO, capture_output=True, text=True, timeout=120)
    assert r.returncode == 2
    lines = r.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("kern serve: error:") and "--stage-connect-timeout" in lines[0]
