"""The gate's zygote (`oracle/zygote.py`, `e2e/zygote.py`): a forked `kern` is the command's own
process: its exit code, its log, its signals; and closing the zygote leaves no child running."""

from __future__ import annotations

import json
import os
import signal
import time
from pathlib import Path

import httpx
import pytest

from e2e.log import Log
from e2e.session import Session, project_env, server_command
from e2e.zygote import Zygote
from manifests.config import PACKAGED



@pytest.fixture(scope="module")
def zygote():
    z = Zygote(project_env(), PACKAGED, ["toy-paged"])
    yield z
    z.close()


def _gone(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return True
    return False


def test_a_forked_run_has_its_commands_output_and_exit_code(zygote, tmp_path):
    """`kern run` forked: exit 0 and its output in the log; a bad target: exit 2 and the error in the log."""
    ok = zygote.spawn(["--config", str(PACKAGED), "run", "toy-paged", "--steps", "3", "--backend", "cpu"],
                      tmp_path / "ok.log")
    assert ok.wait(60) == 0
    assert "generated ids" in (tmp_path / "ok.log").read_text()
    bad = zygote.spawn(["--config", str(PACKAGED), "run", "no-such-target", "--backend", "cpu"], tmp_path / "bad.log")
    assert bad.wait(60) == 2
    assert "no-such-target" in (tmp_path / "bad.log").read_text()


def test_a_forked_server_serves_and_drains_on_sigterm(zygote, tmp_path):
    """A session forked by the zygote reads its port from the log, answers, and exits 0 on SIGTERM; it
    ignores SIGPIPE as a fresh Python does (else a client's hang-up mid-answer kills it: exit -13)."""
    cmd = server_command(None, PACKAGED, "toy-paged", 0, ["--backend", "cpu", "--capacity", "1024"])
    s = Session("z", cmd, 0, tmp_path / "server.log", spawner=zygote)
    facts = s.start()
    # the ready line's start split counts from the fork: within the gate's own wait for it, and the parts
    # (imports, manifest, device, pool, runtime, scheduler) add up to it
    parts = {k: float(v) for k, v in facts.items() if k.endswith("_s") and k not in ("start_s", "load_s")}
    assert {"imports_s", "device_s", "runtime_s", "scheduler_s"} <= parts.keys(), facts
    assert 0 < float(facts["start_s"]) <= facts["load_s"] + 0.1, facts
    assert abs(sum(parts.values()) - float(facts["start_s"])) < 0.01 * len(parts), facts
    status = Path(f"/proc/{s.proc.pid}/status")
    if status.exists():
        ignored = int(next(ln for ln in status.read_text().splitlines() if ln.startswith("SigIgn:")).split()[1], 16)
        assert ignored & (1 << (signal.SIGPIPE - 1)), "the forked server does not ignore SIGPIPE"
    r = httpx.post(s.url + "/v1/completions", json={"model": "toy-paged", "prompt": "Hi", "max_tokens": 4}, timeout=30)
    assert r.status_code == 200, r.text
    assert s.stop() == 0
    assert Log(tmp_path / "server.log").lines("stopped")


def test_closing_the_zygote_kills_what_it_still_runs(tmp_path):
    """A child left running when the gate closes its zygote does not outlive it."""
    z = Zygote(project_env(), PACKAGED, [])
    cmd = server_command(None, PACKAGED, "toy-paged", 0, ["--backend", "cpu", "--capacity", "1024"])
    s = Session("left", cmd, 0, tmp_path / "server.log", spawner=z)
    s.start()
    pid = s.proc.pid
    z.close()
    deadline = time.monotonic() + 10
    while not _gone(pid) and time.monotonic() < deadline:
        time.sleep(0.05)
    assert _gone(pid), f"server {pid} outlived its zygote"
    assert s.proc.poll() == -signal.SIGKILL


def test_gpu_imports_say_what_they_did_and_children_still_run(tmp_path):
    """`--gpu-imports` (a GPU gate's zygote) imports the GPU backend and its kernel modules, or says
    why not (no cupy here), and never leaves CUDA initialised: a forked child still runs and exits 0.
    Its answer and CPU usage come back with the exit."""
    z = Zygote(project_env(), PACKAGED, [], gpu_imports=True)
    try:
        assert z.gpu_imports and (z.gpu_imports.startswith("none (") or "numba.cuda" in z.gpu_imports)
        c = z.spawn(["--config", str(PACKAGED), "run", "toy-paged", "--steps", "3", "--backend", "cpu"], tmp_path / "run.log")
        assert c.wait(60) == 0, (tmp_path / "run.log").read_text()
        assert len(c.usage["cpu_s"]) == 2 and c.usage["maxrss_kib"] > 0
    finally:
        z.close()


def test_a_pid_the_kernel_reuses_is_not_taken_for_an_earlier_childs_exit():
    """The zygote's replies and exits arrive in order on one stream: a new child's pid that an earlier,
    exited child had (the kernel reuses pids) starts with no exit code, and its own exit is seen.
    (Beside a second suite a fresh server was once told 'exited with code 0' at once, and its real
    exit never seen: an old child's code under the same pid.)"""
    import io
    import threading
    from types import SimpleNamespace

    from e2e.zygote import Zygote

    z = object.__new__(Zygote)
    lines = [{"pid": 7}, {"exit": 7, "code": 0}, {"pid": 7}]
    z.proc = SimpleNamespace(stdout=io.BytesIO("".join(json.dumps(m) + "\n" for m in lines).encode()))
    z.cond, z.exits, z.usage, z.replies, z.gone, z.on_progress = threading.Condition(), {}, {}, [], False, None
    z._read()
    assert [r["pid"] for r in z.replies] == [7, 7]
    z.gone = False  # the stream's end stands for the zygote's exit; here only the pids are asked
    assert z.exit_code(7) is None  # the second child runs
    z.proc.stdout = io.BytesIO((json.dumps({"exit": 7, "code": 3}) + "\n").encode())
    z._read()
    assert z.exit_code(7) == 3


def test_a_child_inherits_the_warm_heap_frozen(tmp_path):
    """The zygote freezes its warm heap before it forks (`oracle.zygote.freeze`): a child's collections
    then never walk what it inherited (nor write to those objects, which would copy their pages into
    it). A child finds that heap in the collector's permanent generation: the objects the ready line
    counted, less the few freed since by their reference counts (the ready line's own)."""
    import subprocess
    import sys

    code = ("import gc; from oracle.zygote import main; "
            "main([], lambda argv: print('frozen', gc.get_freeze_count(), flush=True) or 0)")
    proc = subprocess.Popen([sys.executable, "-c", code], stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                            env=project_env(), cwd=Path(__file__).resolve().parents[1])
    try:
        msgs = iter(lambda: json.loads(proc.stdout.readline() or "{}"), {})
        ready = next(m for m in msgs if "ready" in m)
        assert ready["ready"] and ready["frozen"] > 10_000, ready  # the server's imports alone are more
        log = tmp_path / "child.log"
        proc.stdin.write((json.dumps({"argv": [], "log": str(log)}) + "\n").encode())
        proc.stdin.flush()
        pid = next(m for m in msgs if "pid" in m)["pid"]
        assert next(m for m in msgs if m.get("exit") == pid)["code"] == 0
        word, n = log.read_text().split()
        assert word == "frozen" and 0.99 * ready["frozen"] <= int(n) <= ready["frozen"], (n, ready)
    finally:
        proc.stdin.close()
        proc.wait(30)
