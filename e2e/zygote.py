"""The gate's warm parent for its servers (`oracle/zygote.py`, run as `kern zygote`): started once,
asked to fork each one.

`Zygote.spawn(argv, log)` returns a `Child` with the part of `subprocess.Popen` a `Session` uses
(``pid``, ``poll``, ``wait``, ``send_signal``, ``kill``, ``returncode``): the child is not ours but
the zygote's, so its exit code comes back over the zygote's stdout, read by one thread here.

A zygote is used only for our own `kern` (no ``--kern``); ``e2e --no-zygote`` starts every server as
a fresh process instead. If the zygote dies, every child it had is reported killed (-9) and new
spawns raise `ZygoteGone`, which the session reports as a server that could not start.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

from e2e.spawn import SpawnError, kern_args

__all__ = ["Child", "Zygote", "ZygoteGone"]


class ZygoteGone(SpawnError):
    """The zygote process is not running (it could not start, or it exited)."""


class Child:
    """A server process the zygote forked, seen as much like a `subprocess.Popen` as a session needs."""

    def __init__(self, zygote: "Zygote", pid: int):
        self.zygote = zygote
        self.pid = pid
        self.returncode: int | None = None

    def poll(self) -> int | None:
        if self.returncode is None:
            self.returncode = self.zygote.exit_code(self.pid)
        return self.returncode

    def wait(self, timeout: float | None = None) -> int:
        end = None if timeout is None else time.monotonic() + timeout
        with self.zygote.cond:
            while self.poll() is None:
                left = None if end is None else end - time.monotonic()
                if left is not None and left <= 0:
                    raise subprocess.TimeoutExpired(f"pid {self.pid}", timeout)
                self.zygote.cond.wait(left)
        return self.returncode

    @property
    def usage(self) -> dict:
        """Once it ended: its CPU seconds ``cpu_s`` [user, sys] and ``maxrss_kib`` (empty before)."""
        return self.zygote.usage.get(self.pid, {})

    @property
    def hosted(self) -> bool:
        """A command a host runs in a thread (`oracle/host.py`): no process of its own, so no
        process group to kill; its signals go through the host."""
        return self.zygote.hosted

    def gone_with_parent(self) -> str | None:
        """Why it ended, when it ended because its zygote or host did (else None)."""
        z = self.zygote
        if not z.gone or self.pid in z.exits:
            return None
        where = f"; its log: {z.log}" if z.log else ""
        try:
            code = z.proc.wait(2)  # its stdout closed as it died: the exit itself follows
        except subprocess.TimeoutExpired:
            code = "unknown (still exiting)"
        return f"its {'host' if z.hosted else 'zygote'} (pid {z.proc.pid}) exited with code {code}{where}"

    def send_signal(self, sig: int) -> None:
        if self.poll() is None:
            if self.hosted:
                self.zygote.signal(self.pid, sig)
            else:
                os.kill(self.pid, sig)

    def kill(self) -> None:
        self.send_signal(signal.SIGKILL)


class Zygote:
    """One `python -m kern.cli zygote` process (`kern zygote`); `spawn` is thread-safe (targets gated at once share it)."""

    hosted = False  # its children are processes (a `Host`'s are threads)
    how = " (forked by the gate's zygote)"  # what a session's log header says of where it runs
    command = ("kern.cli", "zygote")  # run as `python -m kern.cli zygote`: this checkout's `kern`
    log: Path | None = None  # where its own stderr goes, when somewhere (a host's: e2e/hosts.py)

    def __init__(self, env: dict[str, str], config: Path | None = None, warm: list[str] | tuple[str, ...] = (),
                 ready_timeout: float = 600.0, gpu_imports: bool = False, args: list[str] | tuple[str, ...] = (),
                 stderr=None, on_progress=None):
        cmd = [sys.executable, "-m", *self.command, *args]
        if config is not None:
            cmd += ["--config", str(config)]
        if warm:
            cmd += ["--warm", *warm]
        if gpu_imports:
            cmd += ["--gpu-imports"]
        self.on_progress = on_progress  # told each `{"warming": ...}` line while it warms (what it compiles now)
        self.cond = threading.Condition()
        self.exits: dict[int, int] = {}
        self.usage: dict[int, dict] = {}  # per ended child: its own CPU seconds (user, sys) and peak memory
        self.replies: list[dict] = []
        self.usage_self: dict = {}  # a host's own CPU seconds [user, sys] and peak memory, said as it exits
        self.gone = False
        self.warm_s: float | None = None
        self.warm_split: dict[str, float] = {}  # a host's warm by part (imports_s, device_s, targets_s)
        self.gpu_imports: str | None = None  # what the zygote imported of the GPU backend (with gpu_imports)
        self.lock = threading.Lock()  # one spawn at a time: replies come back in order
        self.ready_error: str | None = None
        self.proc = subprocess.Popen(cmd, stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=stderr, env=env,
                                     start_new_session=True)
        self.reader = threading.Thread(target=self._read, name="zygote-reader", daemon=True)
        self.reader.start()
        with self.cond:
            if not self.cond.wait_for(lambda: self.warm_s is not None or self.gone, ready_timeout):
                self.close()
                raise ZygoteGone(f"the zygote was not ready after {ready_timeout:.0f}s")
        if self.gone or self.ready_error:
            self.close()
            raise ZygoteGone(f"the `kern {self.command[1]}` process could not start: "
                             + (self.ready_error or f"it exited while warming (code {self.proc.poll()})"))

    def _read(self) -> None:
        assert self.proc.stdout is not None
        for raw in self.proc.stdout:
            try:
                msg = json.loads(raw)
            except ValueError:
                continue
            if "warming" in msg:
                if self.on_progress is not None:
                    self.on_progress(str(msg["warming"]))
                continue
            with self.cond:
                if "exit" in msg:
                    self.exits[int(msg["exit"])] = int(msg["code"])
                    self.usage[int(msg["exit"])] = {k: msg[k] for k in ("cpu_s", "maxrss_kib") if k in msg}
                elif "bye" in msg:  # a host's own CPU and peak memory, as it exits
                    self.usage_self = {k: msg[k] for k in ("cpu_s", "maxrss_kib") if k in msg}
                elif "ready" in msg:
                    if not msg["ready"]:
                        self.ready_error = str(msg.get("error", "not ready"))
                    self.gpu_imports = msg.get("gpu_imports")
                    self.warm_split = dict(msg.get("split") or {})
                    self.warm_s = float(msg.get("warm_s", 0.0))
                else:
                    if "pid" in msg:  # a new child: an earlier one's exit under the same pid (the kernel
                        # reuses pids: 32,768 of them, wrapped within a loaded hour) is not this one's
                        self.exits.pop(int(msg["pid"]), None)
                        self.usage.pop(int(msg["pid"]), None)
                    self.replies.append(msg)
                self.cond.notify_all()
        with self.cond:
            self.gone = True
            self.cond.notify_all()

    def exit_code(self, pid: int) -> int | None:
        with self.cond:
            if pid in self.exits:
                return self.exits[pid]
            if self.gone:
                return -9
            return None

    def spawn(self, argv: list[str], log: Path, env: dict[str, str] | None = None, timeout: float = 60.0,
              weight: int = 1) -> Child:
        """Fork `kern ARGV` with stdout and stderr appended to `log`; its `Child`. (`weight`: how much
        it loads its process; one process here, so nothing to weigh against: `e2e.hosts.Hosts`.)"""
        line = json.dumps({"argv": list(argv), "log": str(log), "env": env or {}}) + "\n"
        with self.lock:
            with self.cond:
                if self.gone:
                    raise ZygoteGone("the zygote has exited")
            try:
                assert self.proc.stdin is not None
                self.proc.stdin.write(line.encode())
                self.proc.stdin.flush()
            except (BrokenPipeError, OSError) as exc:
                raise ZygoteGone(f"the zygote has exited ({exc})") from exc
            with self.cond:
                if not self.cond.wait_for(lambda: self.replies or self.gone, timeout):
                    raise ZygoteGone(f"the zygote did not answer a spawn in {timeout:.0f}s")
                if not self.replies:
                    raise ZygoteGone("the zygote has exited")
                reply = self.replies.pop(0)
        if "pid" not in reply:
            raise ZygoteGone(f"the zygote refused a spawn: {reply.get('error', reply)}")
        return Child(self, int(reply["pid"]))

    def start(self, cmd: list[str], log: Path, env: dict[str, str] | None = None, weight: int = 1) -> Child:
        """The `e2e.spawn.Spawner` seam: `cmd` is this checkout's `kern` (`own_kern()` and its arguments)."""
        return self.spawn(kern_args(cmd), log, env=env, weight=weight)

    def signal(self, pid: int, sig: int) -> None:
        """Ask the zygote to deliver `sig` to its child `pid` (a host's command: `Host`)."""
        line = json.dumps({"signal": pid, "sig": int(sig)}) + "\n"
        with self.lock:
            try:
                assert self.proc.stdin is not None
                self.proc.stdin.write(line.encode())
                self.proc.stdin.flush()
            except (BrokenPipeError, OSError, ValueError):
                pass  # gone: every child it had is reported killed

    def hang_up(self) -> None:
        """Close its stdin: it kills what it still runs and ends (a host says "bye" first)."""
        try:
            if self.proc.stdin is not None:
                self.proc.stdin.close()
        except OSError:
            pass

    def close(self) -> None:
        """Close the zygote's stdin (it kills what it still runs and exits); wait for it."""
        self.hang_up()
        try:
            self.proc.wait(15)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait()
