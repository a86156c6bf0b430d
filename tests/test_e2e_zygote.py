"""The gate's zygote (`oracle/zygote.py`, `e2e/zygote.py`): a forked `kern` is the command's own
process: its exit code, its log, its signals; and closing the zygote leaves no child running."""

from __future__ import annotations

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
    s = Session("z", cmd, 0, tmp_path / "server.log", zygote=zygote)
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
    s = Session("left", cmd, 0, tmp_path / "server.log", zygote=z)
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



def _age(pid: int) -> float:
    stat = Path(f"/proc/{pid}/stat").read_bytes()
    started = int(stat[stat.rindex(b")") + 2:].split()[19]) / os.sysconf("SC_CLK_TCK")
    return time.clock_gettime(time.CLOCK_BOOTTIME) - started


def _children(ppid: int) -> set[int]:
    out = set()
    for d in Path("/proc").iterdir():
        try:
            if d.name.isdigit() and int((d / "stat").read_bytes().rsplit(b")", 1)[1].split()[1]) == ppid:
                out.add(int(d.name))
        except (OSError, ValueError, IndexError):
            pass
    return out


@pytest.mark.skipif(not Path("/proc/self/stat").exists(), reason="reads process start times from /proc")
def test_spares_run_requests_as_fresh_children_do_and_none_outlives_close(tmp_path):
    """`--spares 4`: requests are run by children forked before they were asked for (a spare's age
    exceeds the time since its spawn), with their exit codes, logs and usage as a fresh child's; one
    naming --device gets a fresh child (younger than that); the spare left unused is killed at close."""
    z = Zygote(project_env(), PACKAGED, [], spares=4)
    try:
        time.sleep(0.6)
        run = ["--config", str(PACKAGED), "run", "toy-paged", "--steps", "2", "--backend", "cpu"]
        kids = []
        for i, extra in enumerate([[], [], ["--device", "0"], []]):
            t = time.monotonic()
            c = z.spawn(run + extra, tmp_path / f"k{i}.log")
            kids.append((c, _age(c.pid), time.monotonic() - t))
        unused = _children(z.proc.pid) - {c.pid for c, _, _ in kids}
        assert len(unused) == 1, unused
        for i, (c, a, spawn_s) in enumerate(kids):
            if i == 2:
                assert a < 0.5, (i, a)
                continue
            assert a > spawn_s + 0.5, (i, a, spawn_s)
            assert c.wait(60) == 0, (tmp_path / f"k{i}.log").read_text()
            assert "generated ids" in (tmp_path / f"k{i}.log").read_text()
            assert len(c.usage["cpu_s"]) == 2
        kids[2][0].wait(60)
    finally:
        z.close()
    deadline = time.monotonic() + 10
    while not all(_gone(p) for p in unused) and time.monotonic() < deadline:
        time.sleep(0.05)
    assert all(_gone(p) for p in unused), f"an unused spare {unused} outlived its zygote"
