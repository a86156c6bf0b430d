"""A server session: one fresh server process per scenario group, its log, its teardown.

Ready means the ready line (`` scheduler ready ``) and `` serving `` are logged and the port answers
HTTP (any status: the Rust server logs ``serving`` before it binds). A server started with
``--log-level warn`` (or ``error``) writes neither: the session picks its port itself, ready means the
port answers, and its facts come from ``GET /stats`` (issue 25: nothing of ours needs a log line). A server that exits while
loading or mid-scenario raises `ServerExited` with its exit code and log tail, never a hang; one
that could not bind its port raises `Unavailable` (a reason outside the commit: the gate skips), and
so does an engine under the contract whose command cannot be executed (not found, not executable, a
missing interpreter or venv: the spawn fails, or it exits 126 or 127 before it is ready). An engine
that starts and then exits, or never gets ready, is the engine's failure (`ServerExited`, `ServerError`).

A session asked for port 0 lets the server pick a free port and reads it from the ``serving`` line,
so gates run side by side. Every started session is in `STARTED` until stopped: `stop_all` (on
Ctrl-C or SIGTERM of `e2e`) stops them all and refuses new ones, so no server outlives its gate.
"""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import threading
import time
from pathlib import Path
from typing import Any

import httpx

from e2e.log import Log, kv
from e2e.spawn import Processes, SpawnError, Spawner, kern_args, own_kern, project_env
from e2e.tls import tls
from kern.errors import KernError

__all__ = ["STARTED", "ServerExited", "ServerError", "Session", "Unavailable", "free_port", "launch", "merge_flags",
           "unused_port", "kern_args", "own_kern", "project_env", "server_command", "split_flags", "stop_all"]

EXIT_MEANINGS = {101: "scheduler crashed", -9: "killed", -15: "terminated"}
SERVER_LOG = "kern_serve=debug,kern_runtime=info"  # the RUST_LOG of a gated server
QUIET_LEVELS = ("warn", "warning", "error")  # `kern serve --log-level`s that write no ready or serving line
UNRUNNABLE = (126, 127)  # a shell's (or env's) exit: the command it was to run is not executable, or not found
PORT_IN_USE = ("address already in use", "errno 98", "errno 48", "only one usage of each socket address")


class Unavailable(KernError, RuntimeError):
    """The session could not run for a reason outside the code under test (its port is taken, the gate
    is stopping); the gate reports the target skipped, not failed."""


class PortTaken(Unavailable):
    """The server exited saying its port is in use. A port the gate picked (free when picked, then
    taken by another process before the server bound it) is picked again (`Run.open`)."""


class _Started:
    """The sessions whose servers may be running, and whether new ones may start."""

    def __init__(self) -> None:
        self.sessions: set[Session] = set()
        self.closed = False
        self.stopped = 0  # servers stop_all stopped since the gate began
        self.lock = threading.Lock()


STARTED = _Started()


def stop_all() -> int:
    """Stop every started session's server (SIGTERM, then SIGKILL) and refuse new ones; how many."""
    with STARTED.lock:
        STARTED.closed = True
        sessions = list(STARTED.sessions)
    for s in sessions:
        s.term_timeout = min(s.term_timeout, 10.0)
        s.stop()
    with STARTED.lock:
        STARTED.stopped += len(sessions)
    return len(sessions)


class ServerError(KernError, RuntimeError):
    """A server that could not be brought up (timeout, never ready)."""


class ServerExited(ServerError):
    """The server process exited while it should have been serving."""

    def __init__(self, session: str, code: int, tail: str):
        meaning = EXIT_MEANINGS.get(code)
        super().__init__(f"server {session} exited with code {code}" + (f" ({meaning})" if meaning else "")
                         + (f"; log tail: {tail}" if tail else ""))
        self.code = code
        self.tail = tail


def _ephemeral_low() -> int:
    """Where the kernel's ephemeral port range begins (Linux's ip_local_port_range; 32768 elsewhere)."""
    try:
        return int(Path("/proc/sys/net/ipv4/ip_local_port_range").read_text().split()[0])
    except (OSError, ValueError, IndexError):
        return 32768


