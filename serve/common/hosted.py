"""What a server takes from the process it runs in, so several can share one (`oracle/host.py`).

A `kern serve` that is its own process reads RUST_LOG from the environment, stops on SIGTERM or
SIGINT, counts its start from the process's, and ends the process when its scheduler crashes. A
server run as one command of a host (a thread of a warm process that holds one CUDA context for
all its servers) has none of those to itself: the host hands each command a `Command`, in the
command thread's context (`contextvars`), and the server asks this module instead:

    getenv(name)         the command's environment first, then the process's
    on_stop(handler)     the command's stop (the host's "signal" message); else the caller's signals
    crashed(code)        the command ends with `code` (a host lives on), else the process exits
    started()            when the command was handed over, else None (the process's start)

Outside a host every answer is the process's, as before. A host starts each thread a command starts
in the command's context (`inherit_context`), so the scheduler and the HTTP workers ask as well.
"""

from __future__ import annotations

import contextvars
import os
import signal
import threading
import time
from dataclasses import dataclass, field
from typing import Callable

__all__ = ["COMMAND", "Command", "crashed", "getenv", "inherit_context", "on_stop", "started"]


@dataclass
class Command:
    """One command a host runs: its environment, when it was handed over, its stop handlers and,
    once it ended early (crashed, killed), its exit code."""
    env: dict[str, str] = field(default_factory=dict)
    t0: float = field(default_factory=time.monotonic)
    stops: list[Callable[[int], None]] = field(default_factory=list)
    signals: list[int] = field(default_factory=list)  # every signal sent so far
    ended: Callable[[int], None] | None = None  # the host's: report this exit code now

    def signal(self, sig: int) -> bool:
        """Deliver `sig` to the command's stop handlers; False when it has none yet (a handler
        registered later is given every signal sent before it)."""
        self.signals.append(sig)
        for h in list(self.stops):
            h(sig)
        return bool(self.stops)


COMMAND: contextvars.ContextVar[Command | None] = contextvars.ContextVar("kern_hosted_command", default=None)


def getenv(name: str, default: str | None = None) -> str | None:
    cmd = COMMAND.get()
    if cmd is not None and name in cmd.env:
        return cmd.env[name]
    return os.environ.get(name, default)


def on_stop(handler: Callable[[int], None]) -> bool:
    """In a host: call `handler(sig)` when the host is told to signal this command, and True. In a
    process of its own: False (the caller takes SIGTERM and SIGINT as it always did)."""
    cmd = COMMAND.get()
    if cmd is None:
        return False
    cmd.stops.append(handler)
    for sig in list(cmd.signals):  # told to stop before it could be: it stops as soon as it starts
        handler(sig)
    return True


def crashed(code: int) -> None:
    """A part the server cannot live without failed: end with `code`. In a process of its own that
    is the process (`os._exit`); in a host, the command (its stop handlers are told to stop now)."""
    cmd = COMMAND.get()
    if cmd is None:
        os._exit(code)
    if cmd.ended is not None:
        cmd.ended(code)
    cmd.signal(signal.SIGKILL)


def started() -> float | None:
    """`time.monotonic()` when this command was handed to its host, or None outside a host."""
    cmd = COMMAND.get()
    return None if cmd is None else cmd.t0


def inherit_context() -> None:
    """Make every thread started from now on run in its starter's context (a host calls this once:
    the threads a command starts are the command's). Python 3.14's `Thread(context=...)` default on
    free-threaded builds does the same."""
    if getattr(threading.Thread.start, "_kern_inherits", False):
        return
    plain = threading.Thread.start

    def start(self):  # Thread.start takes nothing else
        ctx = contextvars.copy_context()
        run = self.run
        self.run = lambda: ctx.run(run)
        return plain(self)

    start._kern_inherits = True
    threading.Thread.start = start
