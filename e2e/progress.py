"""What the gate is doing, said while it does it: a line within seconds of the start, then at least
one every `every` seconds while nothing else is printed (a fresh clone compiles numba kernels for a
minute or more; a slow engine may take minutes per session).

Every line the gate prints goes through `Progress.echo`; work in flight is named with `busy(key,
what)` and `done(key)`. When the gate has been silent for `every` seconds, a heartbeat line names
what is running and for how long: on a terminal it is one status line rewritten in place (cleared
before the next real line), elsewhere (CI logs) a plain line.
"""

from __future__ import annotations

import shutil
import sys
import threading
import time
from typing import Callable, TextIO

__all__ = ["Progress"]

EVERY_S = 10.0


class Progress:
    def __init__(self, every: float = EVERY_S, stream: TextIO | None = None, tty: bool | None = None,
                 clock: Callable[[], float] = time.monotonic, suppress: Callable[[], bool] = lambda: False):
        self.every = every
        self.suppress = suppress  # true once the gate is stopping (Ctrl-C): its lanes' last lines are not news
        self.stream = stream if stream is not None else sys.stdout
        self.tty = self.stream.isatty() if tty is None else tty
        self.clock = clock
        self.t0 = clock()
        self.last = self.t0  # when the last line (real or heartbeat) was written
        self.active: dict[str, tuple[str, float]] = {}
        self.lock = threading.Lock()
        self._status = False  # a terminal's status line is showing
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    def start(self) -> "Progress":
        self._thread = threading.Thread(target=self._beat, name="e2e-progress", daemon=True)
        self._thread.start()
        return self

    def stop(self) -> None:
        self._stop.set()
        with self.lock:
            self._clear()

    def echo(self, line: str) -> None:
        if self.suppress():
            return
        with self.lock:
            self._clear()
            self.stream.write(line + "\n")
            self.stream.flush()
            self.last = self.clock()

    def busy(self, key: str, what: str) -> None:
        with self.lock:
            self.active[key] = (what, self.clock())

    def done(self, key: str) -> None:
        with self.lock:
            self.active.pop(key, None)

    def heartbeat(self) -> str:
        """The line a silent gate writes: its age and what is running, longest first."""
        now = self.clock()
        running = sorted(self.active.items(), key=lambda kv: kv[1][1])
        what = "; ".join(f"{k}: {w} ({now - since:.0f}s)" for k, (w, since) in running) or "working"
        return f"  ... {now - self.t0:.0f}s: {what}"

    def tick(self) -> None:
        """Write a heartbeat if the gate has been silent long enough (the thread calls it each second)."""
        if self.suppress():
            return
        with self.lock:
            now = self.clock()
            if self.tty:
                if now - self.last < min(2.0, self.every):
                    return
                cols = shutil.get_terminal_size((100, 20)).columns
                self.stream.write("\r\x1b[K" + self.heartbeat()[:max(20, cols - 1)])
                self.stream.flush()
                self._status = True
                return
            if now - self.last >= self.every:
                self.stream.write(self.heartbeat() + "\n")
                self.stream.flush()
                self.last = now

    def _beat(self) -> None:
        while not self._stop.wait(1.0):
            self.tick()

    def _clear(self) -> None:
        if self._status:
            self.stream.write("\r\x1b[K")
            self._status = False
