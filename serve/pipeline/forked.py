"""Stages forked warm: copies of the head made before it loads, each waiting for the command it serves.

A stage started as `python -m serve STAGE --pp-head ADDR ...` pays a fresh interpreter's imports
(numpy, numba, ZeroMQ, the runtime) before it says hello: 1-2 s alone, 4 s and more on a gate's
busy CPU, where a three-stage target's five servers start fifteen stages at once. A head forked by
the gate's zygote already holds those imports (and the kernels the zygote ran), so `Warm.fork`
makes its stages as copies of it, at the start of `build_head`: before the head makes a device
context, binds its control socket or starts a thread. Each copy blocks on a pipe; once the control
socket is bound, `Warm.start(k, argv)` writes stage k's command line (the one `_spawn` would run)
down it, and the copy runs the entry the head was given for it (`serve.cli`'s command, standalone:
`PipelineOptions.entry`) on that command line, then exits with its code.

Forked only where it is safe and the head was given an entry: Linux, one Python thread, no NVIDIA
device file open (CUDA not initialised), and no stage address to wait for (`--pp-listen`).
Otherwise, and for every restart after a loss (the head has threads by then), a stage is a fresh
process as before. A copy whose pipe closes unwritten (the head failed before its control socket)
exits 0 at once.

A copy is named `kern-stage` (`ps -o comm`, /proc/PID/comm), `kern-stage-K` once it serves stage K
(a fresh stage process too): its command line is the head's. It closes the sockets it inherited
(the head's HTTP socket among them: a stage never holds the server's port) and reads /dev/null as
its stdin, as the fresh process did.
"""

from __future__ import annotations

import json
import os
import signal
import stat
import subprocess
import sys
import threading
import time
from typing import Callable

from kern.child import exit_with, fresh_signals
from serve.common.threads import name_native

__all__ = ["Forked", "Warm"]


class Forked:
    """A stage process `Warm` forked, with the part of `subprocess.Popen` the head uses: ``pid``,
    ``returncode``, ``poll``, ``wait`` (TimeoutExpired as Popen's), ``kill``, ``send_signal``."""

    def __init__(self, pid: int):
        self.pid = pid
        self.returncode: int | None = None

    def poll(self) -> int | None:
        if self.returncode is None:
            try:
                pid, status = os.waitpid(self.pid, os.WNOHANG)
            except ChildProcessError:  # reaped elsewhere: its code is lost
                self.returncode = -signal.SIGKILL
                return self.returncode
            if pid == self.pid:
                self.returncode = os.waitstatus_to_exitcode(status)
        return self.returncode

    def wait(self, timeout: float | None = None) -> int:
        end = None if timeout is None else time.monotonic() + timeout
        while self.poll() is None:
            if end is not None and time.monotonic() >= end:
                raise subprocess.TimeoutExpired(f"forked stage {self.pid}", timeout)
            time.sleep(0.005)
        return self.returncode

    def send_signal(self, sig: int) -> None:
        if self.poll() is None:
            try:
                os.kill(self.pid, sig)
            except ProcessLookupError:
                pass

    def kill(self) -> None:
        self.send_signal(signal.SIGKILL)

    def terminate(self) -> None:
        self.send_signal(signal.SIGTERM)


class Warm:
    """Stages 1..n-1 forked now, each blocked on a pipe until `start` gives it its command."""

    def __init__(self) -> None:
        self.pipes: dict[int, int] = {}  # stage -> the write end of its pipe (until started)
        self.pids: dict[int, int] = {}

    @staticmethod
    def safe() -> bool:
        """Whether this process may fork copies of itself: Linux, no Python thread but this one, and
        no GPU driver opened (a CUDA context, or only cuInit, is not usable in a forked child)."""
        return sys.platform.startswith("linux") and threading.active_count() == 1 and not _driver_open()

    @classmethod
    def fork(cls, stages: list[int], entry: Callable[[list[str]], None] | None) -> "Warm | None":
        """One blocked copy per stage in `stages`, each to run `entry(argv)` (the serve command,
        standalone: it exits), or None where forking is not `safe` or there is no entry."""
        if entry is None or not cls.safe():
            return None
        warm = cls()
        sys.stdout.flush()
        sys.stderr.flush()
        for k in stages:
            r, w = os.pipe()
            pid = os.fork()
            if pid == 0:
                os.close(w)
                for other in warm.pipes.values():
                    os.close(other)
                _child(r, entry)  # never returns
            os.close(r)
            warm.pipes[k], warm.pids[k] = w, pid
        return warm

    def start(self, k: int, argv: list[str]) -> Forked | None:
        """Stage k's copy, told to serve as `python -m serve ARGV` would; None once it was used (a
        restart) or when the copy is gone (killed while it waited): the caller starts a fresh process."""
        w = self.pipes.pop(k, None)
        if w is None:
            return None
        copy = Forked(self.pids[k])
        try:
            data = json.dumps(argv).encode()
            while data:
                data = data[os.write(w, data):]
        except OSError:  # no reader left (EPIPE): the copy died
            copy.kill()
            copy.wait()
            return None
        finally:
            os.close(w)
        return copy

    def close(self) -> None:
        """Let every copy not started exit (its pipe closes unwritten) and reap it."""
        for k in list(self.pipes):
            os.close(self.pipes.pop(k))
            try:
                os.waitpid(self.pids[k], 0)
            except ChildProcessError:
                pass


def _driver_open() -> bool:
    """Whether this process holds an NVIDIA device file open (what CUDA's initialisation opens)."""
    for name in os.listdir("/proc/self/fd"):
        try:
            if os.readlink(f"/proc/self/fd/{name}").startswith("/dev/nvidia"):
                return True
        except OSError:
            pass
    return False


def _read_all(fd: int) -> bytes:
    parts = []
    while True:
        chunk = os.read(fd, 1 << 16)
        if not chunk:
            return b"".join(parts)
        parts.append(chunk)


def _close_sockets() -> None:
    """Close every inherited socket (fds 3 and up): the head's HTTP port, the zygote's channels."""
    for name in os.listdir("/proc/self/fd"):
        fd = int(name)
        if fd < 3:
            continue
        try:
            if stat.S_ISSOCK(os.fstat(fd).st_mode):
                os.close(fd)
        except OSError:
            pass


def _child(r: int, entry: Callable[[list[str]], None]) -> None:
    """The copy: wait for its command, serve it, exit with its code (never returns)."""

    def serve() -> None:
        name_native("kern-stage")
        fresh_signals()
        _close_sockets()
        devnull = os.open(os.devnull, os.O_RDONLY)
        os.dup2(devnull, 0)
        os.close(devnull)
        raw = _read_all(r)
        os.close(r)
        if raw:
            entry(json.loads(raw))

    exit_with(serve)
