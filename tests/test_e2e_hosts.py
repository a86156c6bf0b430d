"""The gate's hosts (`oracle/host.py`, `e2e/hosts.py`): several `kern` commands in one process, each
a thread, each with what a process of its own would have: its log, its environment, its exit code,
its stop. Run on the CPU here; on a GPU the same host holds one CUDA context for all of them."""

from __future__ import annotations

import json
import os
import signal
import threading
import time

import httpx
import pytest

from e2e.cli import main
from e2e.hosts import Host, Hosts
from e2e.log import Log
from e2e.session import ServerExited, Session, project_env, server_command
from e2e.zygote import ZygoteGone
from manifests.config import PACKAGED
from serve.common import hosted

FLAGS = ["--backend", "cpu", "--capacity", "1024"]


@pytest.fixture(scope="module")
def host():
    h = Host(project_env(), PACKAGED, ["toy-paged"], args=["--backend", "cpu"])
    yield h
    h.close()


def _session(host, tmp_path, name: str, *flags: str) -> Session:
    cmd = server_command(None, PACKAGED, "toy-paged", 0, [*FLAGS, *flags])
    return Session(name, cmd, 0, tmp_path / f"{name}.log", spawner=host)


def _complete(s: Session, prompt: str = "Hi", n: int = 4) -> httpx.Response:
    return httpx.post(s.url + "/v1/completions", json={"model": "toy-paged", "prompt": prompt, "max_tokens": n},
                      timeout=30)


def test_two_hosted_servers_serve_at_once_each_with_its_own_log_and_stop(host, tmp_path):
    """Two servers in one host: each binds its own port, writes only its own log, and drains on its
    own SIGTERM (exit 0) while the other goes on serving."""
    a, b = _session(host, tmp_path, "a"), _session(host, tmp_path, "b")
    a.start()
    b.start()
    assert a.port != b.port
    ra, rb = _complete(a), _complete(b)
    assert ra.status_code == rb.status_code == 200
    assert ra.json()["choices"][0]["text"] == rb.json()["choices"][0]["text"]  # same target, same answer
    assert a.proc.hosted and a.proc.pid != b.proc.pid
    assert a.stop() == 0
    assert _complete(b).status_code == 200, "stopping one hosted server stopped the other"
    assert b.stop() == 0
    for s, other in ((a, b), (b, a)):
        log = Log(s.log.path)
        assert len(log.lines("serving")) == 1 and log.lines("serving")[0]["port"] == s.port
        assert log.lines("stopped"), log.text()
        assert f"port={other.port}" not in log.text()


def test_each_hosted_command_has_its_own_environment_and_level(host, tmp_path):
    """RUST_LOG is the command's own: a server asked for debug lines writes them; one beside it in the
    same process, asked for none, does not."""
    loud = _session(host, tmp_path, "loud")  # Session.start passes RUST_LOG=kern_serve=debug
    quiet = _session(host, tmp_path, "quiet", "--log-level", "info")
    loud.start()
    quiet.start()
    for s in (loud, quiet):
        assert _complete(s).status_code == 200
    loud.stop()
    quiet.stop()
    assert " admitted " in loud.log.text()
    assert " admitted " not in quiet.log.text() and " finished " not in quiet.log.text()


def test_hosted_runs_exit_with_their_codes_and_outputs(host, tmp_path):
    """`kern run` as a host's command: exit 0 with its output in its log; a target that does not
    exist: exit 2 with the error in its own log, and nothing of one in the other's."""
    ok = host.spawn(["--config", str(PACKAGED), "run", "toy-paged", "--steps", "3", "--backend", "cpu"],
                    tmp_path / "ok.log")
    bad = host.spawn(["--config", str(PACKAGED), "run", "no-such-target", "--backend", "cpu"], tmp_path / "bad.log")
    assert ok.wait(60) == 0
    assert bad.wait(60) == 2
    assert "generated ids" in (tmp_path / "ok.log").read_text()
    assert "no-such-target" in (tmp_path / "bad.log").read_text()
    assert "no-such-target" not in (tmp_path / "ok.log").read_text()
    assert "generated ids" not in (tmp_path / "bad.log").read_text()


def test_a_killed_hosted_server_is_reported_at_once_and_stops(host, tmp_path):
    """SIGKILL: the command is reported killed (-9) at once, and its server stops (its port closes)."""
    s = _session(host, tmp_path, "k")
    s.start()
    t0 = time.monotonic()
    s.proc.kill()
    assert s.proc.wait(5) == -9
    assert time.monotonic() - t0 < 5
    deadline = time.monotonic() + 10
    while time.monotonic() < deadline:
        try:
            httpx.get(s.url + "/health", timeout=1)
        except httpx.TransportError:
            break
        time.sleep(0.05)
    else:
        pytest.fail("a killed hosted server still answers after 10 s")