def free_port() -> int:
    """A port free now, for a process started next to bind: picked at random below the kernel's ephemeral
    range (and above Ray's worker ports, 10002-19999), where no `--port 0` server and no outgoing
    connection is given one. A port found by binding port 0 and released is an ephemeral one, which the
    kernel may hand to another process before ours binds it (a loaded suite's Ray head lost its port so).
    Binding port 0 is the fallback where that range has none free."""
    import random

    rng = random.Random()
    low = _ephemeral_low()
    for _ in range(100 if low > 20001 else 0):
        port = rng.randrange(20000, low)
        with socket.socket() as s:
            try:
                s.bind(("127.0.0.1", port))
            except OSError:
                continue
            return port
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


_PICKED: set[int] = set()  # ports this gate picked for quiet servers: never handed out twice
_PICKED_LOCK = threading.Lock()


def unused_port() -> int:
    """A free port this process has not picked before (a port just picked is free again until its
    server binds it, so the OS may hand it to the next session that asks)."""
    with _PICKED_LOCK:
        while True:
            port = free_port()
            if port not in _PICKED:
                _PICKED.add(port)
                return port


def _with_port(cmd: list[str], port: int) -> list[str]:
    """`cmd` with its ``--port`` value replaced by `port`."""
    out = list(cmd)
    for i, w in enumerate(out[:-1]):
        if w == "--port":
            out[i + 1] = str(port)
    return out


def split_flags(text: str | list[str] | None) -> list[tuple[str, list[str]]]:
    """``--a 1 --flag --b x y`` → ``[("--a", ["1"]), ("--flag", []), ("--b", ["x", "y"])]``.

    Unlike the Rust gate's flag/value pairs, a lone boolean flag does not break the grouping.
    """
    import shlex

    words = shlex.split(text) if isinstance(text, str) else list(text or [])
    out: list[tuple[str, list[str]]] = []
    for w in words:
        if w.startswith("--") or not out:
            out.append((w, []))
        else:
            out[-1][1].append(w)
    return out


def merge_flags(*layers: list[tuple[str, list[str]]]) -> list[str]:
    """Later layers override earlier ones flag by flag; repeats within one layer are kept."""
    merged: list[tuple[str, list[str]]] = []
    for layer in layers:
        names = {f for f, _ in layer}
        merged = [(f, v) for f, v in merged if f not in names] + list(layer)
    return [w for f, v in merged for w in (f, *v)]


