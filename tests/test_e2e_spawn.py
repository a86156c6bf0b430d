"""The one launcher (`e2e/spawn.py`, `e2e.session.launch`): what every spawner promises a session, and
that stopping a server takes its whole process group, whatever it started."""

from __future__ import annotations

import os
import signal
import sys
import time

import pytest

from conftest import gone
from e2e.session import Session, ServerError, launch
from e2e.spawn import Processes, Spawner, run_command

CHILD = ("import subprocess, sys, time\n"
         "p = subprocess.Popen([sys.executable, '-c', 'import time; time.sleep(300)'])\n"
         "print('child', p.pid, flush=True)\n"
         "time.sleep(300)\n")


def _child_pid(log, timeout: float = 20.0) -> int:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        for line in log.read_text().splitlines():
            if line.startswith("child "):
                return int(line.split()[1])
        time.sleep(0.05)
    raise AssertionError(f"no child line in {log.read_text()!r}")


def test_every_spawner_is_one():
    from e2e.hosts import Hosts
    from e2e.zygote import Zygote

    for kind in (Processes, Zygote, Hosts):
        assert all(callable(getattr(kind, m, None)) for m in ("start", "close")), kind
        assert isinstance(kind.hosted, bool) and isinstance(kind.how, str), kind
    assert isinstance(Processes.project(), Spawner)


def test_a_fresh_process_leads_its_own_group_and_its_stop_takes_what_it_started(tmp_path):
    s = Session("grp", [sys.executable, "-c", CHILD], 1, tmp_path / "grp.log", term_timeout=5.0)
    s._launch()
    try:
        child = _child_pid(s.log.path)
        assert os.getpgid(s.pid) == s.pid, "a fresh server does not lead its own process group"
        assert os.getpgid(child) == s.pid
    finally:
        s.stop()
    assert gone([child], 5), "the server's stop left what it started running"
    assert s.exit_code == -signal.SIGTERM


def test_a_command_past_its_timeout_is_killed_with_its_group(tmp_path):
    log = tmp_path / "cmd.log"
    t0 = time.monotonic()
    out, code = run_command(Processes.project(), [sys.executable, "-c", CHILD], log, timeout=1.0)
    assert code is None and "timed out" in out
    assert time.monotonic() - t0 < 30
    child = _child_pid(log)
    assert gone([child], 5)
    assert log.read_text().startswith(f"$ {sys.executable} -c ")


def test_launch_stops_a_server_that_never_gets_ready(tmp_path):
    with pytest.raises(ServerError, match="not ready after 1s"):
        launch(Session("never", [sys.executable, "-c", CHILD], 0, tmp_path / "never.log", load_timeout=1.0,
                       term_timeout=2.0))
    child = _child_pid(tmp_path / "never.log")
    assert gone([child], 5), "a server that never got ready was left running"


@pytest.mark.parametrize("given", [None, "3"])
def test_the_gates_servers_run_one_numba_thread_unless_told(monkeypatch, given):
    """`gate_env`: `project_env` (this checkout first on the path, unbuffered) and NUMBA_NUM_THREADS 1
    where the gate's environment does not name it (its servers outnumber the cores); a value it names
    is kept. `project_env` alone (the benches' servers) adds no thread count."""
    from e2e.spawn import ROOT, Processes, gate_env, project_env

    if given is None:
        monkeypatch.delenv("NUMBA_NUM_THREADS", raising=False)
    else:
        monkeypatch.setenv("NUMBA_NUM_THREADS", given)
    monkeypatch.setenv("PYTHONPATH", "/elsewhere")
    env = gate_env()
    assert env["NUMBA_NUM_THREADS"] == (given or "1") and Processes.gate().env == env
    assert env["PYTHONPATH"] == f"{ROOT}{os.pathsep}/elsewhere" and env["PYTHONUNBUFFERED"] == "1"
    assert env["HOME"] == os.environ["HOME"]
    assert project_env().get("NUMBA_NUM_THREADS") == given