def test_a_crashing_scheduler_ends_its_command_with_101_not_the_host(host, tmp_path):
    """A scheduler that raises ends its own command with 101 (not the host: os._exit there would take
    every server with it); its request does not hang; the server beside it goes on."""
    other = _session(host, tmp_path, "other")
    other.start()
    s = _session(host, tmp_path, "crash", "--fault", "raise-in-scheduler")
    s.start()
    outcome = {}

    def call():
        try:
            outcome["r"] = _complete(s, "hello", 32)
        except httpx.HTTPError as exc:
            outcome["error"] = exc

    th = threading.Thread(target=call)
    th.start()
    assert s.proc.wait(10) == 101
    th.join(15)
    assert not th.is_alive(), "a request hung after the hosted scheduler crashed"
    assert "error" in outcome or outcome["r"].status_code >= 500
    assert "scheduler crashed" in s.log.text()
    assert _complete(other).status_code == 200
    assert other.stop() == 0


def test_hosts_place_by_weight_and_close_stops_everything(tmp_path):
    """Each spawn goes to the host whose running commands weigh least: a command of weight 3 (a
    default session) counts as three, so the next three of weight 1 go to the other host; a stopped
    one weighs nothing. Closing the hosts stops what they still run: no server outlives them, and
    the processes end."""
    hs = Hosts(2, project_env(), "cpu", PACKAGED, ["toy-paged"], log_dir=tmp_path / "hosts")
    assert 1 <= len(hs) <= 2 and hs.wait_all(60) and len(hs) == 2  # back at the first ready; the other joins
    for h in hs.hosts:  # each said its warm by part, and the parts fit in its whole warm
        assert set(h.warm_split) == {"imports_s", "device_s", "targets_s"} and min(h.warm_split.values()) >= 0
        assert sum(h.warm_split.values()) <= h.warm_s + 0.05, (h.warm_split, h.warm_s)
    assert hs.slowest().startswith("imports ") and "targets" in hs.slowest()
    started = []
    try:
        for i, w in enumerate((3, 1, 1, 1)):
            s = Session(f"s{i}", server_command(None, PACKAGED, "toy-paged", 0, FLAGS), 0, tmp_path / f"s{i}.log",
                        spawner=hs, weight=w)
            s.start()
            started.append(s)
        heavy = started[0].proc.zygote
        assert all(s.proc.zygote is not heavy for s in started[1:]), "a light command joined the heavy one's host"
        assert sorted(hs.load(h) for h in hs.hosts) == [3, 3]
        assert started[1].stop() == 0
        assert sorted(hs.load(h) for h in hs.hosts) == [2, 3]
    finally:
        hs.close()  # back once every host said its commands ended: the servers are gone already
    for s in started[2:]:
        with pytest.raises(httpx.TransportError):
            httpx.get(s.url + "/health", timeout=2)
        assert s.stop() == -9  # the host reported it killed as it closed
    assert hs.cpu_s() is not None and hs.cpu_s() > 0
    deadline = time.monotonic() + 10  # and the processes end (on a GPU, once the driver let their context go)
    while any(h.proc.poll() is None for h in hs.hosts) and time.monotonic() < deadline:
        time.sleep(0.05)
    assert all(h.proc.poll() is not None for h in hs.hosts), [h.proc.pid for h in hs.hosts]


class _FakeHost:
    """A stand-in for `Host`: ready after the delay its index's entry in DELAYS gives (None: fails)."""

    DELAYS: list = []
    made: list = []

    def __init__(self, env, config, warm, ready_timeout, args=(), stderr=None):
        delay = _FakeHost.DELAYS.pop(0)
        if delay is None:
            raise OSError("no such host")
        time.sleep(delay)
        self.gone, self.closed, self.warm_s, self.warm_split = False, False, delay, {}
        _FakeHost.made.append(self)

    def hang_up(self):
        pass

    def close(self):
        self.closed = True


def test_hosts_are_back_at_the_first_ready_and_the_rest_join_as_they_warm(monkeypatch):
    """`Hosts(n)` returns once one host is ready (the gate's first session starts on it) while the
    others still warm; each joins when ready, a failed one is an error, and `close` closes every host,
    one still warming included, as soon as it is ready."""
    import e2e.hosts as hosts_module

    monkeypatch.setattr(hosts_module, "Host", _FakeHost)
    _FakeHost.made = []
    _FakeHost.DELAYS = [0.0, 2.0, None]  # taken in start order: which index gets which does not matter
    t0 = time.monotonic()
    hs = Hosts(3, {}, "gpu")
    assert time.monotonic() - t0 < 1.5 and len(hs) == 1 and hs.starting() in (1, 2)  # the failed one may not be in yet
    assert hs.wait_all(10) and len(hs) == 2 and hs.errors == ["no such host"] and hs.all_warm_s >= 2.0
    hs.close()
    assert all(h.closed for h in _FakeHost.made)
    _FakeHost.made = []
    _FakeHost.DELAYS = [0.0, 2.0]
    hs = Hosts(2, {}, "gpu")
    assert len(hs) == 1
    hs.close()  # the second is still warming: closed as soon as it is ready, never given a command
    assert len(_FakeHost.made) == 2 and all(h.closed for h in _FakeHost.made) and len(hs) == 1
    _FakeHost.DELAYS = [None, None]
    with pytest.raises(ZygoteGone, match="no such host"):
        Hosts(2, {}, "gpu")


