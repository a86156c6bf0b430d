"""Stages forked warm (serve/pipeline/forked.py): a head copies itself before it loads, each copy
serving one stage once told its command; the copies answer as fresh stage processes did, hold none
of the head's sockets, end when the head ends, and a restart after a loss is a fresh process."""

from __future__ import annotations

import os
import re
import signal
import subprocess
import sys
import threading
import time
from urllib.parse import urlparse

import pytest
from conftest import PROMPTS, ask, gone, oracle

from serve.pipeline.forked import Forked, Warm

TARGET = "toy-layers"
STAGE_PID = re.compile(r" pp stage ready stage=(\d+) stages=\d+ pid=(\d+)")



def _fork(code: int, sleep: float) -> int:
    pid = os.fork()
    if pid == 0:
        time.sleep(sleep)
        os._exit(code)
    return pid


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="fork")
def test_forked_answers_as_popen_does():
    """poll is None while the process runs, wait(timeout) raises Popen's TimeoutExpired, the exit
    code comes back as Popen gives it, and kill ends it with -SIGKILL."""
    p = Forked(_fork(7, 0.2))
    assert p.poll() is None
    with pytest.raises(subprocess.TimeoutExpired):
        p.wait(0.01)
    assert p.wait(10) == 7 and p.returncode == 7 and p.poll() == 7
    q = Forked(_fork(0, 60))
    q.kill()
    assert q.wait(10) == -signal.SIGKILL
    q.kill()  # already gone: nothing to do, no error


def test_no_copy_is_made_beside_another_thread():
    """A process with a second Python thread is not forked (the copy would inherit that thread's
    locks held and not the thread): `fork` gives None and the head spawns fresh stages."""
    stop = threading.Event()
    t = threading.Thread(target=stop.wait, daemon=True)
    t.start()
    try:
        assert not Warm.safe()
        assert Warm.fork([1, 2], print) is None
    finally:
        stop.set()
        t.join()


def _fresh_python(code: str) -> str:
    """`code` run by a fresh interpreter (one thread: where `Warm.fork` makes copies); what it printed."""
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stdout + out.stderr
    return out.stdout


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="fork")
def test_copies_never_started_exit_when_released():
    """In a process of one thread (a fresh interpreter): no entry, no copy; two copies made and released unstarted both
    exit 0 and are reaped; a third, started with a command that fails, exits with that command's
    code (kern serve's 2 for a target that does not exist)."""
    code = (
        "import os, sys\n"
        "from serve.pipeline.forked import Warm\n"
        "from serve.cli import _stage_entry\n"
        "assert Warm.safe() and Warm.fork([1], None) is None\n"
        "w = Warm.fork([1, 2, 3], _stage_entry)\n"
        "assert w is not None\n"
        "bad = w.start(3, ['no-such-target', '--pp-head', 'tcp://127.0.0.1:9'])\n"
        "pids = dict(w.pids)\n"
        "w.close()\n"
        "gone = [os.path.exists(f'/proc/{pids[k]}') for k in (1, 2)]\n"
        "print('gone', gone, 'bad', bad.wait(60))\n"
    )
    assert "gone [False, False] bad 2" in _fresh_python(code)


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="fork")
def test_a_copy_that_died_while_waiting_is_not_started():
    """A copy killed before it was told its command: `start` gives None (the head spawns a fresh
    stage instead) and the dead copy is reaped; the other copy still starts."""
    code = (
        "import os, signal\n"
        "from serve.pipeline.forked import Warm\n"
        "w = Warm.fork([1, 2], lambda argv: print('served', argv, flush=True))\n"
        "os.kill(w.pids[1], signal.SIGKILL)\n"
        "import time; time.sleep(0.2)\n"
        "print('dead', w.start(1, ['x']))\n"
        "ok = w.start(2, ['y'])\n"
        "print('code', ok.wait(30))\n"
    )
    said = _fresh_python(code)
    assert "dead None" in said and "served ['y']" in said and "code 0" in said, said


def _listening_inodes(port: int) -> set[str]:
    found = set()
    for table in ("/proc/net/tcp", "/proc/net/tcp6"):
        try:
            lines = open(table).read().splitlines()[1:]
        except OSError:
            continue
        for line in lines:
            f = line.split()
            if int(f[1].rsplit(":", 1)[1], 16) == port and f[3] == "0A":  # LISTEN
                found.add(f[9])
    return found


def _socket_inodes(pid: int) -> set[str]:
    out = set()
    for fd in os.listdir(f"/proc/{pid}/fd"):
        try:
            link = os.readlink(f"/proc/{pid}/fd/{fd}")
        except OSError:
            continue
        if link.startswith("socket:["):
            out.add(link[8:-1])
    return out


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="/proc and fork")
@pytest.mark.skipif(os.environ.get("KERN_TEST_BACKEND", "cpu") != "cpu", reason="CPU stages")
@pytest.mark.parametrize("stages", [3])
def test_a_head_forks_its_stages_and_they_serve_as_fresh_ones(kern_server, stages):
    """`kern serve toy-layers --stages 3`: the head says its stages were forked; each stage is a
    child of the head named kern-stage-K with the head's command line (a copy, not a fresh
    interpreter), holds no socket on the server's port, and the answers are toy/model.py's; when the
    head is killed every stage ends."""
    s = kern_server(TARGET, "--stages", str(stages), "--pp-timeout", "30")
    assert re.search(r" pp head listening .*started=forked", s.log()), s.log()[-2000:]
    pids = {int(k): int(p) for k, p in STAGE_PID.findall(s.log())}
    assert sorted(pids) == list(range(1, stages)), s.log()[-2000:]
    port = urlparse(s.url).port
    listening = _listening_inodes(port)
    assert listening, f"nothing listens on {port}"
    head_cmd = open(f"/proc/{s.proc.pid}/cmdline", "rb").read()
    for k, pid in pids.items():
        assert open(f"/proc/{pid}/comm").read().strip() == f"kern-stage-{k}"
        assert open(f"/proc/{pid}/cmdline", "rb").read() == head_cmd
        assert not _socket_inodes(pid) & listening, f"stage {k} holds the server's port {port}"
    ids = list(PROMPTS[0].encode())
    assert ask(s, ids, 12)["ids"] == oracle(TARGET, ids, 12)
    s.proc.send_signal(signal.SIGKILL)
    assert gone(pids.values(), 20), "stages outlived their head"


def test_an_open_gpu_driver_forbids_copies(monkeypatch):
    """A process holding an NVIDIA device file open (CUDA initialised) makes no copies: CUDA is not
    usable in a forked child."""
    import serve.pipeline.forked as forked

    real = os.readlink
    monkeypatch.setattr(forked.os, "readlink", lambda p: "/dev/nvidiactl" if p.startswith("/proc/self/fd/") else real(p))
    monkeypatch.setattr(forked.threading, "active_count", lambda: 1)
    assert forked._driver_open()
    assert not Warm.safe()
