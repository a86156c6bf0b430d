"""How a server (or any `kern` command) is started: the one `Spawner` seam, and its implementations.

A `Spawner` starts a command with its output appended to a log and returns a `Proc`, the part of
`subprocess.Popen` the rest needs (``pid``, ``poll``, ``wait``, ``send_signal``, ``kill``,
``returncode``, ``hosted``). There are three, and nothing else in e2e/, bench/ or tests/ starts a server:

- `Processes`: a fresh process of its own, the leader of a new session (`killpg` takes whatever it
  started with it). `Processes.project()` runs this checkout's code (its root first on
  PYTHONPATH); `Processes.engine()` is for an engine under test (`e2e --engine CMD`): the gate's
  environment as it is.
- `e2e.zygote.Zygote`: a child forked from one warm ``python -m kern.cli zygote`` process (this
  checkout's `kern` only): the same process without paying imports and kernel loading again.
- `e2e.hosts.Hosts`: a thread of one of a few warm ``python -m kern.cli host`` processes (on a GPU, one
  CUDA context each instead of one per server). The host process makes each command's output and
  threads its own by patching `threading.Thread.start` (`serve.common.hosted.inherit_context`) and
  `sys.stdout`/`sys.stderr` process-wide: in that host process only, which nothing but this spawner
  starts, never in the gate's. A hosted `Proc` has no process group (``hosted``): its signals go
  through its host.

The handle over a started server (its URL, log, readiness, stop) is `e2e.session.Session`;
`e2e.session.launch` makes one and waits until it is ready, so the gate, the benches and the tests' server fixtures start
a server the same way, and stop it the same way (SIGTERM, SIGKILL after a while, then the process
group).
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
from pathlib import Path
from typing import Protocol, runtime_checkable

from kern.errors import KernError

__all__ = ["Proc", "Processes", "SpawnError", "Spawner", "gate_env", "kern_args", "own_kern", "project_env", "run_command"]

ROOT = Path(__file__).resolve().parent.parent


class SpawnError(KernError, RuntimeError):
    """A spawner could not start a command (its zygote or every host is gone, it refused)."""


class Proc(Protocol):
    """A started command, as much of `subprocess.Popen` as a session uses."""

    pid: int
    returncode: int | None

    def poll(self) -> int | None: ...

    def wait(self, timeout: float | None = None) -> int: ...

    def send_signal(self, sig: int) -> None: ...

    def kill(self) -> None: ...


@runtime_checkable
class Spawner(Protocol):
    """Starts commands: `start(cmd, log, env, weight)` -> a `Proc` whose output is appended to `log`.

    ``env`` is laid over the spawner's own environment; ``weight`` is how much the command loads where
    it runs (only `Hosts` weighs it). ``hosted``: its commands are threads, not processes; ``how``:
    what the session's log header says of where the command runs."""

    hosted: bool
    how: str

    def start(self, cmd: list[str], log: Path, env: dict[str, str] | None = None, weight: int = 1) -> Proc: ...

    def close(self) -> None: ...


class Processes:
    """Each command a fresh process, the leader of its own session, in `env` (and `cwd`)."""

    hosted = False
    how = ""

    def __init__(self, env: dict[str, str] | None = None, cwd: Path | str | None = None):
        self.env = dict(os.environ if env is None else env)
        self.cwd = cwd

    @classmethod
    def project(cls, extra: dict[str, str] | None = None, cwd: Path | str | None = None) -> "Processes":
        """This checkout's code: its root first on PYTHONPATH (`project_env`), `extra` over it."""
        return cls(dict(project_env(), **(extra or {})), cwd)

    @classmethod
    def gate(cls) -> "Processes":
        """The gate's own servers as fresh processes (`gate_env`)."""
        return cls(gate_env())

    @classmethod
    def engine(cls, cwd: Path | str | None = None) -> "Processes":
        """An engine under the contract: the gate's environment as it is (not this checkout on its path),
        in `cwd` (a replayed case's: where the gate ran it) or the gate's own working directory."""
        return cls(dict(os.environ, PYTHONUNBUFFERED="1"), cwd)

    def start(self, cmd: list[str], log: Path, env: dict[str, str] | None = None, weight: int = 1) -> subprocess.Popen:
        with open(log, "ab") as f:
            return subprocess.Popen(cmd, stdout=f, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
                                    env=dict(self.env, **(env or {})), cwd=self.cwd, start_new_session=True)

    def close(self) -> None:
        """Nothing held: every process is its session's (`Session.stop`)."""


def run_command(spawner: Spawner, cmd: list[str], log: Path, timeout: float) -> tuple[str, int | None]:
    """A command that ends by itself (`kern test`, `kern run`), started by `spawner`, its output in `log`
    after a ``$ cmd`` header; (its output, its exit code), the code None when it ran past `timeout`
    (then killed, its process group with it). A spawner that cannot start it: (why, 1)."""
    header = "$ " + " ".join(cmd) + spawner.how + "\n"
    log.write_text(header)
    try:
        child = spawner.start(cmd, log)
    except SpawnError as exc:
        return f"{exc}", 1
    try:
        code = child.wait(timeout)
    except subprocess.TimeoutExpired as exc:
        child.kill()
        child.wait(30)
        if not getattr(child, "hosted", False):
            try:
                os.killpg(child.pid, signal.SIGKILL)
            except (ProcessLookupError, PermissionError):
                pass
        return f"{exc}", None
    return log.read_text()[len(header):], code


def project_env() -> dict[str, str]:
    """The environment of a child `kern`: this checkout first on the path, so it runs the code gated."""
    path = os.environ.get("PYTHONPATH")
    return dict(os.environ, PYTHONUNBUFFERED="1", PYTHONPATH=str(ROOT) + (os.pathsep + path if path else ""))


def gate_env() -> dict[str, str]:
    """`project_env` for the gate's own servers (its zygote, hosts, fresh processes): one numba thread a
    process unless NUMBA_NUM_THREADS says otherwise. A gate runs a target's sessions at once, each its
    own server, and a target a core at once, so its servers outnumber the cores: a second thread a
    kernel splits no work that another server would not take, and its hand-offs cost system time (the
    CPU gate on two cores, two rounds interleaved: 139.5 and 137.7 s, 268 and 266 CPU-s at numba's
    default; 130.2 and 123.4 s, 249 and 237 CPU-s at one thread). The benches keep numba's default."""
    return {"NUMBA_NUM_THREADS": "1", **project_env()}


def own_kern() -> list[str]:
    """The command that runs this checkout's `kern` (what `--kern` defaults to)."""
    return [sys.executable, "-m", "kern.cli"]


def kern_args(cmd: list[str]) -> list[str]:
    """`cmd`'s arguments after `own_kern()`: what a zygote or host is asked to run."""
    base = own_kern()
    if cmd[:len(base)] != base:
        raise ValueError(f"not this checkout's kern: {cmd[:len(base)]}")
    return cmd[len(base):]