def test_a_server_whose_host_died_says_so(tmp_path):
    """A host that dies (a driver fault, a kill) takes its servers with it: each is reported killed
    (-9), and the session's error names the host, its exit and its log; new commands go to a host
    still alive."""
    hs = Hosts(2, project_env(), "cpu", PACKAGED, [], log_dir=tmp_path / "hosts")
    try:
        s = Session("doomed", server_command(None, PACKAGED, "toy-paged", 0, FLAGS), 0, tmp_path / "d.log", spawner=hs)
        s.start()
        host = s.proc.zygote
        os.kill(host.proc.pid, signal.SIGKILL)
        with pytest.raises(ServerExited) as exc:
            s.check(grace=10)
        assert exc.value.code == -9
        assert f"its host (pid {host.proc.pid}) exited with code -9" in str(exc.value)
        assert str(host.log) in str(exc.value)
        s.stop()
        t = Session("next", server_command(None, PACKAGED, "toy-paged", 0, FLAGS), 0, tmp_path / "n.log", spawner=hs)
        t.start()
        assert t.proc.zygote is not host and _complete(t).status_code == 200
        assert t.stop() == 0
    finally:
        hs.close()


def test_a_gate_with_hosts_passes_and_says_so(tmp_path):
    """The whole gate on toy-paged with its servers, `kern test` and `kern run` in two hosts: every
    check passes, the logs say where each ran, and the summary gives the hosts' CPU."""
    out = tmp_path / "results"
    with pytest.raises(SystemExit) as exc:
        main(["--out", str(out), "--backend", "cpu", "--max-tokens", "12", "--targets", "toy-paged", "--hosts", "2"])
    report = json.loads((out / "toy-paged" / "report.json").read_text())
    assert exc.value.code == 0, report["checks"]
    assert all(c["ok"] for c in report["checks"] if c["ok"] is not None)
    assert "a thread of one of the gate's hosts" in (out / "toy-paged" / "server-default.log").read_text()
    assert "a thread of one of the gate's hosts" in (out / "toy-paged" / "kern-test.log").read_text()
    summary = (out / "summary.md").read_text()
    assert "threads of 2 host(s)" in summary and "the hosts spent" in summary


def test_a_cpu_host_refuses_a_threading_layer_that_is_not_thread_safe():
    """numba's workqueue layer aborts the process when two threads launch parallel kernels at once: a
    CPU host on it says so instead of being ready (and the gate gives each server a process)."""
    from e2e.zygote import ZygoteGone

    env = dict(project_env(), NUMBA_THREADING_LAYER="workqueue")
    with pytest.raises(ZygoteGone, match="workqueue threading layer cannot run kernels from several threads"):
        Host(env, PACKAGED, [], args=["--backend", "cpu"])


def test_outside_a_host_a_server_has_its_process():
    """`serve.common.hosted` outside a host: the process's environment, no stop hook (the caller's signals),
    no start clock of its own."""
    assert hosted.COMMAND.get() is None
    assert hosted.getenv("PATH") is not None
    assert hosted.on_stop(lambda sig: None) is False
    assert hosted.started() is None


def test_a_host_command_sees_its_own_and_is_told_signals_sent_before_it_listened():
    """Inside a command: its environment first; a signal sent before its stop handler was registered
    is delivered at registration (a server told to stop while loading stops once it serves)."""
    import contextvars

    cmd = hosted.Command(env={"RUST_LOG": "kern_serve=debug"})
    got = []

    def inside():
        hosted.COMMAND.set(cmd)
        assert hosted.getenv("RUST_LOG") == "kern_serve=debug"
        assert cmd.signal(signal.SIGTERM) is False  # nobody listening yet
        assert hosted.on_stop(got.append) is True
        assert hosted.started() == cmd.t0

    contextvars.copy_context().run(inside)
    assert got == [signal.SIGTERM]
    assert hosted.COMMAND.get() is None, "the command's context leaked out"


def test_a_float_targets_probes_run_in_a_host(tmp_path):
    """With hosts, a float target's near-tie probes are `kern run --probe-dir` commands in a host (the
    gate process makes no runtime of its own): the near-ties are excused on their logits, and each
    probe's log says where it ran."""
    out = tmp_path / "results"
    with pytest.raises(SystemExit) as exc:
        main(["--out", str(out), "--backend", "cpu", "--max-tokens", "64", "--targets", "toy-float", "--hosts", "1",
              "--scenarios", "conc1_equals_run"])
    report = json.loads((out / "toy-float" / "report.json").read_text())
    assert exc.value.code == 0, report["checks"]
    (check,) = [c for c in report["checks"] if c["name"] == "conc1_equals_run"]
    assert check["ok"] and "near-tie" in check["note"], check
    logs = sorted((out / "toy-float" / "probes").glob("probe-*.log"))
    assert logs and all("a thread of one of the gate's hosts" in p.read_text() for p in logs), logs