class Session:
    """One server: `start` has its `spawner` start `cmd` (a fresh process by default: `e2e/spawn.py`)
    and waits for ready, `stop` sends SIGTERM (kill after `term_timeout`) and takes its process group.

    `health`: ready when ``GET /health`` answers 200 (an engine under the contract, told its port; or,
    with port 0, once the ``serving`` line names it). `env` is laid over the spawner's environment
    (default: our server's debug lines, ``RUST_LOG``; nothing for an engine under the contract).
    `header`: the log's first line is the command (``$ ...``) and where it runs."""

    def __init__(self, name: str, cmd: list[str], port: int, log_path: str | Path,
                 host: str = "127.0.0.1", load_timeout: float = 600.0, term_timeout: float = 60.0,
                 spawner: Spawner | None = None, weight: int = 1, health: bool = False,
                 env: dict[str, str] | None = None, header: bool = True):
        self.name = name
        self.health = health
        self.weight = weight  # how much it loads the host it runs in (hosts: e2e/hosts.py)
        self.cmd = cmd
        self.spawner: Spawner = spawner or (Processes.engine() if health else Processes.project())
        self.env = env if env is not None else ({} if health else {"RUST_LOG": SERVER_LOG})
        self.header = header
        self.port = port
        self.host = host
        self.url = f"http://{host}:{port}"
        self.log = Log(log_path)
        self.load_timeout = load_timeout
        self.term_timeout = term_timeout
        self.proc: Any = None  # the spawner's `e2e.spawn.Proc`
        self.facts: dict[str, Any] = {}
        self.exit_code: int | None = None

    @property
    def pid(self) -> int | None:
        return None if self.proc is None else self.proc.pid

    def start(self) -> dict[str, Any]:
        """Start the server and wait until it is ready; the facts it told (plus ``load_s``). Ready is told
        three ways: an engine under the contract answers GET /health 200; a quiet server of ours answers
        HTTP (its facts from /stats); otherwise its ready and ``serving`` log lines, and HTTP."""
        self.log.path.parent.mkdir(parents=True, exist_ok=True)
        quiet = self.quiet()
        if quiet and self.port == 0:  # no `serving` line will name its port: the gate picks one
            self.port = unused_port()
            self.url = f"http://{self.host}:{self.port}"
            self.cmd = _with_port(self.cmd, self.port)
        t0 = time.monotonic()
        self._launch()
        probe, wait, what = self._probe(quiet)
        while True:
            try:
                self.check()
            except ServerExited as exc:
                text = self.log.text().lower()
                if any(p in text for p in PORT_IN_USE):
                    raise PortTaken(f"server {self.name}: port {self.port} is in use") from exc
                if self.health and exc.code in UNRUNNABLE:  # a shell's or env's "not found", "not executable"
                    raise Unavailable(f"the engine's command cannot be executed (exit {exc.code} before it was "
                                      f"ready): {exc.tail}") from exc
                raise
            facts = probe()
            if facts is not None:
                self.facts = dict(facts, load_s=round(time.monotonic() - t0, 1))
                return self.facts
            if time.monotonic() - t0 > self.load_timeout:
                self.stop(kill=True)
                raise ServerError(f"server {self.name}: {what} after {self.load_timeout:.0f}s; log tail: "
                                  + self.log.tail())
            time.sleep(wait)

    def _probe(self, quiet: bool):
        """How readiness is told: (the probe, seconds between tries, what a timeout says)."""
        if self.health and self.port != 0:
            return self._ready_health, 0.1, "GET /health not 200 (docs/engine-contract.md: readiness)"
        if quiet:
            return self._ready_quiet, 0.05, "not answering"
        if self.health:
            return self._ready_logged_health, 0.05, "not ready (GET /health not 200)"
        return self._ready_logged, 0.02, "not ready"

    def _launch(self) -> None:
        """The command, started by the session's spawner, its output to the session's log."""
        with STARTED.lock:
            if STARTED.closed:
                raise Unavailable("the gate is stopping")
            with open(self.log.path, "wb") as f:
                if self.header:
                    f.write(("$ " + " ".join(self.cmd) + self.spawner.how + "\n").encode())
            try:
                self.proc = self.spawner.start(self.cmd, self.log.path, env=self.env, weight=self.weight)
            except SpawnError as exc:
                raise ServerError(f"server {self.name}: {exc}") from exc
            except OSError as exc:  # not found, not executable, a missing interpreter (a shebang's) or venv
                if not self.health:
                    raise
                raise Unavailable(f"the engine's command cannot be executed: {exc}") from exc
            STARTED.sessions.add(self)

    def _ready_health(self) -> dict[str, Any] | None:
        return {} if self._healthy() else None

    def _ready_logged_health(self) -> dict[str, Any] | None:
        facts = self._ready_logged()
        return facts if facts is not None and self._healthy() else None

    def _ready_quiet(self) -> dict[str, Any] | None:
        return self._api_facts() if self._answers() else None

    def _ready_logged(self) -> dict[str, Any] | None:
        """The ready line's facts once it and ``serving`` are logged and the port answers (a server asked
        for port 0 names the one it bound in its ``serving`` line)."""
        ready = self.log.raw("scheduler ready")
        serving = self.log.lines("serving")
        if not (ready and serving):
            return None
        if self.port == 0:
            bound = serving[-1].get("port")
            if not isinstance(bound, int) or bound <= 0:
                self.stop(kill=True)
                raise ServerError(f"server {self.name} was asked for port 0 and its serving line names no port: "
                                  + self.log.raw("serving")[-1])
            self.port = bound
            self.url = f"http://{self.host}:{bound}"
        return kv(ready[-1]) if self._answers() else None

    def quiet(self) -> bool:
        """Was the server told to log nothing below warning (``--log-level warn|error``)? Then it writes
        neither its ready line nor ``serving``: the gate picks its port and reads its facts from /stats."""
        words = [w.lower() for w in self.cmd]
        return any(w == "--log-level" and i + 1 < len(words) and words[i + 1] in QUIET_LEVELS
                   for i, w in enumerate(words)) or any(w.startswith("--log-level=") and w.split("=", 1)[1] in QUIET_LEVELS
                                                        for w in words)

    def _api_facts(self) -> dict[str, Any]:
        """A quiet server's facts, as its ready line would give them, from ``GET /stats`` ``facts``."""
        try:
            r = httpx.get(self.url + "/stats", timeout=30.0, verify=tls())
            facts = dict(r.json()["facts"]) if r.status_code == 200 else None
        except (httpx.HTTPError, ValueError, KeyError, TypeError):
            facts = None
        if not facts:
            self.stop(kill=True)
            raise ServerError(f"server {self.name} logs nothing below warning and has no /stats facts: the gate "
                              "cannot learn its pages, page and rows")
        host_gib = int(facts.get("host_bytes") or 0) / (1 << 30)
        return {"ranks": 1, **facts, "host_gib": host_gib, "host_gib_per_rank": host_gib,
                "max_seqs_per_rank": facts.get("max_seqs")}

    def _healthy(self) -> bool:
        """``GET /health`` answers 200 (a refused connection or a 503 is still warming up); an engine
        with no such route (404, 405) cannot be told ready: `ServerError` at once, not a 600 s wait."""
        try:
            status = httpx.get(self.url + "/health", timeout=5.0, verify=tls()).status_code
        except httpx.HTTPError:
            return False
        if status in (404, 405):
            self.stop(kill=True)
            raise ServerError(f"server {self.name}: GET /health answers {status}: an engine tells the gate it is "
                              "ready by answering 200 there (docs/engine-contract.md, readiness)")
        return status == 200

    def _answers(self) -> bool:
        try:
            httpx.get(self.url + "/v1/models", timeout=2.0, verify=tls())
            return True
        except httpx.HTTPError:
            return False

    def alive(self) -> bool:
        return self.proc is not None and self.proc.poll() is None

    def check(self, grace: float = 0.0) -> None:
        """Raise `ServerExited` if the process is gone (or goes within `grace` seconds)."""
        if self.proc is not None and grace > 0:
            try:
                self.proc.wait(grace)
            except subprocess.TimeoutExpired:
                pass
        if self.proc is not None and self.proc.poll() is not None:
            self.exit_code = self.proc.returncode
            why = getattr(self.proc, "gone_with_parent", lambda: None)()  # a zygote's or host's child
            raise ServerExited(self.name, self.proc.returncode, self.log.tail(8) + (f" ({why})" if why else ""))

    def stop(self, kill: bool = False) -> int | None:
        """SIGTERM (or SIGKILL), wait, kill after `term_timeout`; the exit code."""
        p = self.proc
        if p is None:
            return self.exit_code
        if p.poll() is None:
            try:
                p.send_signal(signal.SIGKILL if kill else signal.SIGTERM)
                p.wait(self.term_timeout)
            except subprocess.TimeoutExpired:
                p.kill()
                p.wait()
            except ProcessLookupError:
                pass
        if not getattr(p, "hosted", False):  # a host's thread has no process group of its own
            try:  # whatever the server started (a pipeline's stages) goes with it: it leads its session
                os.killpg(p.pid, signal.SIGKILL)
            except (ProcessLookupError, PermissionError):
                pass
        self.exit_code = p.returncode
        with STARTED.lock:
            STARTED.sessions.discard(self)
        return self.exit_code

    def __enter__(self) -> "Session":
        return self

    def __exit__(self, *exc) -> None:
        self.stop()


def server_command(kern: list[str] | None, config: Path, target: str, port: int, flags: list[str]) -> list[str]:
    base = kern or own_kern()
    return [*base, "--config", str(config), "serve", target, "--port", str(port), *flags]


def launch(s: Session) -> Session:
    """`s` started and ready; stopped again if it never got ready."""
    try:
        s.start()
    except BaseException:
        s.stop(kill=True)
        raise
    return s
