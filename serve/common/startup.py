"""Where a server's start went, by phase, for its ready line (`start_s`, `imports_s`, `device_s`, ...).

`Phases.mark(name)` ends the phase `name` at now; `as_fields()` gives ``NAME_s`` per phase and
``start_s``, the seconds from the process's start (its fork, for a server the gate's zygote forked)
to the last mark. The process's start is read from Linux's /proc; elsewhere the clock starts when
`Phases` is made, and the first phase (the imports) is not counted. A server run as a host's command
(`serve/common/hosted.py`) counts from when the host was handed the command.
"""

from __future__ import annotations

import gc
import os
import threading
import time

__all__ = ["Phases", "freeze_heap", "freeze_when", "process_age"]


def process_age() -> float | None:
    """Seconds since this process started (was forked or exec'd), or None where /proc cannot say."""
    try:
        with open("/proc/self/stat", "rb") as f:
            stat = f.read()
        # the fields after the command's closing parenthesis; starttime is field 22 (the 20th of those)
        started = int(stat[stat.rindex(b")") + 2:].split()[19]) / os.sysconf("SC_CLK_TCK")
        return max(time.clock_gettime(time.CLOCK_BOOTTIME) - started, 0.0)
    except (OSError, ValueError, IndexError, AttributeError):
        return None


class Phases:
    """Named spans, each from the previous mark (the process's start, for the first) to its own."""

    def __init__(self, first: str = "imports"):
        now = time.monotonic()
        from serve.common.hosted import started

        handed = started()  # a host's command counts from when it was handed over
        age = process_age()
        self.origin = handed if handed is not None else (now - age if age is not None else now)
        self.last = self.origin
        self.spans: dict[str, float] = {}
        self.mark(first, now)

    def mark(self, name: str, now: float | None = None) -> None:
        now = time.monotonic() if now is None else now
        self.spans[name] = self.spans.get(name, 0.0) + max(now - self.last, 0.0)
        self.last = now

    def as_fields(self) -> dict[str, float]:
        fields = {f"{k}_s": round(v, 3) for k, v in self.spans.items()}
        fields["start_s"] = round(self.last - self.origin, 3)
        return fields


def freeze_heap(say=None) -> None:
    """Collect once, then move every object left into the collector's permanent generation
    (`gc.freeze`), as vLLM does after its start-up: the start's objects (modules, the app, the engine,
    compiled kernels, ~160k on the CPU) are never traversed again, so a full collection while serving
    scans only what was made since. Unfrozen, one such collection held a CPU server's scheduler 78 ms
    in a 3 s closed loop. One `heap frozen` line through `say` (default: the log)."""
    t0 = time.monotonic()
    gc.collect()
    gc.freeze()
    if say is None:
        from serve.common import logs

        say = logs.event
    say("heap frozen", objects=gc.get_freeze_count(), collect_s=round(time.monotonic() - t0, 3))


def freeze_when(ready: threading.Event) -> None:
    """`freeze_heap()` once `ready` is set (a daemon thread waits for it), in a server that is its own
    process. Not in a host's command (serve/common/hosted.py): servers come and go in one host process, and a
    stopped server's frozen objects in reference cycles would never be collected."""
    from serve.common.hosted import started

    if started() is not None:
        return
    threading.Thread(target=lambda: ready.wait() and freeze_heap(), name="freeze-heap", daemon=True).start()
